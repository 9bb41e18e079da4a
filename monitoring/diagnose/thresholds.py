"""When a figure counts as a problem. The defaults are the alert rules' thresholds
(monitoring/prometheus/rules/alerts.yml), so `trainstack diagnose` and the alerts agree on what is wrong."""

from __future__ import annotations

from dataclasses import dataclass

from trainstack.errors import ConfigError


@dataclass(frozen=True)
class Thresholds:
    input_bound_ratio: float = 0.2
    """TrainstackInputBound: a rank waits for data more than this share of wall time."""
    straggler_ratio: float = 1.2
    """TrainstackStragglerRank: a rank's forward time per step over the ranks' median."""
    straggler_step_share: float = 0.05
    """Diagnose only, as it reads one window where the alert waits 10m: the straggler's extra forward time must
    also be this share of the step time, so that a millisecond of noise in a tiny forward pass names no one."""
    stall_seconds: float = 600.0
    """TrainstackTrainingStalled: no rank completed a step for this long."""
    gpu_idle_ratio: float = 0.05
    """TrainstackGPUUnused: utilization under this on a GPU no rank uses."""
    memory_full_ratio: float = 0.95
    """TrainstackGPUMemoryNearlyFull."""
    thermal_throttle_ratio: float = 0.1
    """TrainstackGPUThermalThrottling: share of time the clocks were held down by temperature."""
    power_throttle_ratio: float = 0.5
    """TrainstackGPUPowerThrottling: share of time at the power cap..."""
    power_throttle_clock_ratio: float = 0.8
    """...with the SM clock under this share of its maximum."""
    low_mfu_ratio: float = 0.2
    """No alert: well-tuned transformer training reaches 0.35-0.55 of dense peak; under 0.2 leaves most unused."""
    gpu_sample_stale_intervals: float = 3.0
    """TrainstackGPUDataStale: the exporter's GPU sample is older than this many of its sampling intervals."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ConfigError(f"threshold {name.replace('_', '-')} must be positive, got {value}")
