"""The record of runs: result files, the scripts' command line, and decisions across recorded runs.
It imports no model code: it knows rows, files and machines, not BlurBall."""
