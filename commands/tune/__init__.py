"""`trainstack tune`: short trials of trainstack's own app that try the fixes its diagnosis names and keep the
fastest."""
