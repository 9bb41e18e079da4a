"""On a CUDA GPU (issue 12): data wait means the GPU starved, so a run whose GPU is kept busy is not input-bound
however long its host waits in next(), and a run whose loader cannot keep up is input-bound by as much as it
loses. Each run is `trainstack train` on one GPU with GPT-2 small's shape, 16 x 1024 byte tokens in bf16, read
live through its exporter by the code `trainstack diagnose` runs. Run with `pytest -m gpu` (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.fakes import kinds
from tests.helpers.runs import live_run
from trainstack.monitoring.diagnose.snapshot import Snapshot, read_snapshot
from trainstack.monitoring.diagnose.sources import ExporterSource
from trainstack.monitoring.diagnose.verdicts import Verdict, diagnose
from trainstack.thresholds import Thresholds

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BATCH_SIZE = 16
GPT2_SMALL_RUN = (
    "--model",
    "bench.factories:gpt2_small",
    "--dataset",
    "bench.factories:random_bytes",
    "--seq-len",
    "1024",
    "--batch-size",
    str(BATCH_SIZE),
    "--mixed-precision",
    "bf16",
    "--log-every",
    "10",
    "--nproc-per-node",
    "1",
)
WARMUP_STEPS = 40  # allocator growth, cuBLAS set-up and the loader's first batches stay out of the window
WINDOW_SECONDS = 6.0


def diagnose_live(folder: Path, workers: int, sample_delay: float = 0.0) -> tuple[Snapshot, list[Verdict]]:
    env = {"TRAINSTACK_TEST_SAMPLE_DELAY": str(sample_delay)}
    with live_run(folder, *GPT2_SMALL_RUN, "--num-workers", str(workers), env=env, steps=WARMUP_STEPS, ranks=1) as url:
        snapshot = read_snapshot(ExporterSource(url, WINDOW_SECONDS))
    assert len(snapshot.ranks) == 1 and snapshot.ranks[0].steps_per_second, snapshot
    verdicts = diagnose(snapshot, Thresholds())
    rank = snapshot.ranks[0]
    # The figures docs/benchmarks.md records: shown with `pytest -s`.
    print(
        f"\n{workers} worker(s), {sample_delay * 1e3:.2f} ms a sample: {rank.steps_per_second:.2f} steps/s, GPU "
        f"starved {rank.data_wait_ratio:.4f}, host waited {rank.host_data_wait_ratio:.4f}, verdicts "
        f"{sorted(kinds(verdicts))}"
    )
    return snapshot, verdicts


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """workers -> (snapshot, verdicts) of a run whose loader keeps up; each run once per session."""
    runs: dict[int, tuple[Snapshot, list[Verdict]]] = {}

    def run(workers: int) -> tuple[Snapshot, list[Verdict]]:
        if workers not in runs:
            runs[workers] = diagnose_live(tmp_path_factory.mktemp(f"healthy-{workers}-workers"), workers)
        return runs[workers]

    return run


@pytest.mark.parametrize("workers", [2, 8])
def test_a_healthy_run_is_not_input_bound_and_its_gpu_does_not_starve(healthy, workers):
    snapshot, verdicts = healthy(workers)
    (rank,) = snapshot.ranks
    assert rank.clock == "gpu" and rank.host_data_wait_ratio is not None
    assert "input-bound" not in kinds(verdicts), verdicts
    assert rank.data_wait_ratio < 0.05, rank


def test_a_slowed_loader_is_input_bound_by_what_it_costs(healthy, tmp_path):
    fast = healthy(2)[0].ranks[0]
    # One worker that needs twice a healthy step's time for each batch: the GPU must idle half of each step.
    # (At ~40 ms a step, a batch of ~30 ms would keep up, and nothing would starve.)
    batch_seconds = max(0.03, 2 / fast.steps_per_second)
    snapshot, verdicts = diagnose_live(tmp_path, workers=1, sample_delay=batch_seconds / BATCH_SIZE)
    (slow,) = snapshot.ranks
    assert "input-bound" in kinds(verdicts), verdicts
    lost = 1 - slow.steps_per_second / fast.steps_per_second
    assert abs(slow.data_wait_ratio - lost) <= 0.05, (
        f"GPU starvation {slow.data_wait_ratio:.3f} of the step, but the slowed loader cost {lost:.3f} of the "
        f"healthy run's {fast.steps_per_second:.2f} steps/s (now {slow.steps_per_second:.2f})"
    )
