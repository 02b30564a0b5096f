"""Measurement: the timing harness, the machine fingerprint, hardware probes and start-up costs.
It imports nothing else of the package but ``paths`` and ``config``."""
