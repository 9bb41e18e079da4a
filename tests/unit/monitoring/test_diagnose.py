"""trainstack diagnose: each verdict from snapshots, GPU verdicts through the real exporter over the fake NVML,
and the verdicts the issue asks for from real 2-rank CPU runs read live through the exporter: healthy, comm-bound
(a delayed all-reduce), straggler (one slowed rank), stalled (a hung rank). Input-bound (a slowed loader), through
the exporter and through a real Prometheus, reads the input-bound run of tests/infra/test_monitoring_prometheus.py's
stack."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from tests.helpers.fakes import LIMITS, NOW, CountersSource, fake_host, gpu, kinds, rank
from tests.helpers.scrapes import served_metrics
from trainstack import catalog
from trainstack.errors import ConfigError
from trainstack.hang_verdict import Hang
from trainstack.monitoring.diagnose.render import render_json, render_text
from trainstack.monitoring.diagnose.snapshot import Snapshot, read_snapshot
from trainstack.monitoring.diagnose.sources import ExporterSource
from trainstack.monitoring.diagnose.verdicts import diagnose, figures, not_judged, notes
from trainstack.thresholds import Thresholds


def gpu_snapshot(ranks=None, gpus=None) -> Snapshot:
    ranks = ranks or [rank(str(i), uuid=f"GPU-{i}") for i in range(4)]
    return Snapshot("test", NOW, ranks, gpus or [gpu(i) for i in range(4)])


# --- verdicts from snapshots ----------------------------------------------------------------------------------


def test_a_healthy_run_has_no_verdict_and_shows_its_figures():
    # the ranks' natural jitter at the all-reduce: each waits a little, none much longer than another
    snapshot = gpu_snapshot([rank(str(i), uuid=f"GPU-{i}", comm_exposed_ratio=0.05 + 0.01 * i) for i in range(4)])
    assert diagnose(snapshot, LIMITS) == []
    shown = figures(snapshot)
    assert shown["ranks"] == 4 and shown["samples_per_second"] == 4 * 48.0
    assert shown["straggler_wait_ratio_max"] == pytest.approx(0.03)


def test_input_bound_names_the_waiting_ranks():
    verdicts = diagnose(
        gpu_snapshot([rank("0", uuid="GPU-0"), rank("1", uuid="GPU-1", data_wait_ratio=0.45)], [gpu(0), gpu(1)]), LIMITS
    )
    assert kinds(verdicts) == ["input-bound"]
    assert "rank 1" in verdicts[0].summary and "rank 0" not in verdicts[0].summary
    assert "45%" in verdicts[0].evidence[0] and "DataLoader(num_workers=...)" in verdicts[0].fix


@pytest.mark.parametrize("gpus, judged", [([], "no GPU here, so nothing can be judged"), ([gpu(0)], "GPU checks only")])
def test_a_watched_command_without_rank_telemetry_is_uninstrumented_never_no_training(gpus, judged):
    """From the first scrape: watch's series say the command runs, whether or not a GPU shows it."""
    snapshot = Snapshot("test", NOW, [], gpus, command="torchrun --nproc-per-node 2 train.py", command_processes=3)
    assert diagnose(snapshot, LIMITS) == []
    (note,) = notes(snapshot, LIMITS)
    assert note.startswith(
        f"uninstrumented: 3 process(es) of the watched command are running with no rank "
        f"telemetry ({judged}); for per-rank verdicts"
    )
    assert figures(snapshot)["command_processes"] == 3
    ended = Snapshot("test", NOW, [], [], command="python train.py", command_processes=0)
    assert diagnose(ended, LIMITS) == [] and "the watched command has ended" in notes(ended, LIMITS)[0]
    # No watch series and nothing on the GPUs: still no training.
    assert kinds(diagnose(Snapshot("test", NOW, [], [gpu(0, utilization=0.0)]), LIMITS)) == ["no-training"]


@pytest.mark.parametrize("gpus", [[], [gpu(0)]])
def test_a_job_no_rank_reports_gets_a_not_judged_headline_never_healthy(gpus):
    """Nothing judged (a watched command without trainstack.monitor) reads so, in text and JSON, never HEALTHY."""
    snapshot = Snapshot("test", NOW, [], gpus, command="python train.py", command_processes=1)
    verdicts = diagnose(snapshot, LIMITS)
    why = not_judged(snapshot, LIMITS)
    assert verdicts == [] and why is not None and "no rank reports telemetry" in why
    text = render_text("test", verdicts, figures(snapshot), notes(snapshot, LIMITS), None, why)
    assert text.splitlines()[1] == f"NOT JUDGED  {why}" and "HEALTHY" not in text
    shown = json.loads(render_json("test", verdicts, figures(snapshot), notes(snapshot, LIMITS), None, why))
    assert (shown["healthy"], shown["judged"], shown["not_judged"]) == (False, False, why)
    # Ranks that report are judged: their healthy run still reads HEALTHY, and a run with no job is no-training.
    judged_run = gpu_snapshot([rank("0", uuid="GPU-0")])
    assert not_judged(judged_run, LIMITS) is None
    assert not_judged(Snapshot("test", NOW, [], [gpu(0, utilization=0.0)]), LIMITS) is None
    assert json.loads(render_json("t", [], figures(judged_run)))["healthy"] is True
    partly = render_text("t", [], figures(judged_run), unjudged={"1": "no records file"})
    assert partly.splitlines()[1].startswith("HEALTHY  1 rank(s)")
    assert partly.splitlines()[2] == "not judged: rank 1 (no records file)"


@pytest.mark.parametrize(
    "launcher, knobs, not_knobs",
    [
        (
            "train",
            (
                "--num-workers",
                "--gradient-accumulation-steps",
                "--strategy fsdp",
                "--compile",
                "--mixed-precision bf16",
            ),
            ("DataLoader(", "DDP(model, bucket_cap_mb"),
        ),
        (
            "watch",
            (
                "DataLoader(num_workers=...)",
                "DDP(model, bucket_cap_mb=...)",
                "DataLoader(batch_size=...)",
                "torch.compile(model)",
                "torch.autocast",
            ),
            ("--num-workers", "--batch-size", "--strategy", "--compile"),
        ),
    ],
)
def test_a_fix_names_the_knob_of_whatever_started_the_ranks(launcher, knobs, not_knobs):
    """`trainstack train`'s ranks are tuned by its flags; a watched script's by its own code."""
    ranks = [
        rank(
            str(i),
            uuid=f"GPU-{i}",
            launcher=launcher,
            data_wait_ratio=0.45,
            comm_exposed_ratio=0.5,
            comm_seconds=0.2,
            host_bound_ratio=0.4,
            mfu=0.05,
        )
        for i in range(2)
    ]
    verdicts = diagnose(gpu_snapshot(ranks, [gpu(0), gpu(1)]), LIMITS)
    assert {"input-bound", "comm-bound", "host-bound", "low-mfu"} <= set(kinds(verdicts))
    fixes = " ".join(v.fix for v in verdicts if v.kind in ("input-bound", "comm-bound", "host-bound", "low-mfu"))
    assert all(knob in fixes for knob in knobs), fixes
    assert not any(knob in fixes for knob in not_knobs), fixes


def test_a_gpu_rank_is_input_bound_by_its_gpu_starvation_not_its_host_wait():
    # The H100 run: the host sat in next() 21% of the step while the GPU still had queued work.
    busy = rank("0", uuid="GPU-0", clock="gpu", data_wait_ratio=0.01, host_data_wait_ratio=0.21)
    assert diagnose(gpu_snapshot([busy], [gpu(0)]), LIMITS) == []
    starved = rank("0", uuid="GPU-0", clock="gpu", data_wait_ratio=0.35, host_data_wait_ratio=0.4)
    verdicts = diagnose(gpu_snapshot([starved], [gpu(0)]), LIMITS)
    assert kinds(verdicts) == ["input-bound"]
    assert verdicts[0].evidence == (
        "rank 0: its GPU sat idle for want of the next batch 35% of its step time "
        "(GPU timeline; its host waited in the loader 40%)",
    )


def test_figures_say_which_clock_measured_the_data_wait():

    on_gpu = gpu_snapshot(
        [rank("0", uuid="GPU-0", clock="gpu", data_wait_ratio=0.01, host_data_wait_ratio=0.21)], [gpu(0)]
    )
    shown = figures(on_gpu)
    assert shown["data_wait_clock"] == "gpu" and shown["host_data_wait_ratio_max"] == 0.21
    assert "GPU starved for data at most 1% (host in the loader at most 21%)" in render_text("t", [], shown)
    on_cpu = figures(Snapshot("test", NOW, [rank("0"), rank("1")]))
    assert on_cpu["data_wait_clock"] == "host"
    assert "data wait at most 2%" in render_text("t", [], on_cpu)


def test_the_snapshot_reads_each_ranks_clock_and_both_waits():
    def series(**by_rank):
        return [({"rank": r.removeprefix("r")}, value) for r, value in by_rank.items()]

    info = [({"rank": "0", "run_id": "x", "clock": "gpu"}, 1.0), ({"rank": "1", "run_id": "x"}, 1.0)]
    source = CountersSource(
        {"trainstack_train_run_info": info, "trainstack_train_steps_total": series(r0=50, r1=50)},
        {
            "trainstack_train_step_duration_seconds_sum": series(r0=1.0, r1=1.0),
            "trainstack_train_data_wait_seconds_total": series(r0=0.02, r1=0.3),
            "trainstack_train_host_data_wait_seconds_total": series(r0=0.25, r1=0.3),
        },
    )
    gpu_rank, older_rank = read_snapshot(source).ranks
    assert (gpu_rank.clock, gpu_rank.data_wait_ratio, gpu_rank.host_data_wait_ratio) == ("gpu", 0.02, 0.25)
    # a rank from before the clock label: the host's clock, as it was then
    assert (older_rank.clock, older_rank.data_wait_ratio) == ("host", 0.3)


def test_straggler_is_the_rank_that_waits_least_while_its_peers_wait():
    # Rank 1's forward pass is 50 ms longer: ranks 0 and 2 wait for it at the collectives, it hardly waits.
    ranks = [
        rank("0", forward_seconds=0.001, comm_exposed_ratio=0.18),
        rank("1", forward_seconds=0.051, comm_exposed_ratio=0.01),
        rank("2", forward_seconds=0.002, comm_exposed_ratio=0.19),
    ]
    verdicts = diagnose(Snapshot("test", NOW, ranks), LIMITS)
    assert kinds(verdicts) == ["straggler"]
    assert verdicts[0].summary.startswith(
        "rank 1 is a straggler: the other rank(s) wait for it 54 ms of each 300 ms step (18%)"
    )
    assert verdicts[0].evidence[1] == "rank 1: waits at the collectives 3.0 ms (1%) per step, forward 51.0 ms per step"
    # Without the waits measured (no DDP or FSDP model given to the monitor), equal step times name no one.
    unmeasured = [rank(str(i), forward_seconds=0.001 if i else 0.05) for i in range(3)]
    assert diagnose(Snapshot("test", NOW, unmeasured), LIMITS) == []
    assert "stragglers unknown (no rank's wait" in render_text("test", [], figures(Snapshot("test", NOW, unmeasured)))
    # A stall: no rank stepped in the window, so nothing is compared; not a loop without its model.
    stalled = [replace(view, steps_per_second=0.0) for view in unmeasured]
    shown = render_text("test", [], figures(Snapshot("test", NOW, stalled)))
    assert "stragglers unknown (no rank stepped in the window" in shown and "no DDP" not in shown


def test_a_rank_slowed_outside_its_forward_pass_is_named_and_its_data_wait_shown():
    # Rank 0's loader is slow: rank 1 waits for it at the all-reduce (29% of its step), rank 0 only 2%.
    ranks = [
        rank("0", data_wait_ratio=0.3, comm_exposed_ratio=0.02),
        rank("1", data_wait_ratio=0.01, comm_exposed_ratio=0.29),
    ]
    (verdict,) = (v for v in diagnose(Snapshot("test", NOW, ranks), LIMITS) if v.kind == "straggler")
    assert verdict.summary.startswith("rank 0 is a straggler: the other rank(s) wait for it 81 ms of each 300 ms")
    assert "waits for data 90.0 ms (30%) per step" in verdict.evidence[0]


def test_a_straggler_that_pauses_alone_is_told_to_save_on_every_rank():
    # The seeds' rank-0 checkpoint: rank 0 alone saves (30% of its time), and rank 1 waits for it at the next
    # all-reduce. Rank 0's pause is none of its steps, rank 1's wait for it is in its steps.
    ranks = [
        rank("0", comm_exposed_ratio=0.37, step_seconds=0.011, paused_ratio={"checkpoint_save": 0.3}),
        rank("1", comm_exposed_ratio=0.56, step_seconds=0.016),
    ]
    (verdict,) = (v for v in diagnose(Snapshot("test", NOW, ranks), LIMITS) if v.kind == "straggler")
    assert verdict.summary.startswith("rank 0 is a straggler")
    assert verdict.evidence[0].endswith(", saving checkpoints 30% of its time")
    assert verdict.evidence[1].endswith(", saving checkpoints 0% of its time")
    assert (
        "It pauses alone: saving checkpoints 30% of its time, and the others wait for it at their next collective: "
        "save on every rank at once (torch.distributed.checkpoint" in verdict.fix
    )
    # Every rank saving (torch.distributed.checkpoint) pauses them alike: the straggler's cause lies elsewhere.
    for r in ranks:
        r.paused_ratio.update(checkpoint_save=0.3, evaluation=0.01)
    (verdict,) = (v for v in diagnose(Snapshot("test", NOW, ranks), LIMITS) if v.kind == "straggler")
    assert "pauses alone" not in verdict.fix and "checkpoints" not in " ".join(verdict.evidence)


def test_the_snapshot_reads_each_ranks_pauses_as_shares_of_its_time():
    time_by_part = [
        ({"rank": "0", "part": "compute"}, 0.5),
        ({"rank": "0", "part": "checkpoint_save"}, 0.3),
        ({"rank": "0", "part": "evaluation"}, 0.1),
        ({"rank": "1", "part": "compute"}, 0.8),
    ]
    source = CountersSource(
        {"trainstack_train_steps_total": [({"rank": "0"}, 50.0), ({"rank": "1"}, 50.0)]},
        {"trainstack_train_time_seconds_total": time_by_part},
    )
    saving, not_saving = read_snapshot(source).ranks
    assert saving.paused_ratio == {"checkpoint_save": 0.3, "evaluation": 0.1}
    assert not_saving.paused_ratio == {}


def test_comm_bound_when_every_rank_waits_for_the_all_reduce():
    ranks = [rank("0", comm_exposed_ratio=0.5, comm_seconds=0.2), rank("1", comm_exposed_ratio=0.4, comm_seconds=0.18)]
    verdicts = diagnose(Snapshot("test", NOW, ranks), LIMITS)
    assert kinds(verdicts) == ["comm-bound"]
    assert "at least 40% of its step time for communication (threshold 25%)" in verdicts[0].summary
    assert verdicts[0].evidence[0] == (
        "rank 0: waits for communication 50% of its step time (150 ms exposed of 200 ms communication per step)"
    )
    assert "bucket_cap_mb" in verdicts[0].fix and "NCCL_P2P_DISABLE" in verdicts[0].fix
    assert figures(Snapshot("test", NOW, ranks))["comm_exposed_ratio_min"] == 0.4


@pytest.mark.parametrize(
    "exposed",
    [
        (0.1, 0.05),  # hidden by backward: a fast link
        (0.6, 0.02),  # rank 0 waits for rank 1 inside the all-reduce: a straggler, not the network
        (0.6, None),  # a rank that does not measure it (FSDP, or an older trainer): unknown, not comm-bound
    ],
)
def test_not_comm_bound(exposed):
    ranks = [rank(str(i), comm_exposed_ratio=share) for i, share in enumerate(exposed)]
    assert "comm-bound" not in kinds(diagnose(Snapshot("test", NOW, ranks), LIMITS))


def test_the_snapshot_reads_communication_per_rank():
    per_rank = [({"rank": "0"}, 2.0), ({"rank": "1"}, 2.0)]
    source = CountersSource(
        {"trainstack_train_steps_total": [({"rank": "0"}, 50.0), ({"rank": "1"}, 50.0)]},
        {
            "trainstack_train_steps_total": per_rank,
            "trainstack_train_step_duration_seconds_sum": per_rank,
            "trainstack_train_comm_exposed_seconds_total": [({"rank": "0"}, 0.5)],
            "trainstack_train_comm_seconds_total": [({"rank": "0"}, 1.0)],
        },
    )
    ddp_rank, unmeasured = read_snapshot(source).ranks
    assert (ddp_rank.comm_exposed_ratio, ddp_rank.comm_seconds) == (0.25, 0.5)
    assert (unmeasured.comm_exposed_ratio, unmeasured.comm_seconds) == (None, None)


def test_host_bound_names_the_ranks_whose_gpu_idles_with_nothing_to_wait_for():
    ranks = [
        rank("0", uuid="GPU-0", host_bound_ratio=0.35, comm_exposed_ratio=0.05),
        rank("1", uuid="GPU-1", host_bound_ratio=0.1),
        rank("2", uuid="GPU-2", host_bound_ratio=None),
    ]
    verdicts = diagnose(gpu_snapshot(ranks, [gpu(i) for i in range(3)]), LIMITS)
    assert kinds(verdicts) == ["host-bound"]
    assert verdicts[0].summary.startswith("host-bound: rank 0: the GPU idles more than 20% of its step time")
    assert verdicts[0].evidence == (
        "rank 0: its GPU idled 35% of its step time waiting for the host (besides: "
        "starved for data 2%, waiting on communication 5%)",
    )
    assert "DataLoader(batch_size=...)" in verdicts[0].fix and "torch.compile(model)" in verdicts[0].fix


def test_the_snapshot_reads_the_host_bound_part_of_each_ranks_time():
    per_rank = [({"rank": "0"}, 2.0), ({"rank": "1"}, 2.0)]
    time_by_part = [
        ({"rank": "0", "part": "compute"}, 1.2),
        ({"rank": "0", "part": "host_bound"}, 0.5),
        ({"rank": "1", "part": "compute"}, 1.7),
    ]  # a CPU rank: no host_bound series
    source = CountersSource(
        {"trainstack_train_steps_total": [({"rank": "0"}, 50.0), ({"rank": "1"}, 50.0)]},
        {"trainstack_train_step_duration_seconds_sum": per_rank, "trainstack_train_time_seconds_total": time_by_part},
    )
    gpu_rank, cpu_rank = read_snapshot(source).ranks
    assert (gpu_rank.host_bound_ratio, cpu_rank.host_bound_ratio) == (0.25, None)


def test_noise_in_a_tiny_forward_pass_is_no_straggler():
    # 1.6x the other's forward time, and waits 3% of the step apart: a slow loader's run on a busy CPU.
    ranks = [
        rank("0", forward_seconds=0.016, step_seconds=0.9, comm_exposed_ratio=0.02),
        rank("1", forward_seconds=0.010, step_seconds=0.9, comm_exposed_ratio=0.05),
    ]
    assert Snapshot("test", NOW, ranks).straggler_waits()["0"] == pytest.approx(0.03)
    assert diagnose(Snapshot("test", NOW, ranks), LIMITS) == []


def test_stalled_names_the_rank_whose_gpu_idles_while_the_others_spin_in_nccl():
    ranks = [
        rank(
            str(i),
            uuid=f"GPU-{i}",
            steps=57,
            last_step_time=NOW - 700,
            steps_per_second=0.0,
            samples_per_second=0.0,
            data_wait_ratio=0.0,
            step_seconds=None,
            forward_seconds=None,
        )
        for i in range(4)
    ]
    verdicts = diagnose(gpu_snapshot(ranks, [gpu(0), gpu(1), gpu(2, utilization=0.0), gpu(3)]), LIMITS)
    assert kinds(verdicts) == ["stalled"]
    assert "for 700 s (threshold 600 s)" in verdicts[0].summary
    assert "rank 2: GPU idle while the other ranks' GPUs are busy" in verdicts[0].evidence[-1]


def test_stalled_names_ranks_that_stopped_first():
    ranks = [rank("0", steps=57, last_step_time=NOW - 30), rank("1", steps=55, last_step_time=NOW - 40)]
    verdicts = diagnose(Snapshot("test", NOW, ranks), Thresholds(stall_seconds=20))
    assert kinds(verdicts) == ["stalled"] and "rank 1 stopped first (57 steps elsewhere)" in verdicts[0].evidence


@pytest.mark.parametrize(
    ("ranks", "idle", "phrase"),
    [
        ([rank("0", uuid="GPU-0"), rank("1", uuid="GPU-1")], ["2", "3"], "2 rank(s) use 2 GPU(s); 2 of 4"),
        ([rank("0"), rank("1")], ["2", "3"], "the ranks run on CPU while 2 of 4"),
    ],
)
def test_gpus_no_rank_uses_are_named(ranks, idle, phrase):
    gpus = [gpu(0), gpu(1), gpu(2, utilization=0.0), gpu(3, utilization=0.01)]
    verdicts = diagnose(Snapshot("test", NOW, ranks, gpus), LIMITS)
    assert kinds(verdicts) == ["gpus-unused"] and phrase in verdicts[0].summary
    assert [item.split(" (")[0] for item in verdicts[0].evidence] == [f"GPU {i}" for i in idle]


@pytest.mark.parametrize(
    ("changes", "kind", "phrase"),
    [
        ({"thermal_throttle_ratio": 0.3}, "throttled", "held down by temperature 30%"),
        ({"power_throttle_ratio": 0.9, "sm_clock_ratio": 0.6}, "throttled", "power cap 90% of the time, SM clock 60%"),
        ({"memory_used_ratio": 0.97}, "memory-full", "97% of its memory used"),
    ],
)
def test_gpu_verdicts(changes, kind, phrase):
    verdicts = diagnose(gpu_snapshot(gpus=[gpu(0), gpu(1), gpu(2, **changes), gpu(3)]), LIMITS)
    assert kinds(verdicts) == [kind]
    assert len(verdicts[0].evidence) == 1 and verdicts[0].evidence[0].startswith("GPU 2: ")
    assert phrase in verdicts[0].evidence[0]


def test_at_the_power_cap_with_full_clocks_is_not_throttling():
    gpus = [gpu(0, power_throttle_ratio=0.9, sm_clock_ratio=0.95), gpu(1), gpu(2), gpu(3)]
    assert diagnose(gpu_snapshot(gpus=gpus), LIMITS) == []


def test_low_mfu():
    ranks = [rank("0", uuid="GPU-0", mfu=0.08), rank("1", uuid="GPU-1", mfu=0.12)]
    verdicts = diagnose(gpu_snapshot(ranks, [gpu(0), gpu(1)]), LIMITS)
    assert kinds(verdicts) == ["low-mfu"] and "10% of the GPUs' peak" in verdicts[0].summary
    ranks = [rank("0", uuid="GPU-0", mfu=0.41), rank("1", uuid="GPU-1", mfu=0.39)]
    assert diagnose(gpu_snapshot(ranks, [gpu(0), gpu(1)]), LIMITS) == []


def test_nothing_to_read_and_nothing_stepped_yet():
    assert kinds(diagnose(Snapshot("test", NOW, [], [gpu(0, utilization=0.0)]), LIMITS)) == ["no-training"]
    fresh = [rank("0", last_step_time=None, steps=0), rank("1", last_step_time=None, steps=0)]
    assert kinds(diagnose(Snapshot("test", NOW, fresh), LIMITS)) == ["no-step-yet"]
    # The launcher's evidence of this launch, collected while the first step was awaited: the hang, named.
    first = Hang("rank 1 has not joined all_reduce #1 of process group 0 (rank 0 waits in it)", ["rank 0: ..."], "fix")
    (verdict,) = diagnose(Snapshot("test", NOW, fresh, hang=(first, NOW - 5)), LIMITS)
    assert verdict.kind == "stalled" and verdict.summary.endswith(first.headline) and verdict.fix.startswith("fix;")
    assert "rank 0: ..." in verdict.evidence


def test_stale_gpu_data_is_said_to_be_stale():
    ages = {"node0:9450 fast": (12.0, 1.0), "node0:9450 slow": (20.0, 30.0)}
    verdicts = diagnose(Snapshot("test", NOW, [rank("0", uuid="GPU-0")], [gpu(0)], ages), LIMITS)
    assert kinds(verdicts) == ["gpu-data-stale"]
    assert verdicts[0].evidence == ("node0:9450 fast: sample 12 s old, read every 1 s",)
    fresh = {"node0:9450 fast": (0.5, 1.0), "node0:9450 slow": (80.0, 30.0)}
    assert diagnose(Snapshot("test", NOW, [rank("0", uuid="GPU-0")], [gpu(0)], fresh), LIMITS) == []


def test_thresholds_must_be_positive():
    with pytest.raises(ConfigError, match="stall-seconds must be positive"):
        Thresholds(stall_seconds=0)


# --- GPU series through the real exporter (fake NVML) ---------------------------------------------------------


def test_slow_gpu_counters_have_no_rate_until_the_exporter_reads_them_again():
    from trainstack.monitoring import nvml_fake
    from trainstack.monitoring.exporter.app import Exporter
    from trainstack.monitoring.exporter.config import ExporterConfig

    nvml_fake.load(fake_host())
    exporter = Exporter(
        ExporterConfig(
            port=0,
            nvml_module="trainstack.monitoring.nvml_fake",
            sample_interval_seconds=0.1,
            slow_sample_interval_seconds=600,
        )
    )
    exporter.start()
    try:
        source = ExporterSource(f"http://127.0.0.1:{exporter.server.port}/metrics", interval=0.3)
    finally:
        exporter.stop()
        nvml_fake.load(None)
    # GPU 1's power violation counter rises 0.9 s per second, but the exporter read it once, at its start: a
    # rate over the scrapes would say 0, so there is none, and the throttling figure falls back to clock reasons.
    assert source.rate("trainstack_gpu_power_violation_seconds_total") == []
    snapshot = read_snapshot(source)
    assert [g.power_throttle_ratio for g in snapshot.gpus] == [0.0] * 4
    assert set(snapshot.gpu_sample_ages) == {"fast", "slow"}


# --- real runs, read live -------------------------------------------------------------------------------------


ENDING_RUN = (
    f"# TYPE {catalog.WATCH_COMMAND_PROCESSES.name} gauge\n{catalog.WATCH_COMMAND_PROCESSES.name} 2.0\n"
    f"# TYPE {catalog.WATCH_COMMAND_INFO.name} gauge\n"
    f'{catalog.WATCH_COMMAND_INFO.name}{{command="python train.py",run_id="r"}} 1.0\n'
)
"""An exporter whose run ends right after its first scrape: it answers once, then stops listening."""


def test_a_diagnose_whose_scrapes_straddle_the_runs_end_judges_the_first_reading(capsys):
    from trainstack.monitoring.diagnose import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)  # the command line's own defaults, whatever flags it gains
    with served_metrics(ENDING_RUN, once=True) as url:
        args = parser.parse_args(["--url", url, "--source", "exporter", "--interval", "0.5", "--json"])
        assert cli.run(args) == 0  # not 69: what the first scrape gave is judged
    shown = json.loads(capsys.readouterr().out)
    assert shown["notes"][0].startswith("the run ended meanwhile: its exporter was gone 0.5 s after the first scrape")
    assert shown["notes"][1].startswith("uninstrumented: 2 process(es) of the watched command are running")
    assert shown["verdicts"] == []
