"""The book's method on a reader's own model (Chapter 8): capture, the BN fold inventory, the cause ladder, the
kernels against the predicted groups, the runtimes, one check with a planted fault, the bisection of a wrong
Inductor variant, and the verdict per precision, recorded as one results file with a report beside it."""
