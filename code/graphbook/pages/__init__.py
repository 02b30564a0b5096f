"""The book's own machinery for its pages: a chapter's set-up, the taught code exported into the package, and
where and when each page last executed."""
