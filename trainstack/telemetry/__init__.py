"""A rank's telemetry, beneath the loop API (trainstack.monitor), which every loop uses: trainstack's own Trainer and
a user's. It imports neither the app (trainstack.train) nor the monitoring side (trainstack.monitoring).

- device.py: what the rank is: its device's peak FLOP/s and UUID, its identity on every series
- metrics.py: its series in the multiprocess files the exporter reads
- records.py: its records file, one JSON line per log interval, for the report
- interval.py: the interval's loss and token sums, read one interval later, and when an interval ends
- core.py: `Telemetry`, the interval: step, data-wait and forward times, pauses, time by part, then one record
- timeline.py: those times on the GPU's own clock (CUDA events)
- comm.py, fsdp_comm.py, comm_timer.py, comm_setup.py: DDP's and FSDP's communication times and settings
- gpu_busy.py, gpu_activity.py: NVML's utilization and GPM on the rank's own GPU
- state.py: the bytes of parameters, gradients and optimizer state the rank holds
"""

__all__ = ["comm", "comm_setup", "comm_timer", "core", "device", "fsdp_comm", "gpu_activity", "gpu_busy", "interval",
           "metrics", "records", "state", "timeline"]
