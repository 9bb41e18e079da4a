"""The launcher's side: `trainstack train` and the commands beside it (doctor, export, bench scaling), one
process per node, plus the agent it starts. Nothing here runs inside a rank."""
