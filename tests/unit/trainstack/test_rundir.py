"""The run-directory contract (trainstack/rundir.py): its names are spelled once, ports are checked alike and free
ones found by one function, and summary.json carries a version its readers understand."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.helpers.runs import REPO
from trainstack import rundir
from trainstack.errors import ConfigError

SOURCES = ("trainstack", "train", "monitoring", "supervisor", "commands", "bench", "scripts")
FILE_NAMES = (rundir.CONFIG_FILE, rundir.SUMMARY_FILE, rundir.REPORT_FILE, rundir.GPU_LOG_FILE)
FOLDERS = (
    rundir.CHECKPOINTS_DIR,
    rundir.TELEMETRY_DIR,
    rundir.METRICS_DIR,
    rundir.LEASE_DIR,
    rundir.EXPORTS_DIR,
    rundir.PREVIOUS_DIR,
    rundir.ROLL_CALL_DIR,
)
# The start of a per-rank, per-node or set-aside name (rank-<r>.jsonl, node-<n>, before-<run id>); not per-rank.
PATTERNS = re.compile(r"(?<![\w-])(rank|node|before)-(?=$|[{\d*<])")


def code_strings(path: Path) -> list[str]:
    """The string literals of a module that code uses (f-string parts included), not its docstrings."""
    tree = ast.parse(path.read_text(), str(path))
    documentation = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documentation
    ]


def spellings(text: str) -> set[str]:
    found = {name for name in FILE_NAMES if name in text}
    found |= {name for name in FOLDERS if text == name or re.search(rf"(^|/){name}/", text)}
    found |= {match.group(1) + "-" for match in PATTERNS.finditer(text)}
    return found


def where_spelled(root: Path) -> dict[str, set[str]]:
    """run-directory name -> the modules whose code spells it."""
    found: dict[str, set[str]] = {}
    for package in SOURCES:
        for path in sorted((root / package).rglob("*.py")):
            for text in code_strings(path):
                for name in spellings(text):
                    found.setdefault(name, set()).add(str(path.relative_to(root)))
    return found


def test_each_run_directory_name_is_spelled_in_one_module():
    found = where_spelled(REPO)
    assert set(found) >= {*FILE_NAMES, *FOLDERS, "rank-", "node-", "before-"}  # the scan finds them all
    assert {name: modules for name, modules in found.items() if modules != {"trainstack/rundir.py"}} == {}


def test_the_scan_catches_a_second_spelling(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "report.py").write_text(
        '"""Reads summary.json (a docstring may say so)."""\n'
        "def paths(run_dir, rank):\n"
        '    return run_dir / "summary.json", run_dir / "telemetry" / f"rank-{rank}.jsonl", "per-rank"\n'
    )
    assert where_spelled(tmp_path) == {name: {"train/report.py"} for name in ("summary.json", "telemetry", "rank-")}


FREE_PORT_DEFINITION = re.compile(r"^\s*def _?free_port\(", re.MULTILINE)


def free_port_definitions(root: Path) -> list[str]:
    """Where a function named free_port (or _free_port) is defined, tests and benchmarks included."""
    modules = [path for folder in (*SOURCES, "tests") for path in (root / folder).rglob("*.py")]
    return sorted(str(path.relative_to(root)) for path in modules if FREE_PORT_DEFINITION.search(path.read_text()))


def test_one_free_port_serves_the_launcher_the_doctor_the_tests_and_the_benchmarks():
    assert free_port_definitions(REPO) == ["trainstack/rundir.py"]


def test_the_scan_catches_a_second_free_port(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "helper.py").write_text("class Ports:\n    def _free_port(self):\n        return 0\n")
    assert free_port_definitions(tmp_path) == ["bench/helper.py"]


def test_the_layout():
    run = rundir.RunDir(Path("run"))
    assert [
        str(p)
        for p in (
            run.config,
            run.summary,
            run.report,
            run.checkpoint(7),
            run.unsealed_checkpoint(7),
            run.rank_records(3),
            run.gpu_log,
            run.node_metrics(1),
            run.lease_file(0),
            run.exports,
            run.previous("abc").summary,
        )
    ] == [
        "run/config.yaml",
        "run/summary.json",
        "run/report.html",
        "run/checkpoints/step-00000007",
        "run/checkpoints/.tmp-step-00000007",
        "run/telemetry/rank-3.jsonl",
        "run/telemetry/gpu.jsonl",
        "run/metrics/node-1",
        "run/lease/node-0.json",
        "run/exports",
        "run/previous/before-abc/summary.json",
    ]
    assert rundir.STEP_DIR.match(run.checkpoint(12).name)
    assert not rundir.STEP_DIR.match(run.unsealed_checkpoint(12).name)
    assert str(rundir.SHOWN.node_metrics("<n>")) == "RUN_DIR/metrics/node-<n>"


def test_rank_records_and_lease_files_are_found_by_their_pattern(tmp_path):
    run = rundir.RunDir(tmp_path)
    for path in (
        run.rank_records(10),
        run.rank_records(2),
        run.telemetry / "rank-x.jsonl",
        run.gpu_log,
        run.lease_file(1),
        run.lease / "node-1.json.takeover",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    assert run.all_rank_records() == {2: run.rank_records(2), 10: run.rank_records(10)}
    assert run.lease_files() == [run.lease_file(1)]


@pytest.mark.parametrize(
    "flag, port, zero_means, message",
    [
        ("--port", 70000, "for any free port", "--port 70000 is not a TCP port: use 1-65535 (or 0 for any free port)"),
        ("--master-port", 0, None, "--master-port 0 is not a TCP port: use 1-65535"),
        ("--exporter-port", -1, "to run no exporter", "--exporter-port -1 is not a TCP port"),
    ],
)
def test_one_port_check_for_every_flag(flag, port, zero_means, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        rundir.check_port(flag, port, zero_means)


def test_port_zero_and_the_ends_of_the_range():
    assert rundir.check_port("--port", 0, "for any free port") == 0
    assert rundir.check_port("--master-port", 1) == 1 and rundir.check_port("--master-port", 65535) == 65535


def test_every_port_flag_goes_through_the_one_check():
    from trainstack.monitoring.exporter.config import ExporterConfig
    from trainstack.train.launcher.doctor import DoctorConfig
    from trainstack.train.launcher.launch_config import LaunchConfig

    world = dict(
        nproc_per_node=1,
        nnodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        use_cpu=True,
        exporter_host="127.0.0.1",
        rendezvous_timeout=1.0,
    )
    for build, text in (
        (lambda: ExporterConfig(port=65536), "--port 65536 is not a TCP port"),
        (lambda: LaunchConfig(**world, master_port=0, exporter_port=0), "--master-port 0 is not a TCP port"),
        (lambda: LaunchConfig(**world, master_port=1, exporter_port=65536), "--exporter-port 65536 is not a TCP port"),
        (lambda: DoctorConfig(master_port=0), "--master-port 0 is not a TCP port"),
        (lambda: DoctorConfig(exporter_port=70000), "--exporter-port 70000 is not a TCP port"),
    ):
        with pytest.raises(ConfigError, match=text):
            build()


def test_the_default_ports_are_the_contracts():
    from trainstack.monitoring.diagnose.cli import DEFAULT_URL
    from trainstack.monitoring.exporter.config import ExporterConfig
    from trainstack.train.launcher.doctor import DoctorConfig

    assert ExporterConfig().port == DoctorConfig().exporter_port == rundir.DEFAULT_EXPORTER_PORT == 9450
    assert DEFAULT_URL == "http://127.0.0.1:9450" and DoctorConfig().master_port == 29500


def test_the_doctor_checks_what_train_runs_with_no_flags():
    from trainstack.train.launcher.doctor import DoctorConfig
    from trainstack.train.launcher.doctor.config import token_batch_bytes
    from trainstack.train.rank.config import TrainConfig

    train, doctor = TrainConfig(), DoctorConfig()
    assert (
        str(doctor.output_dir),
        doctor.num_workers,
        doctor.prefetch_factor,
        doctor.keep_checkpoints,
        doctor.loader_batch_bytes,
    ) == (
        train.output_dir,
        train.num_workers,
        train.prefetch_factor,
        train.keep_checkpoints,
        token_batch_bytes(train.batch_size, train.seq_len),
    )


# ---- summary.json -----------------------------------------------------------------------------------------
def test_the_writer_stamps_the_version_and_readers_get_it_back(tmp_path):
    path = tmp_path / rundir.SUMMARY_FILE
    rundir.write_summary(path, {"run_id": "r", "steps": 3, "exit_reason": "completed", "exit_code": 0})
    assert json.loads(path.read_text())["version"] == rundir.SUMMARY_VERSION == 1
    assert rundir.read_summary(path) == {
        "version": 1,
        "run_id": "r",
        "steps": 3,
        "exit_reason": "completed",
        "exit_code": 0,
    }
    assert not list(tmp_path.glob("*.tmp"))


def test_a_summary_of_the_declared_types_reads_whole_where_json_writes_a_float_as_an_int(tmp_path):
    path = tmp_path / rundir.SUMMARY_FILE
    written = {
        "started": 1796000000,
        "world_size": None,
        "segments": [{"started": 1.5, "ended": 2, "exit_reason": None, "samples": 8}],
        "time_breakdown": None,
        "verdicts": [],
        "ceilings": {"straggler": {"speedup": 1.2}},
    }
    path.write_text(json.dumps(written))
    assert rundir.read_summary(path) == {"version": 0, **written}


def test_a_summary_from_before_the_version_reads_as_version_0(tmp_path):
    path = tmp_path / rundir.SUMMARY_FILE
    path.write_text(json.dumps({"run_id": "old", "steps": 5, "exit_reason": "completed"}))
    assert rundir.read_summary(path) == {"version": 0, "run_id": "old", "steps": 5, "exit_reason": "completed"}


def test_no_summary_is_empty_and_a_bad_or_newer_one_is_one_line(tmp_path):
    path = tmp_path / rundir.SUMMARY_FILE
    assert rundir.read_summary(path) == {}
    for text, message in (
        ("{not json", "is not a readable summary"),
        ("[1]", "not a JSON object"),
        (json.dumps({"version": 2}), "summary version 2, newer than this trainstack reads"),
        (json.dumps({"segments": "oops"}), r"'segments' is \"oops\", not list\[Segment\]: the file was edited"),
        (json.dumps({"segments": [{"started": "noon"}]}), "not list"),
        (json.dumps({"world_size": 2.5}), r"not int \| None"),
        (json.dumps({"verdicts": [{"kind": "x"}], "started": True}), "'started' is true, not float"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as error:
            rundir.read_summary(path)
        assert "\n" not in str(error.value)


def test_a_run_directory_or_a_file_under_a_file_is_refused_in_one_line_before_anything_is_written(tmp_path):
    user_file = tmp_path / "afile"
    user_file.write_text("mine")
    with pytest.raises(ConfigError, match=r"--output-dir .*/afile/sub: .*/afile is a file; choose another path"):
        rundir.check_run_dir(user_file / "sub", "--output-dir")
    with pytest.raises(ConfigError, match=r"--write .*/nowhere/t.yaml: .*/nowhere is not an existing directory"):
        rundir.check_file_path(tmp_path / "nowhere" / "t.yaml", "--write")
    with pytest.raises(ConfigError, match="is a directory"):
        rundir.check_file_path(tmp_path, "--html")
    rundir.check_file_path(tmp_path / "new.html", "--html")
    assert user_file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
