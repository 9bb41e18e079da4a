"""Exporter: per-GPU NVML metrics and per-rank training metrics on one /metrics endpoint (docs/metrics.md)."""
