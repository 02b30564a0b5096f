"""INT8: static Q/DQ quantization for this CPU and the matrix of its settings on held-out clips (Chapter 4)."""
