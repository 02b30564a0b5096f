"""graphbook: the helper package every chapter of "Graph Compilers and Runtimes" imports; its folders are its layers."""
import logging

# torch's CUDA build warns on import of its C++-extension helper wherever a CUDA toolkit is installed but no GPU
# is present ("No CUDA runtime is found"); on a CPU that is expected, and the line would land in stored outputs.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
