"""What GPM tells diagnose (monitoring/diagnose/verdicts.py): gpu-underused (busy but hollow), no-tensor-cores, the
memory-bound evidence line, comm-bound's measured link traffic, the note on GPUs without GPM; from snapshots, and
from the exporter's scrape of the NVML fake's hosts (hollow, fp32, healthy) with ranks joined to their GPUs."""

from __future__ import annotations

import dataclasses

import pytest

import trainstack.monitoring.nvml_fake as fake
from tests.helpers.fakes import LIMITS, NOW, CountersSource, Rig, gpu, kinds, rank, render
from trainstack import catalog
from trainstack.monitoring.diagnose.snapshot import Snapshot, read_snapshot
from trainstack.monitoring.diagnose.verdicts import diagnose, figures, notes

HEALTHY_GPM = dict(sm_active=0.85, sm_occupancy=0.4, tensor_active=0.5, dram_active=0.45, gpm_supported=True)
HOLLOW_GPM = dict(
    utilization=1.0, sm_active=0.15, sm_occupancy=0.06, tensor_active=0.04, dram_active=0.1, gpm_supported=True
)


@pytest.fixture(autouse=True)
def no_fake_host_left_behind():
    yield
    fake.load(None)


def verdict(snapshot: Snapshot, kind: str):
    found = {v.kind: v for v in diagnose(snapshot, LIMITS)}
    assert kind in found, kinds(diagnose(snapshot, LIMITS))
    return found[kind]


def test_a_busy_gpu_whose_sms_mostly_idle_is_underused_with_its_ranks_setup_and_the_fixes_it_points_to():
    ranks = [
        rank("0", uuid="GPU-0", mixed_precision="no", compiled=False, samples_per_second=48.0, launcher="train"),
        rank("1", uuid="GPU-1", mixed_precision="bf16", compiled=True, launcher="train"),
    ]
    snapshot = Snapshot("test", NOW, ranks, [gpu(0, **HOLLOW_GPM), gpu(1, **HEALTHY_GPM)])
    found = verdict(snapshot, "gpu-underused")
    assert kinds(diagnose(snapshot, LIMITS)) == ["gpu-underused"]  # GPU 1 is healthy; 4% tensor is no verdict
    assert found.summary.startswith(
        "1 GPU(s) read busy but do little: a kernel runs at least 80% of the time while under 50% of their SMs work"
    )
    assert found.evidence == (
        "GPU 0: utilization 100%, SM activity 15%, occupancy 6%, tensor-core activity 4%, DRAM bandwidth 10%",
        "rank 0 on GPU 0: 16 samples per optimizer step (per-GPU batch x accumulation), mixed precision no, "
        "torch.compile off",
    )
    assert found.fix.startswith("a larger per-GPU --batch-size")
    assert "--mixed-precision bf16" in found.fix and "--compile" in found.fix and "fused=True" in found.fix
    # A rank already in bf16 and compiled is not told to turn them on.
    compiled = Snapshot("test", NOW, [ranks[1]], [gpu(1, **HOLLOW_GPM)])
    fix = verdict(compiled, "gpu-underused").fix
    assert "--mixed-precision" not in fix and "--compile" not in fix
    # A watched script is told its own knobs, not trainstack train's flags.
    watched = Snapshot("test", NOW, [dataclasses.replace(ranks[0], launcher="watch")], [gpu(0, **HOLLOW_GPM)])
    fix = verdict(watched, "gpu-underused").fix
    assert fix.startswith("a larger per-GPU batch in your DataLoader(batch_size=...)")
    assert "torch.autocast" in fix and "torch.compile(model)" in fix and "--" not in fix


@pytest.mark.parametrize(
    "changes",
    [
        dict(utilization=0.7),  # idles between kernels: host-bound's or input-bound's case
        dict(sm_active=0.5),  # half the SMs work: at the threshold, not under it
        dict(sm_active=None, gpm_supported=False),  # no GPM: nothing to judge
    ],
)
def test_not_underused(changes):
    assert "gpu-underused" not in kinds(
        diagnose(Snapshot("test", NOW, [], [gpu(0, **{**HOLLOW_GPM, **changes})]), LIMITS)
    )


def test_dram_near_its_maximum_is_memory_bound_evidence_not_a_verdict_of_its_own():
    memory_bound = {**HOLLOW_GPM, "dram_active": 0.9}
    found = verdict(Snapshot("test", NOW, [], [gpu(0, **memory_bound)]), "gpu-underused")
    assert found.evidence[-1].startswith(
        "GPU 0: DRAM bandwidth at 90% of its maximum while its SMs work: its kernels wait on memory (memory-bound)"
    )
    busy_memory = Snapshot("test", NOW, [], [gpu(0, **{**HEALTHY_GPM, "dram_active": 0.9})])
    assert diagnose(busy_memory, LIMITS) == []
    assert figures(busy_memory)["gpu_dram_active_max"] == 0.9


def test_a_working_gpu_without_tensor_core_activity_is_no_tensor_cores():
    fp32 = dict(
        utilization=0.99, sm_active=0.8, sm_occupancy=0.35, tensor_active=0.0, dram_active=0.3, gpm_supported=True
    )
    snapshot = Snapshot(
        "test", NOW, [rank("0", uuid="GPU-0", mixed_precision="no", launcher="train")], [gpu(0, **fp32)]
    )
    assert kinds(diagnose(snapshot, LIMITS)) == ["no-tensor-cores"]
    found = verdict(snapshot, "no-tensor-cores")
    assert found.evidence == (
        "GPU 0: utilization 99%, SM activity 80%, occupancy 35%, tensor-core activity 0%, DRAM bandwidth 30%",
        "rank 0 on GPU 0: mixed precision no (fp32 matmuls use the tensor cores only with TF32 on)",
    )
    assert found.fix.startswith("--mixed-precision bf16") and 'set_float32_matmul_precision("high")' in found.fix
    idle = Snapshot("test", NOW, [], [gpu(0, utilization=0.0, sm_active=0.02, tensor_active=0.0)])
    assert "no-tensor-cores" not in kinds(diagnose(idle, LIMITS))


def test_gpus_without_gpm_get_one_note_per_reason():
    gpus = [
        gpu(0, **HEALTHY_GPM),
        gpu(1, gpm_supported=False, gpm_reason="the GPU has no GPM (Hopper and newer have it)"),
        gpu(2, gpm_supported=False, gpm_reason="the GPU has no GPM (Hopper and newer have it)"),
        gpu(3, gpm_supported=False, gpm_reason="nvmlGpmSampleGet: NotSupported"),
    ]
    assert notes(Snapshot("test", NOW, [rank("0", uuid="GPU-0")], gpus), LIMITS) == [
        "GPU 1, 2: no GPM (the GPU has no GPM (Hopper and newer have it)): gpu-underused and no-tensor-cores could "
        "not be judged there, nor the links' measured traffic",
        "GPU 3: no GPM (nvmlGpmSampleGet: NotSupported): gpu-underused and no-tensor-cores could not be judged "
        "there, nor the links' measured traffic",
    ]
    assert notes(Snapshot("test", NOW, [rank("0", uuid="GPU-0")], [gpu(0)]), LIMITS) == []  # unknown: no note


def test_comm_bound_evidence_sets_the_measured_link_traffic_against_the_links_maximum():
    traffic = {"nvlink transmit": 9e9, "nvlink receive": 11.25e9, "pcie transmit": 0.3e9, "pcie receive": 1.2e9}
    h100 = gpu(
        0,
        pcie_generation=5,
        pcie_width=16,
        pcie_max_generation=5,
        pcie_max_width=16,
        nvlinks_active=18,
        link_bytes_per_second=traffic,
    )
    ranks = [rank("0", uuid="GPU-0", comm_exposed_ratio=0.5, comm_seconds=0.2)]
    found = verdict(Snapshot("test", NOW, ranks, [h100]), "comm-bound")
    # 18 links x 25 GB/s each way; PCIe gen 5 x16: 3.938 GB/s per lane.
    assert (
        "rank 0's GPU 0 carried (GPM): NVLink 9.0 GB/s out, 11.2 GB/s in of 450.0 GB/s each way (2%); PCIe "
        "300.0 MB/s out, 1.2 GB/s in of 63.0 GB/s each way (2%)" in found.evidence
    )
    without = verdict(Snapshot("test", NOW, ranks, [gpu(0, nvlinks_active=18)]), "comm-bound")
    assert not any("carried (GPM)" in line for line in without.evidence)


# --- through the exporter on the NVML fake ---------------------------------------------------------------------


def exporter_source(host, ranks: dict[str, dict]) -> CountersSource:
    """Two samples 1 s apart of the exporter on `host` (GPM's pair), scraped; the GPM byte counters' rates over that
    second; and rank series for `ranks` (rank -> its run-info labels), each on the GPU of its own index."""
    rig = Rig(host)
    rig.session.clock = rig.clock
    rig.sample()
    first = render(rig.registry)
    second = rig.scrape()
    instants: dict[str, list] = {}
    rates: dict[str, list] = {}
    for (name, labels), value in second.items():
        instants.setdefault(name, []).append((dict(labels), value))
        if name.startswith("trainstack_gpu_gpm_") and name.endswith("_total"):
            rates.setdefault(name, []).append((dict(labels), value - first.get((name, labels), 0.0)))
    uuids = {dict(labels)["gpu"]: dict(labels)["uuid"] for name, labels in second if name == catalog.GPU_INFO.name}
    for r, run_info in ranks.items():
        instants.setdefault(catalog.TRAIN_RANK_INFO.name, []).append(
            ({"rank": r, "local_rank": r, "node": "node0", "uuid": uuids[r]}, 1.0)
        )
        instants.setdefault(catalog.TRAIN_RUN_INFO.name, []).append(({"rank": r, **run_info}, 1.0))
        instants.setdefault(catalog.TRAIN_COMPILE_SECONDS.name, []).append(({"rank": r}, 0.0))
        instants.setdefault(catalog.TRAIN_LAST_STEP.name, []).append(({"rank": r}, NOW - 1))
        rates.setdefault(catalog.TRAIN_STEPS.name, []).append(({"rank": r}, 4.0))
        rates.setdefault(catalog.TRAIN_SAMPLES.name, []).append(({"rank": r}, 8.0))
    return CountersSource(instants, rates)


FP32 = {"mixed_precision": "no", "clock": "gpu", "strategy": "ddp", "world_size": "4"}
BF16 = {**FP32, "mixed_precision": "bf16"}


@pytest.mark.parametrize(
    "host, run_info, expected, evidence",
    [
        (
            "hollow_h100",
            FP32,
            ["gpu-underused"],
            (
                "GPU 0: utilization 100%, SM activity 15%, occupancy 6%, tensor-core activity 4%, DRAM bandwidth 10%",
                "rank 0 on GPU 0: 2 samples per optimizer step (per-GPU batch x accumulation), mixed precision no, "
                "torch.compile off",
            ),
        ),
        (
            "fp32_h100",
            FP32,
            ["no-tensor-cores"],
            (
                "GPU 0: utilization 99%, SM activity 80%, occupancy 35%, tensor-core activity 0%, DRAM bandwidth 30%",
                "rank 0 on GPU 0: mixed precision no (fp32 matmuls use the tensor cores only with TF32 on)",
            ),
        ),
        ("ddp_h100", BF16, [], ()),
    ],
)
def test_each_verdict_on_its_fake_host_and_none_on_the_healthy_one(host, run_info, expected, evidence):
    snapshot = read_snapshot(exporter_source(host, {str(i): run_info for i in range(4)}))
    assert [g.sm_active is not None and g.gpm_supported for g in snapshot.gpus] == [True] * 4
    verdicts = diagnose(snapshot, LIMITS)
    assert kinds(verdicts) == expected
    if expected:
        assert verdicts[0].evidence[:2] == evidence
        assert len(verdicts[0].evidence) == 8  # a GPU line and a rank line for each of the 4 GPUs
    assert notes(snapshot, LIMITS) == []


def test_through_the_exporter_the_link_traffic_is_read_as_rates_and_gpus_without_gpm_get_their_note():
    h100 = read_snapshot(exporter_source("ddp_h100", {})).gpus[0]
    # The H100 model's GPM answers in MiB/s: 30000 MiB/s on NVLink each way, 250 out and 1100 in on PCIe.
    assert h100.link_bytes_per_second == pytest.approx(
        {
            "nvlink transmit": 30000 * 2**20,
            "nvlink receive": 30000 * 2**20,
            "pcie transmit": 250 * 2**20,
            "pcie receive": 1100 * 2**20,
        }
    )
    mixed = read_snapshot(exporter_source("mixed", {}))
    assert [g.gpm_supported for g in mixed.gpus] == [True, False, False, False]
    assert notes(mixed, LIMITS)[1:] == [  # after the one on a job without rank telemetry
        "GPU 1, 2, 3: no GPM (the GPU has no GPM (Hopper and newer have it)): gpu-underused and no-tensor-cores "
        "could not be judged there, nor the links' measured traffic"
    ]
