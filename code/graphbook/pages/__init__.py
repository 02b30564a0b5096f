"""The book's machinery for its pages: a chapter's set-up, the taught code exported, where each page last ran."""
