"""The supervisor: what `trainstack train` and `trainstack watch` both do around the process they start, once per
node: the run directory's lease, the exporter beside the run, the child supervised (signals passed on, hang evidence
collected, leftovers ended), then summary.json's findings and the report, which it reads from monitoring/ directly.
It never imports train/: the commands (commands/) hand it what to run."""
