"""INT8: static Q/DQ quantization for this CPU, the matrix of its settings measured on held-out clips, and the choice
of a setting from that record (Chapter 4)."""
