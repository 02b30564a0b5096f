"""Start-up and restarts: a compiled model's fresh process, AOTInductor's C++ loader, restart paths (Chapter 6)."""
