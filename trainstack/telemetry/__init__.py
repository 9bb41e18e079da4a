"""A rank's telemetry, the parts beneath the loop API (trainstack.monitor, whose `Monitor` keeps the interval), which
every loop uses: trainstack's own Trainer and a user's. It imports neither the app (trainstack.train) nor the
monitoring side (trainstack.monitoring).

- device.py: what the rank is: its device's peak FLOP/s and UUID, its identity on every series
- metrics.py: its series in the multiprocess files the exporter reads
- records_file.py: its records file, one JSON line per log interval, for the report
- interval.py: when an interval ends, its counts at the cut, and its loss and token sums, read one interval later
- wall_time.py: where the rank's time goes besides its steps: the startup, the pauses, the steps that compiled
- clock.py: the clock a rank's step, data-wait and forward times are measured on, one strategy chosen once from
  the device: the host's, or the GPU's CUDA events
- timeline.py: what the GPU's marks measure, and how an interval's are read
- comm.py, ddp_comm.py, fsdp_comm.py, comm_timer.py, comm_setup.py: DDP's and FSDP's communication times and settings
- gpu_busy.py, gpu_activity.py: NVML's utilization and GPM on the rank's own GPU
- state.py: the bytes of parameters, gradients and optimizer state the rank holds
- collectives.py: every other collective the rank calls (a framework's, the loop's own)

It re-exports nothing: `trainstack watch` imports collectives.py into every process that imports torch, and a
package import that pulled in the rest would cost each of them a fifth of a second.
"""
