"""A rank's telemetry, beneath the loop API (trainstack.monitor), which every loop uses: trainstack's own Trainer and
a user's. It imports neither the app (trainstack.train) nor the monitoring side (trainstack.monitoring).

- device.py: what the rank is: its device's peak FLOP/s and UUID, its identity on every series
- metrics.py: its series in the multiprocess files the exporter reads
- records.py: its records file, one JSON line per log interval, for the report
- interval.py: the interval's loss and token sums, read one interval later, and when an interval ends
- core.py: `Telemetry`, the interval: step, data-wait and forward times, pauses, time by part, then one record
- clock.py: the clock those times are measured on, chosen once from the device: the host's, or the GPU's
- timeline.py: those times on the GPU's own clock (CUDA events)
- comm.py, fsdp_comm.py, comm_timer.py, comm_setup.py: DDP's and FSDP's communication times and settings
- gpu_busy.py, gpu_activity.py: NVML's utilization and GPM on the rank's own GPU
- state.py: the bytes of parameters, gradients and optimizer state the rank holds
"""

from trainstack.telemetry.core import Telemetry
from trainstack.telemetry.device import RankIdentity, device_uuid, peak_flops
from trainstack.telemetry.interval import IntervalSums, IntervalTotals, interval_ends
from trainstack.telemetry.metrics import progress_by_rank
from trainstack.telemetry.state import measure_state_once, training_state_bytes

__all__ = [
    "IntervalSums",
    "IntervalTotals",
    "RankIdentity",
    "Telemetry",
    "device_uuid",
    "interval_ends",
    "measure_state_once",
    "peak_flops",
    "progress_by_rank",
    "training_state_bytes",
]
