"""run_checks: every doctor check, in the order a person would fix them."""

from __future__ import annotations

from trainstack.train.launcher.doctor import (
    gpu_checks,
    hang_checks,
    host_checks,
    port_checks,
    slurm_checks,
    storage_checks,
    switch_checks,
)
from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import probe_gpus
from trainstack.train.launcher.doctor.result import CheckResult

CHECKS = (
    gpu_checks.check_gpu_visibility,
    gpu_checks.check_cuda_version,
    gpu_checks.check_ranks_per_gpu,
    host_checks.check_shared_memory,
    host_checks.check_memlock,
    host_checks.check_cpus,
    switch_checks.check_debug_switches,
    hang_checks.check_hang_evidence,
    port_checks.check_rendezvous_port,
    port_checks.check_exporter_port,
    storage_checks.check_output_dir,
)


def run_checks(config: DoctorConfig) -> list[CheckResult]:
    """Every check; in a Slurm job, its own checks after them (slurm_checks.py)."""
    gpus = config.gpus if config.gpus is not None else probe_gpus()
    checks = CHECKS + (slurm_checks.CHECKS if slurm_checks.in_slurm_job(config) else ())
    return [check(config, gpus) for check in checks]
