"""`trainstack compare RUN_A RUN_B`: two run directories (`train` or `watch` runs) side by side."""
