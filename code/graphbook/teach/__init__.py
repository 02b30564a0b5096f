"""What the chapters teach with: the algorithms written on the pages and the analyses of recorded results."""
