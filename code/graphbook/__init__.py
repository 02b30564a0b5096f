"""graphbook: the helper package every chapter of "Graph Compilers and Runtimes" imports.

Its folders are its layers (CONTRIBUTING.md has the map); what only the package calls is private.
"""
