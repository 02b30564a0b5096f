"""The book's method for any model, its inputs and a check: the variants and their builders, the BN fold, build,
check and time in rotated runs, and the decision of the fastest correct path per precision."""
