"""`trainstack diagnose`: read a live exporter or Prometheus, say what keeps the GPUs from being used.

sources (exporter scrapes | Prometheus queries) -> snapshot (per rank, per GPU) -> verdicts (alert thresholds).
"""
