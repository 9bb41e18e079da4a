"""`trainstack train` on a real Slurm (tests/helpers/slurm.py's two-node cluster), submitted with
examples/slurm/multi-node.sbatch as a user would: it trains on both nodes with the world the launcher takes from
Slurm, and a run warned by Slurm checkpoints, exits 75, requeues itself and resumes to the same parameters as a run
never stopped.

Two jobs of 40 steps side by side, one CPU rank on each node: one runs through; the other is sent SIGTERM in its
batch shell (`scancel --batch --signal=TERM`, what `--signal=B:TERM@120` does before the time limit; that path's
timing is tests/process/test_slurm.py's) once it has trained some steps. About 45 s."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.slurm import SlurmCluster, cluster_or_skip, submit_multi_node

pytestmark = pytest.mark.slow

STEPS = 40
TRAIN = ("--max-steps", str(STEPS), "--log-every", "5")
DONE = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with cluster_or_skip(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory) -> dict[str, tuple[str, Path, Path]]:
    """{"whole": ..., "stopped": ...}: (job id, output file, run directory) of each, both finished."""
    folder = tmp_path_factory.mktemp("runs")
    found = {}
    for name in ("whole", "stopped"):
        output, run_dir = folder / f"{name}.out", folder / name
        found[name] = (submit_multi_node(slurm, output, run_dir, *TRAIN), output, run_dir)
    # Stopped once rank 0 has recorded a few log intervals: mid-run, with steps to resume from.
    telemetry = found["stopped"][2] / "telemetry" / "rank-0.jsonl"
    deadline = time.monotonic() + 120
    while not (telemetry.exists() and len(telemetry.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline, f"the run to stop has not trained after 120 s\n{slurm.logs()}"
        time.sleep(0.2)
    slurm.run(["scancel", "--batch", "--signal=TERM", found["stopped"][0]])
    for job_id, _, _ in found.values():
        slurm.wait_job(job_id, DONE, timeout=180)
    return found


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_the_launcher_takes_the_world_from_slurm_and_trains_on_both_nodes(slurm, jobs):
    job_id, output, run_dir = jobs["whole"]
    fields = slurm.job(job_id)
    assert fields["JobState"] == "COMPLETED", output.read_text()[-3000:]
    done = summary(run_dir)
    # No --nnodes, --node-rank, --master-port: the two nodes of one rank each found one another at n1's port,
    # derived from the job id.
    assert (done["world_size"], done["steps"], done["exit_reason"]) == (2, STEPS, "completed")
    assert done["run_id"] == f"slurm-{job_id}-0"
    assert f"127.0.0.1:{15000 + int(job_id) % 10000}" in output.read_text()
    assert sorted(path.name for path in (run_dir / "environment").iterdir()) == ["node-0.json", "node-1.json"]
    assert sorted(path.name for path in (run_dir / "metrics").iterdir()) == ["node-0", "node-1"]


def test_a_warned_job_checkpoints_requeues_itself_and_resumes_exactly(slurm, jobs):
    job_id, output, run_dir = jobs["stopped"]
    text = output.read_text()
    fields = slurm.job(job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), text[-3000:]
    assert "batch: SIGTERM: the step checkpoints and stops" in text
    assert f"batch: requeueing job {job_id} (segment 1 stopped with a checkpoint)" in text
    done = summary(run_dir)
    segments = [(s["run_id"], s["first_step"], s["last_step"], s["exit_reason"]) for s in done["segments"]]
    stopped_at = segments[0][2]
    assert 0 < stopped_at < STEPS
    assert segments == [
        (f"slurm-{job_id}-0", 0, stopped_at, "preempted"),
        (f"slurm-{job_id}-1", stopped_at, STEPS, "completed"),
    ]
    assert done["resumed_from"] == str(run_dir / "checkpoints" / f"step-{stopped_at:08d}")
    # The time breakdown counts the requeue's wait (in the queue, the restart) as its own part, in the second
    # segment's row, and the goodput over all the time falls below the run that was never stopped.
    times = done["time_breakdown"]
    assert [len(rank["segments"]) for rank in times["ranks"]] == [2, 2]
    first, second = times["segments"]
    assert first["seconds"]["between_segments"] == 0 < second["seconds"]["between_segments"]
    assert times["seconds"]["between_segments"] == second["seconds"]["between_segments"]
    assert times["goodput"] < summary(jobs["whole"][2])["time_breakdown"]["goodput"]
    # Bit for bit the run that was never stopped.
    final = f"checkpoints/step-{STEPS:08d}/model.safetensors"
    resumed, whole = load_file(run_dir / final), load_file(jobs["whole"][2] / final)
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)
