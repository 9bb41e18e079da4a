"""trainstack's training app: launcher/ runs once per node (`trainstack train`), rank/ once per device."""
