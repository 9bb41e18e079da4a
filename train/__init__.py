"""trainstack's training app: one process is one rank (`python -m train`), `trainstack train` launches them."""
