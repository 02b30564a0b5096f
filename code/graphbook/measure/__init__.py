"""Measurement: the timing harness and run protocol, threads and the machine fingerprint, the hardware probes, and
start-up (compile time, warm-up). It imports nothing else of the package but ``paths``."""
