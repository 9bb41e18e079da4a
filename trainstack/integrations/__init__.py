"""trainstack inside other frameworks' training loops, each an optional extra:

- `trainstack.integrations.hf`: `TrainstackCallback`, for transformers' `Trainer` (`pip install trainstack[hf]`).
- `trainstack.integrations.lightning`: `TrainstackCallback`, for Lightning's `Trainer` (`pip install
  trainstack[lightning]`); `trainstack.integrations.pytorch_lightning`: the same for the standalone
  `pytorch_lightning` package's `Trainer`.

This package imports none of them: importing an integration is what imports its framework.
"""
