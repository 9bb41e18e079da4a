"""trainstack diagnose on timed runs: a healthy run, then a slow link, comm-bound by the share its delay predicts."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.fakes import kinds
from tests.helpers.runs import judged_while_unhealthy, live_run, run_trainstack
from tests.helpers.scrapes import diagnose_url
from trainstack.rundir import RunDir
from trainstack.telemetry.comm import TEST_ALLREDUCE_DELAY_ENV


@dataclass(frozen=True)
class CommPerStep:
    step_seconds: float
    exposed_seconds: float
    buckets: float


def comm_per_step(run: Path, rank: int) -> CommPerStep:
    """A rank's step time, exposed communication and all-reduces per step from its telemetry records, leaving out
    the first three intervals of a step each (the first step's warm-up; DDP sizes its buckets anew at the second,
    which its logging data, where the timing reads the bucket count, shows a step later) and a line the kill cut
    off."""
    lines = RunDir(run).rank_records(rank).read_text().splitlines()
    records = [record for line in lines if line.endswith("}") and "comm_seconds" in (record := json.loads(line))]
    steady = records[3:]
    assert len(steady) >= 3, f"rank {rank}: {len(records)} records with communication times"
    steps = sum(len(r["step_seconds"]) for r in steady)
    return CommPerStep(
        sum(sum(r["step_seconds"]) for r in steady) / steps,
        sum(r["comm_exposed_seconds"] for r in steady) / steps,
        sum(r["comm_buckets"] for r in steady) / steps,
    )


@pytest.mark.slow
@pytest.mark.timing
def test_a_healthy_run_and_then_a_slow_link_comm_bound_by_the_time_its_delay_adds(tmp_path):
    """The undelayed run is healthy, on the command line and through the exporter. Each gradient all-reduce held back
    by `delay` (as a slow link would) adds `delay` per bucket to the step, all of it after backward compute: each
    rank's exposed communication must grow by that. Its share of the step is not checked against the undelayed run's
    figures: the rest of the step is the host's to move, and ranks that sleep 0.6 s a step come back to a slower core
    (CI's delayed run once computed 0.107 s a step against the undelayed run's 0.050 s, its exposed time right to
    3 ms)."""
    delay = 0.3
    # No loader workers: two ranks already fill the two cores of a small CI machine, and a rank starved of CPU
    # by its neighbours' workers is a real straggler.
    options = ("--num-workers", "0", "--log-every", "1")
    (tmp_path / "plain").mkdir()
    with live_run(tmp_path / "plain", *options, steps=6) as url:
        # Judged again over the next windows where one finds a problem (exit 1): the 2 shared cores can take CPU
        # from one rank for seconds; a verdict the code gives a healthy run, every window gives.
        judged = judged_while_unhealthy(
            lambda: run_trainstack("diagnose", "--url", url.removesuffix("/metrics"), "--interval", "6"),
            lambda result: result.returncode != 1,
        )
        assert "comm-bound" not in kinds(diagnose_url(url))
    healthy = judged[-1]
    assert healthy.returncode == 0, "\n".join(result.stdout + result.stderr for result in judged)
    verdict = healthy.stdout.splitlines()[1]
    assert verdict.startswith("HEALTHY  2 rank(s), ") and "samples/s in all" in verdict
    plain = [comm_per_step(tmp_path / "plain/run", rank) for rank in (0, 1)]
    (tmp_path / "delayed").mkdir()
    with live_run(tmp_path / "delayed", *options, env={TEST_ALLREDUCE_DELAY_ENV: str(delay)}, steps=6) as url:
        verdicts = diagnose_url(url, interval=6.0)
    assert kinds(verdicts) == ["comm-bound"], verdicts
    # The evidence, through the exporter: what each rank's all-reduce carried, its setup (gloo, no NCCL switch) and
    # /dev/shm (never flagged under gloo); CPU ranks have no GPU links.
    evidence = "\n".join(verdicts[0].evidence)
    assert re.search(r"rank 1: .* communicated per step at [0-9.]+ [MG]B/s bus bandwidth", evidence), evidence
    assert "no NCCL switch set on any rank (backend gloo)" in evidence and "/dev/shm is" in evidence, evidence
    assert "smaller than" not in evidence and "GPU" not in evidence, evidence
    for index, before in enumerate(plain):
        delayed = comm_per_step(tmp_path / "delayed/run", index)
        assert delayed.buckets == before.buckets
        added = delayed.exposed_seconds - before.exposed_seconds
        assert added == pytest.approx(before.buckets * delay, rel=0.1), (before, delayed)
