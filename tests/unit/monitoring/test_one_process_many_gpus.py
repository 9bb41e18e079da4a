"""One process driving several GPUs (nn.DataParallel), judged from the exporter's process-to-GPU map alone: the
verdict from snapshots and its look-alikes, the NVML fake's `dataparallel` host through the real exporter (read
directly, through `trainstack diagnose`, and through a real Prometheus), the one-line hint for a job that reports
no rank telemetry, and the alert's promtool test fed with what the exporter serves for the fake hosts."""

from __future__ import annotations

import json

import pytest

from tests.helpers.fakes import LIMITS, NOW, gpu, kinds, rank
from tests.helpers.scrapes import scrape
from tests.helpers.uninstrumented import PROCESS_MEMORY, UNINSTRUMENTED, fake_exporter
from trainstack.monitoring.diagnose.render import render_json
from trainstack.monitoring.diagnose.snapshot import GpuProcess, Snapshot, read_snapshot
from trainstack.monitoring.diagnose.sources import ExporterSource
from trainstack.monitoring.diagnose.verdicts import diagnose, figures, notes

GIB = 2**30


def process(pid: str, index: int, gib: float, name: str = "python", instance: str = "") -> GpuProcess:
    return GpuProcess(instance, pid, name, f"GPU-{index}", gib * GIB)


def dataparallel_gpus(*utilizations: float) -> list:
    return [gpu(index, utilization=share) for index, share in enumerate(utilizations or (0.9, 0.25, 0.35, 0.3))]


# pid 4242 on 4 GPUs, GPU 0 the busiest and the fullest: the fake `dataparallel` host's figures.
DATAPARALLEL = [process("4242", index, gib) for index, gib in enumerate((64.0, 22.0, 22.5, 22.4))]


# --- the verdict from snapshots --------------------------------------------------------------------------------


def test_dataparallel_is_named_with_each_gpu_against_the_first():
    verdicts = diagnose(Snapshot("test", NOW, [], dataparallel_gpus(), processes=DATAPARALLEL), LIMITS)
    assert kinds(verdicts) == ["one-process-many-gpus"]
    verdict = verdicts[0]
    assert verdict.summary == (
        "one process drives several GPUs (nn.DataParallel, or a model split by hand): pid 4242 (python) on 4 GPUs"
    )
    assert verdict.evidence == (
        "pid 4242 (python) is the main user of GPUs 0, 1, 2, 3",
        "GPU 0: 64.0 GiB used by it, utilization 90% (its first GPU)",
        "GPU 1: 22.0 GiB used by it (0.34x GPU 0's), utilization 25% (0.28x GPU 0's)",
        "GPU 2: 22.5 GiB used by it (0.35x GPU 0's), utilization 35% (0.39x GPU 0's)",
        "GPU 3: 22.4 GiB used by it (0.35x GPU 0's), utilization 30% (0.33x GPU 0's)",
        "GPU 0 is the busiest and the fullest: nn.DataParallel's shape (it scatters each batch, gathers the "
        "outputs and computes the loss there)",
    )
    assert "DistributedDataParallel" in verdict.fix and "torchrun --nproc-per-node" in verdict.fix


def test_it_is_named_beside_rank_telemetry_too():
    # An instrumented DataParallel loop: one rank, on GPU 0; GPUs 1-3 are busy, so no GPU is unused.
    snapshot = Snapshot("test", NOW, [rank("0", uuid="GPU-0")], dataparallel_gpus(), processes=DATAPARALLEL)
    assert kinds(diagnose(snapshot, LIMITS)) == ["one-process-many-gpus"]
    assert notes(snapshot, LIMITS) == []


def test_a_model_split_by_hand_is_named_without_the_dataparallel_shape():
    halves = [
        process("77", 0, 30.0, name="", instance="node5:9450"),
        process("77", 1, 30.0, name="", instance="node5:9450"),
    ]
    verdicts = diagnose(Snapshot("test", NOW, [], dataparallel_gpus(0.5, 0.5), processes=halves), LIMITS)
    assert kinds(verdicts) == ["one-process-many-gpus"]
    assert verdicts[0].summary.endswith(": pid 77 on node5:9450 on 2 GPUs")
    assert not any("DataParallel's shape" in line for line in verdicts[0].evidence)


@pytest.mark.parametrize(
    ("utilizations", "processes"),
    [
        # DDP: one process per GPU, and ranks 1-3 each left a CUDA context on GPU 0, where rank 0 is the main user
        (
            (0.97, 0.96, 0.97, 0.95),
            [process(f"510{i}", i, 60.0) for i in range(4)] + [process(f"510{i}", 0, 0.5) for i in range(1, 4)],
        ),
        # a notebook that loaded a model onto two GPUs and computes nothing
        ((0.0, 0.0), [process("88", 0, 8.0), process("88", 1, 8.0)]),
        # the same pid on two hosts is two processes
        ((0.9, 0.9), [process("31", 0, 40.0, instance="node3:9450"), process("31", 1, 40.0, instance="node4:9450")]),
        # a GPU without a utilization figure does not count as busy
        ((0.9, None), [process("4242", 0, 60.0), process("4242", 1, 20.0)]),
    ],
    ids=["ddp-with-stray-contexts", "idle-notebook", "two-hosts", "utilization-unknown"],
)
def test_look_alikes_are_not_named(utilizations, processes):
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(*utilizations), processes=processes)
    assert "one-process-many-gpus" not in kinds(diagnose(snapshot, LIMITS))


def test_without_rank_telemetry_the_gpu_verdicts_stand_and_a_note_says_what_is_missing():
    processes = [process(f"510{i}", i, 60.0) for i in range(3)]  # GPU 3: no process, idle
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(0.97, 0.96, 0.95, 0.0), processes=processes)
    verdicts = diagnose(snapshot, LIMITS)
    assert kinds(verdicts) == ["gpus-unused"]
    assert verdicts[0].summary == "processes use 3 GPU(s) while 1 of 4 visible GPU(s) sit idle with no process on them"
    assert verdicts[0].evidence == ("GPU 3 (NVIDIA H100 80GB HBM3): utilization 0%, no process on it",)
    assert notes(snapshot, LIMITS) == [UNINSTRUMENTED]
    assert "\n" not in UNINSTRUMENTED and "run it under `trainstack watch` without --no-auto" in UNINSTRUMENTED
    shown = json.loads(render_json("test", verdicts, figures(snapshot), notes(snapshot, LIMITS)))
    assert shown["notes"] == [UNINSTRUMENTED] and not shown["healthy"]


def test_nothing_on_the_gpus_and_no_ranks_is_still_no_training():
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(0.0, 0.01))
    assert kinds(diagnose(snapshot, LIMITS)) == ["no-training"] and notes(snapshot, LIMITS) == []


def test_a_busy_gpu_without_ranks_is_an_uninstrumented_job_even_where_its_processes_are_hidden():
    # An exporter outside the job's PID namespace may list no process; the busy GPU still says a job runs.
    snapshot = Snapshot("test", NOW, [], dataparallel_gpus(0.9, 0.0))
    assert diagnose(snapshot, LIMITS) == [] and notes(snapshot, LIMITS) == [UNINSTRUMENTED]


# --- the fake hosts through the real exporter ------------------------------------------------------------------


def test_the_exporter_serves_the_process_to_gpu_map_of_the_dataparallel_host():
    with fake_exporter("dataparallel") as url:
        served = {
            (s.labels["gpu"], s.labels["pid"], s.labels["process"]): s.value
            for s in scrape(url)
            if s.name == PROCESS_MEMORY
        }
    assert served == {
        ("0", "4242", "python"): 70.5e9,
        ("1", "4242", "python"): 24.1e9,
        ("2", "4242", "python"): 24.3e9,
        ("3", "4242", "python"): 24.2e9,
    }


@pytest.mark.parametrize(("host", "expected"), [("dataparallel", ["one-process-many-gpus"]), ("ddp_h100", [])])
def test_diagnose_judges_the_fake_hosts_from_the_exporter_alone(host, expected):
    with fake_exporter(host) as url:
        snapshot = read_snapshot(ExporterSource(url, interval=0.3))
    assert snapshot.ranks == [] and len(snapshot.processes) == 4
    verdicts = diagnose(snapshot, LIMITS)
    assert kinds(verdicts) == expected
    assert notes(snapshot, LIMITS) == [UNINSTRUMENTED]
    if expected:
        assert verdicts[0].evidence[1] == "GPU 0: 65.7 GiB used by it, utilization 90% (its first GPU)"


# --- the alert, fed with what the exporter serves ---------------------------------------------------------------
