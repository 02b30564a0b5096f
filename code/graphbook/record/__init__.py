"""The record of runs: result files, the scripts' command line, and decisions across recorded runs."""
