"""`trainstack watch [options] -- COMMAND...`: any training command (`python train.py`, `torchrun ...`,
`accelerate launch ...`) run as a trainstack run: a run directory under its lease, the exporter beside it, the
environment trainstack.monitor records by, and the report when it ends.

The command runs supervised as `trainstack train` runs its ranks (supervisor/supervised.py): in a session of its
own, so a terminal's Ctrl-C reaches watch alone, which passes it on, and whatever the command leaves behind is found and ended
before the run directory is let go. Watch exits with the command's exit code (a death by signal N as 128 + N, as a
shell reports it); its own failures are trainstack's codes, each with one `trainstack watch: error:` line
(docs/training.md, "Exit codes").
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from trainstack import breakdown, environment
from trainstack.auto import instrumented_environment
from trainstack.errors import EXIT_OK, EXIT_RUNTIME, ConfigError
from trainstack.hang import hang_environment
from trainstack.lifetime import Descendants, describe_end, stop_grace
from trainstack.rundir import (
    DEFAULT_LOG_EVERY,
    INSTRUMENT_HINT,
    LAUNCHER_WATCH,
    LOG_EVERY_ENV,
    RUN_ID_ENV,
    SHOWN,
    SUPERVISOR_PID_ENV,
    WATCH_HINT_SECONDS_ENV,
    WATCHED_COMMAND_FILE,
    RunDir,
    Summary,
    bind_error,
    check_port,
    check_run_dir,
    new_run_id,
    run_environment,
    write_summary,
)
from trainstack.slurm import SlurmWorld
from trainstack.supervisor.lease import RunDirLease, lease_timeout
from trainstack.supervisor.prometheus_sd import FileSdTarget, file_sd_target
from trainstack.supervisor.supervised import AnyCommand, SupervisedRun, findings, print_card, write_report
from trainstack.train.launcher.launch_config import (
    add_beside_run_arguments,
    exporter_port,
    lease_wait,
    node_rank_of,
    prometheus_sd_dir,
)
from trainstack.train.rank import checkpoint
from trainstack.write_failure import WriteFailure, write_atomically

PROGRAM = "trainstack watch"
DEFAULT_RUN_DIR = Path("runs/watch")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # to the command, each as it came (supervised.AnyCommand)
DEFAULT_HINT_SECONDS = 60.0  # longer than a model build and a rendezvous take: a rank's monitor records at start


def hint_seconds() -> float:
    """How long the command may run without a rank record before watch says it is not instrumented."""
    raw = os.environ.get(WATCH_HINT_SECONDS_ENV)
    try:
        seconds = float(raw) if raw else DEFAULT_HINT_SECONDS
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"{WATCH_HINT_SECONDS_ENV}={raw!r} must be a number of seconds, 0 or more")
    return seconds


def say(line: str) -> None:
    print(f"{PROGRAM}: {line}", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help=f"run directory: the command's telemetry, GPU snapshots and report (default: {DEFAULT_RUN_DIR})",
    )
    parser.add_argument(
        "--node-rank",
        type=int,
        help="this node's rank, for a command that spans nodes (env NODE_RANK, PET_NODE_RANK or "
        "JOB_COMPLETION_INDEX, else SLURM_NODEID in a Slurm job; default 0): each node holds its own lease file "
        "and metrics folder, node 0 writes the report",
    )
    parser.add_argument(
        "--nvml-module",
        help="the exporter's NVML module (default pynvml); trainstack.monitoring.nvml_fake is a fake "
        "host for trying it without a GPU (NVML_FAKE_HOST names the host)",
    )
    parser.add_argument(
        "--auto",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="instrument the command's ranks with no line of it changed (default: on); --no-auto leaves them as "
        "they are: only what the script's own trainstack.monitor lines record is seen",
    )
    parser.add_argument(
        "--log-every",
        type=int,
        default=DEFAULT_LOG_EVERY,
        metavar="STEPS",
        help=f"optimizer steps in each rank's record (default: {DEFAULT_LOG_EVERY}): fewer where steps are slow, so "
        "that diagnose has evidence sooner; a script's own trainstack.monitor.start(log_every=...) keeps its own",
    )
    add_beside_run_arguments(parser)
    parser.add_argument(
        "watched",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command to run, e.g. -- torchrun --nproc-per-node 8 train.py",
    )


def command_of(args: argparse.Namespace) -> list[str]:
    """The command after `--`, checked to be one that can start: a missing one is refused before anything is
    written."""
    command = args.watched[1:] if args.watched[:1] == ["--"] else args.watched
    if not command:
        raise ConfigError("no command to watch: put it after --, e.g. `trainstack watch -- python train.py`")
    program = command[0]
    if shutil.which(program) is None:
        if os.sep in program and os.path.isfile(program):
            raise ConfigError(
                f"{program} is not executable: chmod +x it, or name its interpreter "
                f"(`trainstack watch -- python {program}`)"
            )
        where = "does not exist" if os.sep in program else "is not on PATH"
        raise ConfigError(f"command not found: {program} {where}; check its spelling, or install it")
    return command


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def stopped_before_start(signum: int) -> int:
    """The status for a signal that came before the command started: the one the command would have had."""
    say(f"stopped by {signal.Signals(signum).name} before the command started")
    return 128 + signum


def _stop_before_start(signum, frame) -> None:
    """A signal while waiting for the lease: leave at once."""
    raise SystemExit(stopped_before_start(signum))


class CommandState:
    """What the watched command is and how many of its processes run, in its node's metrics folder
    (rundir.WATCHED_COMMAND_FILE), rewritten whole when the count changes: the exporter serves it (catalog.WATCH_*),
    so diagnose tells a command that runs without instrumentation from no run at all."""

    def __init__(self, metrics_dir: Path, command: list[str], run_id: str):
        self._path = metrics_dir / WATCHED_COMMAND_FILE
        self._state: dict[str, object] = {"command": shlex.join(command), "run_id": run_id, "processes": None}

    def running(self, processes: int) -> None:
        """The command's processes running now (written when the count changes)."""
        if processes != self._state["processes"]:
            self._state["processes"] = processes
            try:
                write_atomically(self._path, json.dumps(self._state), "the watched command's state")
            except WriteFailure as failure:  # the command runs on; only diagnose's view of it is stale
                say(f"warning: {failure}")


class InstrumentationHint:
    """Says once, `hint_seconds()` after the command started, that it is not instrumented when no rank of it has
    started records by then: only its GPUs are seen. With the automatic instrumentation on, what it did not find."""

    def __init__(self, run_dir: RunDir, started_at: float, auto: bool):
        self.run_dir, self.started_at = run_dir, started_at
        self._at: float | None = time.monotonic() + hint_seconds()
        self._how = (
            "the automatic instrumentation has found no DDP or FSDP model, Lightning or transformers Trainer in "
            "them yet; add `import trainstack.monitor` to a loop it does not see (docs/monitor-your-training.md)"
            if auto
            else INSTRUMENT_HINT
        )

    def poll(self) -> None:
        if self._at is not None and time.monotonic() >= self._at:
            self._at = None
            if not self._ranks_recorded():
                say(
                    f"uninstrumented: the command runs, but no rank has started records "
                    f"({SHOWN.rank_records('<r>')}), so only its GPUs are seen; {self._how}"
                )

    def _ranks_recorded(self) -> bool:
        """Whether a rank of this command has started its records (trainstack.monitor does at `start`)."""
        try:
            return any(path.stat().st_mtime >= self.started_at for path in self.run_dir.all_rank_records().values())
        except OSError:
            return False


class Watch:
    """One run of the command; `run()` returns its exit status. The signals watch gets from the moment the lease
    is held go through `supervised.on_signal`: to the command while it runs, ignored after (the report takes
    seconds)."""

    def __init__(
        self,
        command: list[str],
        args: argparse.Namespace,
        run_dir: RunDir,
        node_rank: int,
        run_id: str,
        lease: RunDirLease | None,
        exporter_port: int,
        discovery: FileSdTarget | None = None,
    ):
        self.command, self.args, self.run_dir = command, args, run_dir
        self.node_rank, self.run_id = node_rank, run_id
        self.exporter_port, self.discovery = exporter_port, discovery
        self.supervised = SupervisedRun(run_dir, node_rank, lease, AnyCommand(), say)
        self.started_at: float | None = None  # Unix time the command started
        self.ended_at: float | None = None

    def prepare_run_dir(self) -> None:
        """This node's fresh metrics folder (SupervisedRun.fresh_metrics_dir); a fresh record too, unless
        TRAINSTACK_RUN_ID names the run (a job's pods, a restarted pod included, share it): then this node appends
        to the run's record."""

        def own_files() -> None:
            if self.node_rank == 0 and not os.environ.get(RUN_ID_ENV):
                earlier = [
                    *self.run_dir.all_rank_records().values(),
                    *self.run_dir.environments().values(),
                    self.run_dir.gpu_log,
                    self.run_dir.summary,
                    self.run_dir.report,
                ]
                self.run_dir.set_aside(self.run_id, earlier, say)
            environment.write(self.run_dir.environment(self.node_rank), self.command_environment())

        self.supervised.fresh_metrics_dir(own_files, lambda: "the command was not started")

    def command_environment(self) -> dict[str, str]:
        # Not the supervisor's PID: it names a process's parent, and the command's own processes (torchrun's
        # workers) are not watch's children; trainstack code in them would take watch for gone.
        env = {name: value for name, value in os.environ.items() if name != SUPERVISOR_PID_ENV}
        metrics_dir = self.supervised.metrics_dir
        env = {**env, **run_environment(self.run_dir.path, metrics_dir, self.run_id, time.time(), LAUNCHER_WATCH)}
        env = {**env, **hang_environment(self.run_dir.path, self.run_id, env), LOG_EVERY_ENV: str(self.args.log_every)}
        return instrumented_environment(env) if self.args.auto else env

    def run(self) -> int:
        self.prepare_run_dir()
        supervised = self.supervised
        series = CommandState(supervised.metrics_dir, self.command, self.run_id)
        with supervised.exporter_beside(
            self.args.exporter_host, self.exporter_port, self.args.nvml_module, self.discovery
        ):
            if supervised.received:  # while the exporter started
                return stopped_before_start(supervised.received[0])
            say(f"run {self.run_id} in {self.run_dir.path}: {shlex.join(self.command)}")
            self.started_at = time.time()
            self.start()
            hint = InstrumentationHint(self.run_dir, self.started_at, self.args.auto)

            def each_poll(processes: Descendants) -> None:
                series.running(1 + len(processes.running()))
                hint.poll()

            returncode = supervised.wait(each_poll)
            self.ended_at = time.time()
            say(f"the command {describe_end(returncode)}")
            assert supervised.processes is not None, "start() comes first"
            series.running(len(supervised.processes.running()))
            if (hang := supervised.hang_line()) and returncode:
                say(f"it ended in a hang: {hang}")
            supervised.end_leftovers()
            series.running(0)
            return exit_status(returncode)

    def summary(self, code: int) -> Summary:
        """summary.json of the watched run, as `trainstack train` writes its own (rundir.Summary): the command, its
        exit, its duration, and where each rank's time went when the command's loop recorded ranks."""
        assert self.started_at is not None and self.ended_at is not None, "run() comes first"
        times = breakdown.of_run(self.run_dir.path)
        signalled = bool(self.supervised.received)  # a signal passed on (FORWARDED) stopped it
        return {
            "run_id": self.run_id,
            "launcher": LAUNCHER_WATCH,
            "command": shlex.join(self.command),
            "exit_code": code,
            "exit_reason": "completed" if code == 0 else "preempted" if signalled else "failed",
            "started": self.started_at,
            "wall_seconds": self.ended_at - self.started_at,
            "world_size": len(times["ranks"]) if times else None,
            "goodput": times["goodput"] if times else None,
            **findings(self.run_dir.path, times, LAUNCHER_WATCH, self.supervised.ended_in_hang(code)),
        }

    def write_summary(self, code: int) -> int:
        """RUN_DIR/summary.json, atomically; EXIT_RUNTIME (one line said why) when the storage refused it."""
        try:
            write_summary(self.run_dir.summary, self.summary(code))
        except WriteFailure as failure:
            print(f"{PROGRAM}: error: no summary: {failure}", file=sys.stderr)
            return EXIT_RUNTIME
        return EXIT_OK

    def start(self) -> None:
        """The command, supervised (SupervisedRun.start)."""
        try:
            self.supervised.start(self.command, self.command_environment())
        except OSError as error:  # found and executable, yet the kernel refused it (no #! line, a bad binary)
            raise ConfigError(f"{self.command[0]} cannot be started: {error.strerror}") from None


def check_exporter_beside(host: str, nvml_module: str | None) -> None:
    """What the exporter would fail on at every restart, refused before the command starts: an --exporter-host that
    is no address of this host, an --nvml-module that cannot be found. (A taken port is waited out, with retries.)"""
    error = bind_error(host, 0)
    if isinstance(error, socket.gaierror) or (error is not None and error.errno == errno.EADDRNOTAVAIL):
        raise ConfigError(
            f"--exporter-host {host} is not an address of this host: pass one of its addresses, or 0.0.0.0 for all"
        )
    try:
        found = nvml_module is None or importlib.util.find_spec(nvml_module) is not None
    except (ImportError, ValueError):  # a parent package that does not import
        found = False
    if not found:
        raise ConfigError(f"--nvml-module {nvml_module} cannot be found; check the module's name and PYTHONPATH")


def run(args: argparse.Namespace) -> int:
    """The watched run; then, with --report on node 0, the report while the lease is still held."""
    command = command_of(args)
    check_run_dir(args.run_dir, "--run-dir")
    if checkpoint.complete_checkpoints(RunDir(args.run_dir).checkpoints):
        raise ConfigError(
            f"--run-dir {args.run_dir} holds a trainstack train run's checkpoints: watching a command there would "
            "set that run's record aside, and its next resume would write over the watched run's summary; choose "
            "another --run-dir"
        )
    wait, timeout = lease_wait(args), lease_timeout(args.lease_timeout)
    slurm = SlurmWorld.from_environ(os.environ)  # None under torchrun, whose world wins
    node_rank = node_rank_of(args, slurm)
    if node_rank < 0:
        raise ConfigError(f"--node-rank must be 0 or more, got {node_rank}")
    if args.log_every < 1:
        raise ConfigError(f"--log-every must be at least 1 step, got {args.log_every}")
    port = check_port("--exporter-port", exporter_port(args, slurm, node_rank), zero_means="to run no exporter")
    if port:
        check_exporter_beside(args.exporter_host, args.nvml_module)
    stop_grace()  # a bad TRAINSTACK_STOP_GRACE is refused now, not once the command has left processes behind
    hint_seconds()
    run_id = new_run_id()
    discovery = file_sd_target(
        prometheus_sd_dir(args),
        run_id,
        node_rank,
        args.exporter_host,
        port,
        slurm,
        lambda line: say(f"warning: {line}"),
    )
    previous = {signum: signal.signal(signum, _stop_before_start) for signum in FORWARDED}
    try:
        with RunDirLease(args.run_dir, run_id, node_rank, timeout, say=say, dir_flag="--run-dir") as lease:
            lease.acquire(wait=wait)
            watch = Watch(command, args, RunDir(args.run_dir), node_rank, run_id, lease, port, discovery)
            for signum in FORWARDED:
                signal.signal(signum, watch.supervised.on_signal)
            code = watch.run()
            if node_rank == 0 and watch.started_at is not None:
                written = watch.write_summary(code)
                code = code or written  # a summary the disk refused fails a command that succeeded
            if args.report and node_rank == 0:
                report = write_report(args.run_dir, PROGRAM)
                code = code or report  # a report the disk refused fails a command that succeeded
            elif node_rank == 0 and watch.started_at is not None:
                print_card(args.run_dir, PROGRAM, None)
            return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
