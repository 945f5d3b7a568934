"""Verdicts: per-volume baselines and alerts (health.py, owned by the core), the detector they use, and the
likely causes an alert names (pure functions of the evidence the core holds)."""
