"""The run directory and the process contract: every path inside a run directory, the environment the launcher
hands to the ranks and the exporter, the default ports, and the summary.json schema.

The launcher, the ranks, the exporter, the report, the doctor and the benchmarks all read and write these; this
module is the one place their names are spelled (docs/architecture.md, "Run directory", shows the layout). It
imports nothing heavy: the exporter and diagnose import it without torch.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from trainstack.errors import ConfigError
from trainstack.write_failure import write_atomically

# ---- the environment ----------------------------------------------------------------------------------------
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own name: the ranks' multiprocess files go here
RUN_ID_ENV = "TRAINSTACK_RUN_ID"  # names the run; the nodes of one job share it (e.g. the Kubernetes Job uid)
# The run directory of a watched command (`trainstack watch`), where trainstack.monitor writes the ranks' records;
# with METRICS_DIR_ENV and RUN_ID_ENV it is what the instrumentation in a user's own loop reads.
RUN_DIR_ENV = "TRAINSTACK_RUN_DIR"
# The steps of each interval (a record of a rank) that `trainstack watch --log-every` gives the watched ranks'
# trainstack.monitor, unless a script passes its own; DEFAULT_LOG_EVERY without it.
LOG_EVERY_ENV = "TRAINSTACK_LOG_EVERY"
DEFAULT_LOG_EVERY = 10
# Unix time at which the launcher (or `trainstack watch`) started the ranks' command: a rank's startup is from it to
# its first step.
LAUNCHED_AT_ENV = "TRAINSTACK_LAUNCHED_AT"
# Which launcher started the ranks: LAUNCHER_TRAIN (trainstack's own loop, whose knobs are `trainstack train`'s flags)
# or LAUNCHER_WATCH (a user's script, whose knobs are in its own code): a verdict's fix names the one the user turns.
LAUNCHER_ENV = "TRAINSTACK_LAUNCHER"
LAUNCHER_TRAIN = "train"
LAUNCHER_WATCH = "watch"
# Why no rank of a watched command records: the one wording of diagnose, the end-of-run card, the report and compare.
UNSEEN_RANKS = (
    "watch ran with --no-auto, or the command's loop is one its automatic instrumentation does not see: "
    'docs/monitor-your-training.md, "No line changed"'
)
# What a command whose ranks record nothing lacks, and how to get it, no line changed first: watch prints it on its
# console, diagnose notes it.
INSTRUMENT_HINT = (
    "for per-rank verdicts (input-bound, straggler, stalled, comm-bound, host-bound) run it under `trainstack watch` "
    "without --no-auto, which instruments DDP and FSDP models and the Lightning and transformers Trainers by "
    "itself, or add `import trainstack.monitor` to a loop it does not see (docs/monitor-your-training.md)"
)
# Seconds a watched command may run before watch, seeing no rank record, prints INSTRUMENT_HINT (default 60).
WATCH_HINT_SECONDS_ENV = "TRAINSTACK_WATCH_HINT_SECONDS"
LEASE_TIMEOUT_ENV = "TRAINSTACK_LEASE_TIMEOUT"  # seconds without a heartbeat before another host's lease is stale
LEASE_FILE_ENV = "TRAINSTACK_LEASE_FILE"  # the lease file a launcher's child runs under, for its ranks to share
DEFAULT_LEASE_TIMEOUT_SECONDS = 60.0
# Set by the launcher to the checkpoint it has just verified in full, so that every rank does not hash it again.
VERIFIED_CHECKPOINT_ENV = "TRAINSTACK_VERIFIED_CHECKPOINT"
# "0" makes the copy of each batch to the GPU blocking again: for measuring what non-blocking copies are worth.
NON_BLOCKING_COPY_ENV = "TRAINSTACK_NON_BLOCKING_COPY"
NNODES_ENV = "NNODES"  # nodes in the job, for the ranks' run-info series (torchrun sets GROUP_WORLD_SIZE too)
# A folder the agent makes for its ranks' failures, outside the run directory (a full or read-only run directory
# cannot lose a note): each rank that fails leaves its `FailureNote` there, rank-<global rank>.json.
FAILURE_NOTES_ENV = "TRAINSTACK_FAILURE_NOTES"
# A pipe the launcher opens for the agent: the agent writes there the rank that failed first (`FirstFailure`), and
# the launcher prints its line last. A pipe, not a file: a full or read-only disk cannot lose it.
FAILURE_FD_ENV = "TRAINSTACK_FAILURE_FD"
USE_CPU_ENV = "ACCELERATE_USE_CPU"  # "1": Accelerate runs the ranks on the CPU over gloo, even beside a GPU
# "0": CPU ranks start afresh, each with its own interpreter, rather than forked from the agent that has imported
# what they import (train/launcher/forked_ranks.py): for a per-process start-up hook (a sitecustomize) of one's own.
FORK_RANKS_ENV = "TRAINSTACK_FORK_RANKS"
# The PID of the process that started this one and supervises it (launcher -> agent and exporter, agent -> ranks):
# when it is gone, this process stops as on SIGTERM (trainstack/lifetime.py).
SUPERVISOR_PID_ENV = "TRAINSTACK_SUPERVISOR_PID"
# Seconds an orphaned rank or agent has to stop (checkpoint included) before it is killed; default 60.
STOP_GRACE_ENV = "TRAINSTACK_STOP_GRACE"

# ---- ports --------------------------------------------------------------------------------------------------
DEFAULT_EXPORTER_HOST = "127.0.0.1"
DEFAULT_EXPORTER_PORT = 9450
# A folder where each node's launcher writes its exporter as a Prometheus file_sd target (--prometheus-sd-dir).
PROMETHEUS_SD_DIR_ENV = "TRAINSTACK_PROMETHEUS_SD_DIR"
DEFAULT_MASTER_PORT = 29500  # torchrun's default rendezvous port; multi-node jobs need a fixed one


def check_port(flag: str, port: int, zero_means: str | None = None) -> int:
    """`port` when it is a TCP port; else ConfigError. zero_means: what 0 does for this flag (None: 0 is refused)."""
    if not (0 if zero_means else 1) <= port <= 65535:
        hint = f" (or 0 {zero_means})" if zero_means else ""
        raise ConfigError(f"{flag} {port} is not a TCP port: use 1-65535{hint}")
    return port


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now, picked by the OS: the launcher's rendezvous port, the doctor's suggestion,
    the tests' and benchmarks' exporters. Another process may take it before it is bound again."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not bind `host:port` now (None: it could), binding the way it would, never listening or
    connecting. `host` "" is every IPv4 address; an address with a colon is IPv6.

    SO_REUSEADDR, as the servers that open these ports bind (torch's rendezvous store, the exporter): a port whose
    last connections linger in TIME_WAIT (a requeued Slurm segment's, for a minute) is free for them, and only a
    socket bound or listening there takes it. EADDRINUSE says it is taken; EADDRNOTAVAIL or a socket.gaierror that
    `host` is no address of this host; anything else that this user may not open it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:  # a host without IPv6 refuses the socket itself
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        return error
    return None


def exporter_url(host: str = DEFAULT_EXPORTER_HOST, port: int = DEFAULT_EXPORTER_PORT) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def run_environment(run_dir: Path, metrics_dir: Path, run_id: str, launched_at: float, launcher: str) -> dict[str, str]:
    """What a launcher hands the processes of its run (`trainstack train`'s ranks, `trainstack watch`'s command):
    the environment trainstack.monitor records by. launcher: LAUNCHER_TRAIN or LAUNCHER_WATCH."""
    return {
        METRICS_DIR_ENV: str(metrics_dir.resolve()),
        RUN_DIR_ENV: str(run_dir.resolve()),
        RUN_ID_ENV: run_id,
        LAUNCHED_AT_ENV: repr(launched_at),
        LAUNCHER_ENV: launcher,
    }


def new_run_id() -> str:
    """Set TRAINSTACK_RUN_ID (e.g. to the Kubernetes Job uid) to name a multi-node run: its nodes share the run
    directory's lease, and the ranks adopt rank 0's id."""
    return os.environ.get(RUN_ID_ENV) or time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


# ---- the run directory --------------------------------------------------------------------------------------
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
CHECKPOINTS_DIR = "checkpoints"
TELEMETRY_DIR = "telemetry"
GPU_LOG_FILE = "gpu.jsonl"
METRICS_DIR = "metrics"
WATCHED_COMMAND_FILE = "watched-command.json"  # in the metrics folder: what `trainstack watch` runs, for the exporter
LEASE_DIR = "lease"
ENVIRONMENT_DIR = "environment"  # one file per node: what the ranks ran on (trainstack/environment.py)
EXPORTS_DIR = "exports"
HANG_DIR = "hang"  # hang evidence: one folder per stall (trainstack/hang.py)
PREVIOUS_DIR = "previous"
ROLL_CALL_DIR = ".roll-call"  # the doctor's check that every node sees this folder; removed once every node answered
RANK_RECORDS_FILE = re.compile(r"rank-(\d+)\.jsonl")
NODE_FILE = re.compile(r"node-(\d+)\.json")  # one per node: a lease file, an environment
STEP_DIR = re.compile(r"^step-(\d{8})$")  # a sealed checkpoint: complete, verified by its manifest
UNSEALED_PREFIX = ".tmp-"  # a checkpoint being written: `.tmp-step-<N>`, renamed to `step-<N>` once sealed
UNSEALED_GLOB = UNSEALED_PREFIX + "step-*"


def roll_call_marker(folder: Path, node: int, seen: bool = False) -> Path:
    """A node's marker in a roll call's folder (RunDir.roll_call); `seen`: the one that says it saw every node's."""
    return folder / (f"node-{node}.seen" if seen else f"node-{node}")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory. `SHOWN` spells them for messages and help texts (RUN_DIR/...)."""

    path: Path

    @property
    def config(self) -> Path:
        """The resolved configuration the ranks run with (the launcher writes it on node 0)."""
        return self.path / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def report(self) -> Path:
        return self.path / REPORT_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_dir_name(step)

    def unsealed_checkpoint(self, step: int) -> Path:
        return self.checkpoints / (UNSEALED_PREFIX + step_dir_name(step))

    @property
    def telemetry(self) -> Path:
        return self.path / TELEMETRY_DIR

    def rank_records(self, rank: int | str) -> Path:
        """One JSON line per log interval of global rank `rank`, appended over every segment of the run."""
        return self.telemetry / f"rank-{rank}.jsonl"

    def all_rank_records(self) -> dict[int, Path]:
        found = {}
        for path in self.telemetry.glob("rank-*.jsonl"):
            if match := RANK_RECORDS_FILE.fullmatch(path.name):
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    @property
    def gpu_log(self) -> Path:
        """The exporter's NVML snapshots (docs/metrics.md)."""
        return self.telemetry / GPU_LOG_FILE

    def node_metrics(self, node: int | str) -> Path:
        """Node `node`'s ranks' prometheus_client multiprocess files, made fresh by each launch."""
        return self.path / METRICS_DIR / f"node-{node}"

    def all_node_metrics(self) -> list[Path]:
        """Every node's metrics folder the run directory holds: those of each node's latest launch."""
        return sorted((self.path / METRICS_DIR).glob("node-*"))

    def environment(self, node: int | str) -> Path:
        """Node `node`'s environment (trainstack/environment.py), written as each launch starts its ranks."""
        return self.path / ENVIRONMENT_DIR / f"node-{node}.json"

    def environments(self) -> dict[int, Path]:
        found = {}
        for path in (self.path / ENVIRONMENT_DIR).glob("node-*.json"):
            if match := NODE_FILE.fullmatch(path.name):
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def roll_call(self, key: str) -> Path:
        """The folder of one roll call (train/launcher/doctor/slurm_checks.py): the nodes' markers, roll_call_marker.
        `key` (a run id the user may set) becomes one plain name inside ROLL_CALL_DIR, since node 0 removes the
        folder when the call is over: `..`, `/` or a leading dot would reach the run directory or beyond."""
        return self.path / ROLL_CALL_DIR / (re.sub(r"[^A-Za-z0-9._-]", "_", key).lstrip(".") or "_")

    @property
    def lease(self) -> Path:
        return self.path / LEASE_DIR

    def lease_file(self, node: int | str) -> Path:
        return self.lease / f"node-{node}.json"

    def lease_files(self) -> list[Path]:
        return sorted(p for p in self.lease.glob("node-*.json") if NODE_FILE.fullmatch(p.name))

    def lease_run_ids(self) -> set[str]:
        """The run ids the lease's holders name (supervisor/lease.py `Holder`), read without taking the lease: a
        file being written or removed meanwhile is left out."""
        found = set()
        for path in self.lease_files():
            try:
                found.add(str(json.loads(path.read_text())["run_id"]))
            except (OSError, ValueError, TypeError, KeyError):
                continue
        return found

    def lease_is_fresh(self, timeout: float = DEFAULT_LEASE_TIMEOUT_SECONDS) -> bool:
        """Whether a launcher holds the run directory now: a lease file whose heartbeat (its mtime, touched every
        timeout/12 s by supervisor/lease.py) is younger than `timeout`. A killed launcher's file goes stale."""
        now = time.time()
        for path in self.lease_files():
            try:
                if now - path.stat().st_mtime < timeout:
                    return True
            except FileNotFoundError:
                continue
        return False

    def holds_a_run(self) -> bool:
        """Whether anything a launcher or watch writes is here: a summary, a lease, rank records, metrics or hang
        evidence."""
        written = (self.summary, self.lease, self.telemetry, self.path / METRICS_DIR, self.hang)
        return any(path.exists() for path in written)

    @property
    def hang(self) -> Path:
        """Hang evidence: `stall-<n>/` per stall (each rank's stack and Flight Recorder entries, the verdict), and
        `<run id>/fr-rank-<r>`, torch's own Flight Recorder dumps."""
        return self.path / HANG_DIR

    def stall(self, n: int) -> StallDir:
        return StallDir(self.hang / f"stall-{n}")

    def stalls(self) -> list[StallDir]:
        """The stalls evidence was collected for, oldest first."""
        found = [(int(m.group(1)), p) for p in self.hang.glob("stall-*") if (m := STALL_DIR.fullmatch(p.name))]
        return [StallDir(p) for _, p in sorted(found)]

    def fr_dump_prefix(self, run_id: str) -> Path:
        """TORCH_FR_DUMP_TEMP_FILE: torch appends the rank."""
        return self.hang / run_id / "fr-rank-"

    @property
    def exports(self) -> Path:
        return self.path / EXPORTS_DIR

    def previous(self, run_id: str) -> RunDir:
        """Where a fresh start sets aside an earlier attempt's record: the same layout, never deleted."""
        return RunDir(self.path / PREVIOUS_DIR / f"before-{run_id}")

    def set_aside(self, run_id: str, files: Iterable[Path], say: Callable[[str], None]) -> None:
        """A fresh start in a directory that holds an earlier attempt's record: each of `files` (paths in this
        directory) that exists moves to the same place under `previous(run_id)`, and `say` names it."""
        for earlier in files:
            if earlier.is_file():
                name = earlier.relative_to(self.path)
                kept = self.previous(run_id).path / name
                kept.parent.mkdir(parents=True, exist_ok=True)
                os.replace(earlier, kept)
                say(f"fresh start: kept the earlier {name} as {kept}")


SHOWN = RunDir(Path("RUN_DIR"))


STALL_DIR = re.compile(r"stall-(\d+)")
STALL_RANK_FILE = re.compile(r"rank-(\d+)\.(json|py-spy\.txt|faulthandler\.txt)")
HANG_REQUEST_FILE = "hang-request.json"  # in the metrics folder: the launcher asks the ranks for evidence


@dataclass(frozen=True)
class StallDir:
    """One stall's evidence (trainstack/hang.py): per rank its own answer, py-spy's and faulthandler's stacks."""

    path: Path

    def answer(self, rank: int | str) -> Path:
        return self.path / f"rank-{rank}.json"

    def partial_answer(self, rank: int | str) -> Path:
        return self.path / f".rank-{rank}.json.tmp"

    def pyspy(self, rank: int | str) -> Path:
        return self.path / f"rank-{rank}.py-spy.txt"

    def faulthandler(self, rank: int | str) -> Path:
        return self.path / f"rank-{rank}.faulthandler.txt"

    @property
    def collection(self) -> Path:
        return self.path / "collection.json"

    @property
    def verdict(self) -> Path:
        return self.path / "verdict.json"

    def ranks(self) -> set[int]:
        """Every rank some evidence names."""
        return {int(m.group(1)) for p in self.path.glob("rank-*") if (m := STALL_RANK_FILE.fullmatch(p.name))}


def hang_pid_file(metrics_dir: Path, rank: int | str) -> Path:
    """A rank's {"rank", "pid", "faulthandler", "starting"}, in this launch's metrics folder: how the launcher finds
    it, and whether it has reached its loop."""
    return Path(metrics_dir) / f"hang-rank-{rank}.json"


def hang_pid_files(metrics_dir: Path) -> list[Path]:
    return sorted(Path(metrics_dir).glob("hang-rank-*.json"))


def hang_stacks_file(metrics_dir: Path, rank: int | str) -> Path:
    """Where faulthandler writes a rank's stacks on SIGUSR2."""
    return Path(metrics_dir) / f"hang-rank-{rank}.stacks.txt"


def check_run_dir(run_dir: Path, flag: str) -> None:
    """ConfigError, naming `flag`, unless `run_dir` is a folder or can be made one, writable. Writes nothing: it
    runs before the run directory's lease."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{flag} {run_dir} is a file; choose a directory path")
    for existing in (run_dir, *run_dir.parents):
        if existing.exists():
            if not existing.is_dir():
                raise ConfigError(f"{flag} {run_dir}: {existing} is a file; choose another path")
            if not os.access(existing, os.W_OK):
                read_only = os.statvfs(existing).f_flag & os.ST_RDONLY  # root ignores modes, not this
                why = "is on a read-only file system" if read_only else "is not writable"
                raise ConfigError(f"{flag} {run_dir}: {existing} {why}; choose another path")
            break


def check_file_path(path: Path, flag: str) -> None:
    """ConfigError, naming `flag`, unless a file can be written at `path`: not a folder, in a folder that exists and
    is writable. Checked before the work whose result goes there, never after."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file's path")
    if not path.parent.is_dir():
        raise ConfigError(
            f"{flag} {path}: {path.parent} is not an existing directory; create it or choose another path"
        )
    check_run_dir(path.parent, flag)


def read_json_lines(path: Path) -> list[dict]:
    """Every JSON object line of a run's JSON-lines file, in file order (the exporter's GPU log; a rank's records
    read typed through trainstack/record.py). A line a kill cut off is skipped (the next launch ends it first)."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():  # a damaged line is not JSON: skipped
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            lines.append(parsed)
    return lines


@dataclass(frozen=True)
class FailureNote:
    """A failed rank's own account, for its node's agent, which names the rank that failed first.

    Not torchrun's error files: torchrun reads the error file of the first rank it sees exit, and only that one
    when it forks the ranks, but a peer that only lost its connection can exit before the rank that failed, which
    is still tidying up; the agent reads every note in the folder."""

    rank: int  # global
    message: str  # the rank's one line: what went wrong and what to do about it
    exit_code: int  # the code the rank exits with, whether or not it lives to exit
    peer_lost: bool  # it only saw another rank go, or was ended with it: it is not the cause
    time: float  # unix seconds, finer than torchrun's whole seconds: peers follow within one

    def write(self, folder: Path) -> None:
        """Raises WriteFailure where the storage refuses it."""
        write_atomically(folder / f"rank-{self.rank}.json", json.dumps(self.__dict__), "the failure note")

    @classmethod
    def read_all(cls, folder: Path) -> dict[int, FailureNote]:
        """By rank; a note the rank did not finish writing is skipped."""
        notes = {}
        for path in folder.glob("rank-*.json"):
            try:
                note = cls(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            notes[note.rank] = note
        return notes


@dataclass(frozen=True)
class FirstFailure:
    """The rank whose failure ended a launch, as the agent saw it: what the agent writes to FAILURE_FD_ENV's pipe
    (one JSON object) and the launcher reads back."""

    line: str
    """The rank and its error, or its exit code where it left none: the launcher's last line."""
    exit_code: int
    """The code its note gives; where it left none, its exit status as torchrun saw it: -N for a death by signal
    N."""
    noted: bool
    """Whether the rank left its own one-line failure (a `FailureNote`); false for a kill or a crash."""

    def to_json(self) -> str:
        return json.dumps({"line": self.line, "exit_code": self.exit_code, "noted": self.noted})

    @classmethod
    def from_json(cls, text: str) -> FirstFailure | None:
        """None for an empty or unreadable report (an agent killed while it wrote)."""
        try:
            fields = json.loads(text)
            return cls(str(fields["line"]), int(fields["exit_code"]), bool(fields["noted"]))
        except (ValueError, TypeError, KeyError):
            return None


# ---- summary.json -------------------------------------------------------------------------------------------
SUMMARY_VERSION = 1  # summaries written before the field existed are read as version 0: the same keys


class Segment(TypedDict):
    """One launch that trained the run (train/rank/segments.py)."""

    run_id: str
    started: float
    ended: float
    first_step: int
    last_step: int
    samples: int
    tokens: int
    train_seconds: float
    exit_reason: str | None


class Evaluation(TypedDict):
    """One evaluation of a trainstack train run (--eval-every, and the one at its end)."""

    step: int
    loss: float


class Summary(TypedDict, total=False):
    """summary.json, written by global rank 0 when its launch ends (docs/training.md, "Exit codes"); by `trainstack
    watch` when its command ends, with the keys it knows (run_id, launcher, command, exit_code, exit_reason,
    started, wall_seconds, world_size, goodput, time_breakdown, ceilings, verdicts or judged and not_judged, hang)."""

    version: int
    run_id: str
    launcher: str  # LAUNCHER_WATCH in a watched run's summary; absent from trainstack train's
    command: str  # the watched command, as a shell would quote it
    started: float  # Unix time the watched command started
    goodput: float | None  # a watched run's: time_breakdown's goodput, compute over the ranks' wall time
    world_size: int | None  # None in a watched run whose command recorded no ranks
    distributed_type: str
    device: str
    mixed_precision: str
    model: str
    dataset: str
    steps: int
    epochs: int
    initial_loss: float | None
    final_loss: float | None
    eval_loss: float | None
    evaluations: list[Evaluation]  # every evaluation's mean loss, resumed launches' included
    samples_per_second: float | None  # over every segment's training loop, compile time left out
    tokens_per_second: float | None
    compile_seconds: float | None  # None without --compile
    recompiles: int | None
    wall_seconds: float  # this launch
    resumed_from: str | None
    exit_reason: str  # completed, preempted or failed
    exit_code: int
    error: str | None
    segments: list[Segment]
    time_breakdown: dict | None
    """Where each rank's wall time went (trainstack/breakdown.py `run_breakdown`), added by the launcher once every
    rank has exited: each rank's last record line ends its wall time."""
    ceilings: dict[str, dict]
    """Verdict kind -> the speedup its fix can bring at most, from time_breakdown (trainstack/ceilings.py)."""
    verdicts: list[dict]
    """The finished run's verdicts, judged from its records as `trainstack diagnose --json` gives them (kind,
    summary, evidence, fix, ceiling); absent where no rank recorded a step (nothing to judge: `judged` false)."""
    judged: bool
    """Whether any rank was judged; false with `not_judged` saying why (a command without trainstack.monitor), so no
    reader takes an absent or empty `verdicts` for health. A summary older than this key: judged where it has
    `verdicts` (monitoring/diagnose/finished.py `judged_of`)."""
    not_judged: str
    """Why nothing was judged, where `judged` is false."""
    ranks_not_judged: dict[str, str]
    """Rank -> why it was not judged, where others were (a partly instrumented run); absent where every rank was."""
    hang: dict
    """The stall a failed launch ended in, where it ended in one (trainstack/hang_verdict.py `Hang.as_json`: headline,
    evidence, fix, culprits; and `evidence_dir`, its folder under hang/): the end-of-run card's first headline."""


def write_summary(path: Path, summary: Summary) -> None:
    """Atomically: a reader sees the previous summary or this one, never half of it. Raises WriteFailure when the
    storage refuses it, having removed the half-written temporary file."""
    write_atomically(path, json.dumps({"version": SUMMARY_VERSION, **summary}, indent=2) + "\n", "the summary")


def read_summary(path: Path) -> Summary:
    """The summary; {} when there is none (the run is going, or rank 0 died before writing it). ConfigError when
    it is unreadable or written by a newer trainstack."""
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a readable summary ({error}); move it away to start afresh") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path} is not a trainstack summary (not a JSON object); move it away")
    version = summary.setdefault("version", 0)
    if not isinstance(version, int) or version > SUMMARY_VERSION:
        raise ConfigError(
            f"{path} has summary version {version!r}, newer than this trainstack reads "
            f"({SUMMARY_VERSION}); use the trainstack that wrote it"
        )
    for key, value in summary.items():
        expected = _SUMMARY_TYPES.get(key)
        if expected is not None and not _has_type(value, expected):
            raise ConfigError(
                f"{path}: {key!r} is {json.dumps(value)[:40]}, not {_type_name(expected)}: the file was edited or "
                "damaged; move it away to read the run from its rank records alone"
            )
    return cast(Summary, summary)


_SUMMARY_TYPES = typing.get_type_hints(Summary)


def _has_type(value: object, expected: object) -> bool:
    """Whether a JSON value fits the summary's annotation: its containers' and TypedDicts' items too, since the
    readers index into them. JSON has one number type: an int fits a float."""
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is type(None):
        return value is None
    if isinstance(expected, types.UnionType):
        return any(_has_type(value, member) for member in typing.get_args(expected))
    if typing.is_typeddict(expected):
        hints = typing.get_type_hints(expected)
        return isinstance(value, dict) and all(
            key not in value or _has_type(value[key], annotation) for key, annotation in hints.items()
        )
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin is list:
        return isinstance(value, list) and all(_has_type(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_has_type(item, args[1]) for item in value.values())
    return isinstance(value, typing.cast(type, expected))


def _type_name(expected: object) -> str:
    shown = str(expected) if typing.get_args(expected) else getattr(expected, "__name__", str(expected))
    return shown.replace("trainstack.rundir.", "").replace("NoneType", "None")
