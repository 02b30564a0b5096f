"""Measurement: the timing harness, the machine fingerprint, hardware probes and start-up costs."""
