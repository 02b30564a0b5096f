"""What the chapters teach with: the algorithms written on the pages (exported by ``#@save``) and the analyses a
chapter runs over recorded results."""
