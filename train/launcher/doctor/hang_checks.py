"""Whether a hang will be explained: the Flight Recorder the launcher turns on, and how stacks can be taken
(docs/diagnostics.md, "When a run hangs")."""

from __future__ import annotations

import shutil

from trainstack.hang import FR_BUFFER_DEFAULT, FR_BUFFER_ENV, FR_BUFFER_OLD_ENV, FR_SWITCH_ENV
from trainstack.train.launcher.doctor.config import DoctorConfig
from trainstack.train.launcher.doctor.inventory import GpuInventory
from trainstack.train.launcher.doctor.result import CheckResult, Status

COST = 'its measured cost: docs/benchmarks.md, "Flight Recorder on vs off"'


def check_hang_evidence(config: DoctorConfig, gpus: GpuInventory) -> CheckResult:
    env = config.env
    stacks = (
        "py-spy when it may attach, else the ranks' own dumps"
        if shutil.which("py-spy", path=env.get("PATH"))
        else "the ranks' own dumps (py-spy not installed)"
    )
    size = env.get(FR_BUFFER_ENV, env.get(FR_BUFFER_OLD_ENV))
    if env.get(FR_SWITCH_ENV) == "0" or (size is not None and size.strip() in ("", "0")):
        why = f"{FR_SWITCH_ENV}=0" if env.get(FR_SWITCH_ENV) == "0" else f"{FR_BUFFER_ENV}={size}"
        return CheckResult(
            "hang-evidence",
            Status.WARN,
            f"the Flight Recorder is off ({why}): a hang names where each rank is, not which collective it waits "
            f"in or which rank never joined it; stacks from {stacks}",
            f"unset {FR_SWITCH_ENV} and {FR_BUFFER_ENV} (the launcher then sets {FR_BUFFER_ENV}="
            f"{FR_BUFFER_DEFAULT}; {COST})",
        )
    return CheckResult(
        "hang-evidence",
        Status.PASS,
        f"Flight Recorder on ({FR_BUFFER_ENV}={size or FR_BUFFER_DEFAULT}, {COST}; {FR_SWITCH_ENV}=0 turns it "
        f"off); a stall's stacks from {stacks}, into RUN_DIR/hang/",
    )
