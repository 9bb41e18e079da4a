"""One supervised run: what `trainstack train` (commands/train.py) and `trainstack watch` (commands/watch.py) both
do around the process they start, while they hold the run directory's lease (lease.py):

- this node's metrics folder, made afresh; the command sets an earlier record aside;
- the exporter beside the run, supervised (exporter_process.py), stopped when the run ends;
- the child in a session of its own, holding the lease's file: a terminal's signals reach the supervisor alone,
  which passes them on, and the child's flock holds while it may write, even if the supervisor is killed alone;
- polling it: its descendants (trainstack/lifetime.py) and the ranks' progress (hang_watch.py);
- once it has ended, whatever it left running is ended before the lease is let go;
- what summary.json adds from the run's records, with their verdicts (monitoring/diagnose), and the report
  (monitoring/report).

How the signals reach the child and what becomes of its leftovers depend on what the child is: a `Stopping`
policy, `OwnAgent` for trainstack's rank agent, `AnyCommand` for a command that knows nothing of trainstack.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import psutil

from trainstack import ceilings
from trainstack.errors import EXIT_OK, EXIT_RUNTIME, ConfigError, RuntimeFailure
from trainstack.lifetime import Descendants, describe_end, signal_new_children, stop_grace, wait_or_kill
from trainstack.monitoring.diagnose.finished import end_card, judgement
from trainstack.monitoring.report import render_report
from trainstack.rundir import LEASE_FILE_ENV, RunDir, Summary, read_summary
from trainstack.supervisor.exporter_process import SupervisedExporter, exporter_beside_run
from trainstack.supervisor.hang_watch import HangWatch
from trainstack.supervisor.lease import RunDirLease
from trainstack.supervisor.prometheus_sd import FileSdTarget
from trainstack.write_failure import WriteFailure, write_failure

POLL_SECONDS = 0.2

Say = Callable[[str], None]


class Stopping(Protocol):
    """How the signals the supervisor gets reach its child, and what is done with the processes the child leaves
    running once it has ended."""

    def forward(self, child: subprocess.Popen, received: Sequence[int]) -> None:
        """Called at each poll with every signal received so far, in order."""

    def end_leftovers(self, child: subprocess.Popen, left: list[psutil.Process], say: Say) -> None:
        """Called once the child has ended, with what it started that still runs (never empty)."""


class OwnAgent:
    """trainstack's rank agent: whatever the signal, SIGTERM to each of its children (the ranks) once; their loader
    workers are left to their rank. Should the agent die, the ranks see their supervisor gone and stop as on
    SIGTERM within the grace period (trainstack/lifetime.py): they are waited for, then killed."""

    def __init__(self, say: Say) -> None:
        self.signalled: set[int] = set()
        self.say = say
        self.told = False

    def forward(self, child: subprocess.Popen, received: Sequence[int]) -> None:
        if received:
            if not self.told:  # at once: the ranks stop at a step's end, which may be minutes away on a slow device
                self.told = True
                self.say(
                    f"{signal.Signals(received[0]).name} received: the ranks stop after their next log interval, "
                    "save a checkpoint and exit"
                )
            signal_new_children(psutil.Process(child.pid), signal.SIGTERM, self.signalled)

    def end_leftovers(self, child: subprocess.Popen, left: list[psutil.Process], say: Say) -> None:
        grace = stop_grace()
        if child.returncode < 0:  # an agent that returned waited for its ranks: at most a loader worker is left
            say(
                f"the rank agent (PID {child.pid}) {describe_end(child.returncode)} while {len(left)} of its "
                f"processes ran; waiting up to {grace:g} s for the ranks to save a checkpoint and exit"
            )
        wait_or_kill(left, grace + 10, say)  # the ranks' own deadline comes first


class AnyCommand:
    """A command that knows nothing of trainstack: each signal passes on as it came, SIGINT to the command's whole
    process group, as a terminal's Ctrl-C would have without the supervisor in between, the others to the command
    alone, as `docker stop` or `kill` would (torchrun passes them to its workers). What it leaves running (its
    loader workers, a killed torchrun's ranks) has OWN_EXIT_SECONDS to end by itself (Lightning's rank 0, the
    command, does not wait for the ranks it started, which may still be closing), then is stopped as a container's
    processes are when its main one exits: SIGTERM, the grace period, SIGKILL."""

    OWN_EXIT_SECONDS = 5.0

    def __init__(self) -> None:
        self.forwarded = 0  # how many of the signals received the command has been sent

    def forward(self, child: subprocess.Popen, received: Sequence[int]) -> None:
        for signum in received[self.forwarded :]:
            try:
                if signum == signal.SIGINT:
                    os.killpg(child.pid, signum)
                else:
                    child.send_signal(signum)
            except ProcessLookupError:
                pass  # it ended meanwhile: the loop sees that next
            self.forwarded += 1

    def end_leftovers(self, child: subprocess.Popen, left: list[psutil.Process], say: Say) -> None:
        _, left = psutil.wait_procs(left, timeout=self.OWN_EXIT_SECONDS)
        if not left:
            return
        grace = stop_grace()
        say(
            f"{len(left)} process(es) the command started still run {self.OWN_EXIT_SECONDS:g} s after it ended; "
            f"SIGTERM to them, SIGKILL after {grace:g} s"
        )
        for process in left:
            try:
                process.terminate()
            except psutil.NoSuchProcess:
                pass
        wait_or_kill(left, grace, say)


class SupervisedRun:
    """One child of a run, under this node's lease: its metrics folder, the exporter beside it, the signals the
    supervisor gets (`on_signal`, `received`), its polling and its leftovers."""

    def __init__(
        self,
        run_dir: RunDir,
        node_rank: int,
        lease: RunDirLease | None,
        stopping: Stopping,
        say: Say,
        collective_timeout: float | None = None,
    ):
        self.run_dir, self.lease, self.stopping, self.say = run_dir, lease, stopping, say
        # Per node: prometheus_client names files by PID, which repeats across pods on a shared volume, and each
        # node's exporter must serve only its own ranks.
        self.metrics_dir = run_dir.node_metrics(node_rank)
        self.collective_timeout = collective_timeout  # the stall that collects hang evidence comes before it
        self.received: list[int] = []  # the signals the supervisor got while `on_signal` handled them, in order
        self.exporter: SupervisedExporter | None = None
        self.child: subprocess.Popen | None = None
        self.processes: Descendants | None = None
        self.hangs: HangWatch | None = None

    def fresh_metrics_dir(self, own_files: Callable[[], None], not_done: Callable[[], str]) -> None:
        """Metrics belong to one run: an earlier run's series must never show up in this one. Telemetry belongs to
        the run, which may append to it. Only this node's files are touched: on a shared volume the other nodes are
        writing theirs. `own_files()` then writes what the command itself prepares (an earlier record set aside);
        a write the storage refuses is one line, ending with `not_done()`."""
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        try:
            self.metrics_dir.mkdir(parents=True)
            self.run_dir.telemetry.mkdir(exist_ok=True)
            own_files()
        except OSError as error:
            failure = write_failure(error, "the run directory", self.run_dir.path)
            if failure is None:
                raise
            raise RuntimeFailure(f"{failure}; {not_done()}") from None

    def on_signal(self, signum, frame) -> None:
        self.received.append(signum)

    @contextmanager
    def catching(self, signums: Iterable[int]) -> Iterator[None]:
        """`signums` go to `on_signal` inside; the handlers before are back after."""
        previous = {signum: signal.signal(signum, self.on_signal) for signum in signums}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextmanager
    def exporter_beside(
        self, host: str, port: int, nvml_module: str | None = None, discovery: FileSdTarget | None = None
    ) -> Iterator[None]:
        """The exporter serves this node's metrics inside (none for port 0), and is stopped after; `discovery`, its
        Prometheus target file, is written once it serves and removed as it stops."""
        if port:
            self.exporter = exporter_beside_run(
                self.metrics_dir, self.run_dir.path, host, port, self.say, nvml_module, discovery
            )
            self.exporter.start()
        try:
            yield
        finally:
            if self.exporter:
                self.exporter.stop()

    def start(self, command: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        """The child, in its own session, holding the lease's file besides `pass_fds`."""
        lease_fd = (self.lease.fd,) if self.lease and self.lease.fd else ()
        if self.lease:
            env = {**env, LEASE_FILE_ENV: str(self.lease.path)}
        self.child = subprocess.Popen(command, env=env, start_new_session=True, pass_fds=(*pass_fds, *lease_fd))
        # Should the child die, what it started is found here.
        self.processes = Descendants(self.child.pid)

    def wait(self, each_poll: Callable[[Descendants], None] = lambda processes: None) -> int:
        """Polls the child until it ends, passing signals on and watching for a hang; its returncode."""
        assert self.child is not None and self.processes is not None, "start() comes first"
        self.hangs = HangWatch(self.run_dir, self.metrics_dir, self.say, self.collective_timeout)
        watching_for_hangs = True
        while self.child.poll() is None:
            self.stopping.forward(self.child, self.received)
            self.processes.look()
            if watching_for_hangs:
                watching_for_hangs = self._poll_hangs()
            each_poll(self.processes)
            time.sleep(POLL_SECONDS)
        return self.child.returncode

    def _poll_hangs(self) -> bool:
        """Whether to go on watching: hang evidence serves the run and must never end it (this loop is what passes
        signals on and keeps the ranks' launcher alive), so a watch that fails says so in one line and stops."""
        assert self.hangs is not None
        try:
            self.hangs.poll()
        except Exception as error:  # noqa: BLE001 - any failure of the watch, whatever its cause
            self.say(f"hang evidence off for the rest of this run: the watch failed ({type(error).__name__}: {error})")
            return False
        return True

    def end_leftovers(self) -> None:
        """What the ended child started and left running ends too (as `stopping` says): the lease is held until it
        has, for those processes may still write the run directory."""
        assert self.child is not None and self.processes is not None, "start() comes first"
        left = self.processes.left_running()
        if left:
            self.stopping.end_leftovers(self.child, left, self.say)

    def hang_line(self) -> str | None:
        """The last stall's verdict as one line, if the run stalled."""
        return self.hangs.last_line() if self.hangs else None

    def ended_in_hang(self, code: int) -> dict | None:
        """summary.json's `hang`: the verdict of the stall a run that failed (`code`) ended in, and where its evidence
        is; None where it ended otherwise."""
        return self.hangs.last_json() if self.hangs and code else None


def findings(run_dir: Path, times: dict | None, launcher: str, hang: dict | None = None) -> Summary:
    """What summary.json says of a finished run from its records: where each rank's time went (`times`,
    trainstack/breakdown.py), the most each fix can gain, and the verdicts diagnose gives them, where any rank
    recorded something to judge; else `judged` false and why (never an empty list, which reads healthy). `launcher`
    (rundir.LAUNCHER_TRAIN or _WATCH): whose words the fixes are in. `hang`: the stall the run ended in
    (`SupervisedRun.ended_in_hang`), which heads its card."""
    return {
        "time_breakdown": times,
        **({"ceilings": ceilings.as_json(ceilings.of_run(run_dir, times))} if times else {}),
        **judgement(run_dir, launcher).summary_keys(),
        **({"hang": hang} if hang else {}),
    }


def print_card(run_dir: Path, program: str, report: Path | None, summary: Mapping | None = None) -> None:
    """The verdict on the terminal when the run ends, from summary.json as written (render.card): the first line
    names the program, the others are indented under it, and the report's place closes it. Bold kinds on a
    terminal only: a log file gets plain text. Never fails the run: a summary it cannot read is one line. `summary`:
    this launch's summary.json where the caller knows it ({} where this launch wrote none), else the file's."""
    try:
        lines = end_card(run_dir, read_summary(RunDir(run_dir).summary) if summary is None else summary)
    except (ConfigError, OSError, KeyError, TypeError, ValueError) as problem:  # a summary edited or cut short
        print(f"{program}: no verdict: {type(problem).__name__}: {problem}", file=sys.stderr)
        return
    bold = sys.stderr.isatty() and os.environ.get("NO_COLOR") is None
    for line in lines:
        if line.startswith(" "):  # a detail, indented under its headline
            print(line, file=sys.stderr)
            continue
        if bold:  # a headline: its kind (INPUT-BOUND, HEALTHY, NOT JUDGED) stands out
            kind, _, rest = line.partition("  ")
            line = f"\033[1m{kind}\033[0m  {rest}"
        print(f"{program}: {line}", file=sys.stderr)
    if report is not None:
        print(f"{program}: report: {report}", file=sys.stderr)


def nothing_kept(run_dir: Path) -> str:
    return ""


def write_report(
    run_dir: Path, program: str, kept: Callable[[Path], str] = nothing_kept, summary: Mapping | None = None
) -> int:
    """Writes the run's report, then the end-of-run card (`print_card`), closed by the report's place. Returns
    EXIT_RUNTIME when the storage refused it (one line said so, ending with `kept(run_dir)`: what is safe
    regardless), else EXIT_OK."""
    try:
        print_card(run_dir, program, render_report(run_dir), summary)
    except ConfigError as problem:
        print(f"{program}: warning: no report: {problem}", file=sys.stderr)
    except WriteFailure as failure:
        # Not "rerun the same command": after a completed run it does nothing, the report command writes it.
        print(
            f"{program}: error: {failure}, then `trainstack report {run_dir}` writes it{kept(run_dir)}",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    return EXIT_OK
