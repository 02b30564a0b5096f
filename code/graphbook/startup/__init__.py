"""Start-up and restarts: a compiled model's fresh process (cold, warm cache, saved artifacts), AOTInductor's C++
loader, and the restart paths side by side with the server's time to ready (Chapters 2, 6, 7)."""
