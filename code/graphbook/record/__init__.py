"""The record of runs: how the book measures, writes and reads back what it measured.

- ``timing``      -- the harness and the run protocol: warm-up, median and spread, N rotated runs (Chapter 1, 2)
- ``environment`` -- threads and the fingerprint every measurement carries (Chapter 1)
- ``results``     -- the result files: kinds, names, columns, ``write_run``, typed ``load`` (Chapter 2)
- ``runs``        -- decisions across recorded runs: per machine, load flags, phrased comparisons (Chapter 5)
- ``provenance``  -- where and when each page last executed (appendix)
- ``cli``         -- the scripts' one parser and exit-status policy (Chapter 2)

This layer imports no model code: it knows rows, files and machines, not BlurBall.
"""
