"""The freezing miscompile of torch 2.13.0: its reproducers and verdict, the change that fixed it, the delta-debugging
minimizer, and the version history recorded under both torches (Chapter 3, the anatomy appendix)."""
