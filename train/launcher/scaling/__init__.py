"""`trainstack bench scaling`: the same model on 1..N devices with DDP (and, on GPUs, nn.DataParallel), as
samples/s and scaling efficiency, in a table and a plot."""
