"""Benchmarks: each prints ratios measured side by side in one run (docs/benchmarks.md)."""
