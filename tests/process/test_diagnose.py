"""trainstack diagnose on processes: GPU verdicts through the real exporter over the fake NVML, a slowed rank named
the straggler and then stalled once it hangs (real 2-rank CPU runs), and an unreachable source (the verdicts from
snapshots: tests/unit/monitoring/test_diagnose.py)."""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers.fakes import fake_host, kinds
from tests.helpers.runs import live_run, run_trainstack
from tests.helpers.scrapes import diagnose_url
from trainstack.errors import EXIT_RUNTIME
from trainstack.monitoring.diagnose.snapshot import read_snapshot
from trainstack.monitoring.diagnose.sources import ExporterSource
from trainstack.monitoring.diagnose.verdicts import diagnose
from trainstack.rundir import free_port
from trainstack.thresholds import Thresholds


@pytest.mark.slow
def test_gpu_verdicts_through_the_real_exporter(cpu_run):
    from trainstack.monitoring import nvml_fake
    from trainstack.monitoring.exporter.app import Exporter
    from trainstack.monitoring.exporter.config import ExporterConfig

    nvml_fake.load(fake_host())
    exporter = Exporter(
        ExporterConfig(
            port=0,
            metrics_dir=cpu_run / "metrics" / "node-0",
            nvml_module="trainstack.monitoring.nvml_fake",
            sample_interval_seconds=0.1,
            slow_sample_interval_seconds=0.2,
        )
    )
    exporter.start()
    try:
        source = ExporterSource(f"http://127.0.0.1:{exporter.server.port}/metrics", interval=1.0)
    finally:
        exporter.stop()
        nvml_fake.load(None)
    snapshot = read_snapshot(source)
    assert [r.rank for r in snapshot.ranks] == ["0", "1"] and [g.index for g in snapshot.gpus] == list("0123")
    verdicts = {v.kind: v for v in diagnose(snapshot, Thresholds(stall_seconds=1e9))}
    assert set(verdicts) == {"gpus-unused", "throttled", "memory-full"}
    assert "the ranks run on CPU while 1 of 4 visible GPU(s) sit idle" in verdicts["gpus-unused"].summary
    throttling = verdicts["throttled"].evidence
    # The shares are rates over two scrapes ~1 s apart of counters that advance with wall time: allow jitter.
    power = re.match(r"GPU 1: at its power cap (\d+)%", throttling[0])
    thermal = re.match(r"GPU 3: clocks held down by temperature (\d+)%", throttling[1])
    assert power and 80 <= int(power[1]) <= 100 and "SM clock 61% of its maximum" in throttling[0], throttling
    assert thermal and 40 <= int(thermal[1]) <= 65, throttling
    assert verdicts["memory-full"].evidence == ("GPU 3: 97% of its memory used",)


@pytest.mark.slow
def test_a_slowed_rank_is_named_the_straggler_and_once_it_hangs_the_run_is_stalled(tmp_path):
    pause = tmp_path / "pause-seconds"
    slow_rank = {
        "TRAINSTACK_TEST_SLOW_RANK": "1",
        "TRAINSTACK_TEST_SLOW_SECONDS": "0.3",
        "TRAINSTACK_TEST_SLOW_FILE": str(pause),
    }
    with live_run(tmp_path, "--model", "tests.factories:pausing_gpt", "--num-workers", "1", env=slow_rank) as url:
        straggling = diagnose_url(url)
        written = tmp_path / "pause-seconds.new"
        written.write_text("3600")
        written.replace(pause)  # whole: the rank never reads half a number
        deadline = time.monotonic() + 120
        while "stalled" not in kinds(verdicts := diagnose_url(url, interval=1.0, stall_seconds=3)):
            assert time.monotonic() < deadline, f"never stalled: {verdicts}"
        result = run_trainstack("diagnose", "--url", url, "--interval", "1", "--stall-seconds", "3", "--json")
    assert kinds(straggling) == ["straggler"], straggling
    assert straggling[0].summary.startswith("rank 1 is a straggler: the other rank(s) wait for it")
    assert kinds(verdicts) == ["stalled"]
    assert [item.split(":")[0] for item in verdicts[0].evidence] == ["rank 0", "rank 1"]
    assert result.returncode == 1 and '"kind": "stalled"' in result.stdout


@pytest.mark.slow
def test_an_unreachable_source_is_one_line_and_the_runtime_failure_exit_code():
    result = run_trainstack("diagnose", "--url", f"127.0.0.1:{free_port()}", "--interval", "0.1")
    assert result.returncode == EXIT_RUNTIME == 69
    assert result.stderr.startswith("trainstack diagnose: error: cannot read http://127.0.0.1:")
    assert len(result.stderr.splitlines()) == 1
