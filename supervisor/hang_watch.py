"""The supervisor's half of hang evidence (docs/diagnostics.md, "When a run hangs"): the loop of a supervised run
(supervised.py: `trainstack train`'s launcher, `trainstack watch`) calls `HangWatch.poll()`. When no rank has
stepped for the threshold (from the run's own step times, trainstack/thresholds.py HANG_*; before the first step,
their ceiling, counted from the latest rank's arrival; while trainstack's own ranks are still starting, loading
data or building the model before their loops, half the collective timeout), it collects, once per stall
and in a thread of its own so the loop goes on forwarding signals, into a fresh RUN_DIR/hang/stall-<n>/:
- each rank's Python stack: `py-spy dump` when installed and permitted (it needs ptrace: root or CAP_SYS_PTRACE),
  the rank's own answer (trainstack/hang.py), and faulthandler's (SIGUSR2) for a rank that does not answer;
- each rank's Flight Recorder entries (the rank's own answer);
- collection.json (ranks, pids, steps, alive) and verdict.json (trainstack/hang_verdict.py);
then prints the verdict as one line. Nothing is killed; a rank that steps again ends the stall.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainstack import thresholds
from trainstack.hang import HANG_SECONDS_ENV, PYSPY_ENV, STACK_SIGNAL
from trainstack.hang_verdict import Hang, analyze
from trainstack.rundir import HANG_REQUEST_FILE, RunDir, StallDir, hang_pid_files, hang_stacks_file

CHECK_SECONDS = 1.0  # how often progress is read (a scrape of the metrics files)
ANSWER_SECONDS = 5.0  # how long the ranks' own answers are waited for before faulthandler is asked


def steps_by_rank(metrics_dir: Path) -> dict[str, float]:
    """rank -> steps, from the ranks' multiprocess files."""
    from trainstack.metric_files import progress_by_rank  # not at the top: see catalog.rank_metric

    return {rank: progress[0] for rank, progress in progress_by_rank(metrics_dir).items()}


def hang_seconds(
    step_seconds: list[float], before: float | None = None, first_step: bool = False, starting: bool = False
) -> float:
    """The stall that collects evidence: TRAINSTACK_HANG_SECONDS, else HANG_STEP_MULTIPLE x the median step,
    within [HANG_FLOOR, HANG_CEILING], and at most half of `before` (the collective timeout, which ends the run:
    the evidence must come first). While the first step is awaited (`first_step`), HANG_CEILING: no step time says
    how long it may take, and a compile or a cold cache can take minutes. While a rank is still `starting` (before
    its loop), half the collective timeout whatever TRAINSTACK_HANG_SECONDS says: a threshold set from steps says
    nothing of loading data or building a model, the timeout is the deadline of the ranks that wait for it, and a user
    who raised it to give a long start-up room has said how long a start-up may take."""
    if starting:
        return before / 2 if before else thresholds.HANG_CEILING.value
    if given := os.environ.get(HANG_SECONDS_ENV):
        return float(given)
    if first_step:
        seconds = thresholds.HANG_CEILING.value
    else:
        median = statistics.median(step_seconds) if step_seconds else 0.0
        seconds = min(
            max(thresholds.HANG_STEP_MULTIPLE.value * median, thresholds.HANG_FLOOR.value),
            thresholds.HANG_CEILING.value,
        )
    return min(seconds, before / 2) if before else seconds


@dataclass(frozen=True)
class Registrations:
    """What the ranks' pid files say now: each rank's pid, the ranks with faulthandler on SIGUSR2 (only they may
    be sent it) and those that answer but have not reached their loops."""

    pids: dict[str, int]
    faulthandler: frozenset[str] = frozenset()
    starting: frozenset[str] = frozenset()


def read_registrations(metrics_dir: Path) -> Registrations:
    pids, faulthandler, starting = {}, set(), set()
    for path in hang_pid_files(metrics_dir):
        try:
            record = json.loads(path.read_text())
            rank, pid = str(record["rank"]), int(record["pid"])
        except (OSError, ValueError, KeyError):
            continue
        pids[rank] = pid
        if record.get("faulthandler"):
            faulthandler.add(rank)
        if record.get("starting"):
            starting.add(rank)
    return Registrations(pids, frozenset(faulthandler), frozenset(starting))


class HangWatch:
    def __init__(self, run_dir: RunDir, metrics_dir: Path, say: Callable[[str], None], before: float | None = None):
        self.run_dir, self.metrics_dir, self.say, self.before = run_dir, Path(metrics_dir), say, before
        self.last_check = 0.0
        self.last_steps: dict[str, float] = {}
        self.last_change = time.time()
        self.step_seconds: list[float] = []
        self.collected_at_steps: float | None = None  # total steps when this stall was collected
        self.thread: threading.Thread | None = None
        self.verdict: Hang | None = None
        self.stall_dir: Path | None = None
        self.starting: frozenset[str] = frozenset()  # before the first step: the ranks not yet in their loops

    def poll(self) -> None:
        now = time.time()
        if now - self.last_check < CHECK_SECONDS or (self.thread and self.thread.is_alive()):
            return
        self.last_check = now
        try:
            steps = steps_by_rank(self.metrics_dir)
        except (OSError, ValueError, RuntimeError, struct.error):  # a file read mid-write: the next poll reads it
            return
        first_step = not steps or max(steps.values()) < 1
        arrived = False
        if first_step:
            # Before the first step the wait counts from the latest rank's arrival (its responder registered) or
            # move into its loop, so a rank that never arrives leaves the ones that did waiting, with evidence.
            registrations = self.registrations()
            steps = dict.fromkeys(registrations.pids, 0.0)
            if not steps:
                return
            arrived = registrations.starting != self.starting  # a rank reached its loop: progress too
            self.starting = registrations.starting
        if steps != self.last_steps or arrived:
            changed = [r for r in steps if steps[r] > self.last_steps.get(r, 0)]
            if any(self.last_steps.values()) and changed:  # the first step's time (start-up, a compile) is no step's
                for rank in changed:
                    done = steps[rank] - self.last_steps.get(rank, 0)
                    self.step_seconds.append((now - self.last_change) / done)
                self.step_seconds = self.step_seconds[-200:]
            self.last_steps, self.last_change = steps, now
            if self.collected_at_steps is not None and (arrived or sum(steps.values()) > self.collected_at_steps):
                self.collected_at_steps = self.verdict = None  # a rank moved on: that stall is over
            return
        if self.collected_at_steps is not None:
            return
        starting = first_step and bool(self.starting)
        if now - self.last_change < hang_seconds(self.step_seconds, self.before, first_step, starting):
            return
        self.collected_at_steps = sum(steps.values())
        self.thread = threading.Thread(
            target=self.collect, args=(steps, now - self.last_change), name="trainstack-hang-collect", daemon=True
        )
        self.thread.start()

    def last_line(self) -> str | None:
        """The verdict of the stall the run ended in, for the launcher's last line; None if it did not end in one."""
        found = self.last_json()
        return f"{found['headline']} (evidence: {found['evidence_dir']})" if found else None

    def last_json(self) -> dict | None:
        """The verdict as summary.json keeps it: `Hang.as_json` and the folder of its evidence."""
        self.wait()
        if self.verdict is None:
            return None
        return {**self.verdict.as_json(), "evidence_dir": str(self.stall_dir)}

    def wait(self, timeout: float = 30.0) -> None:
        """Let a collection under way finish (the run ended meanwhile: its verdict is still wanted)."""
        if self.thread:
            self.thread.join(timeout)

    def new_stall_dir(self) -> Path:
        self.run_dir.hang.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:
            candidate = self.run_dir.stall(n).path
            try:
                candidate.mkdir()  # never reuses a folder: an earlier stall's evidence is kept
                return candidate
            except FileExistsError:
                n += 1

    def collect(self, steps: dict[str, float], quiet: float) -> None:
        try:
            self.verdict = self._collect(steps, quiet)
        except OSError as error:
            self.say(f"hang: no step for {quiet:.0f} s; no evidence collected: {error}")

    def _collect(self, steps: dict[str, float], quiet: float) -> Hang:
        stall = self.new_stall_dir()
        self.stall_dir = stall
        registrations = self.registrations()
        pids = registrations.pids
        if any(steps.values()):
            waited = "no rank has stepped"
        elif registrations.starting:
            starting = sorted(registrations.starting, key=int)
            waited = f"{'rank' if len(starting) == 1 else 'ranks'} {', '.join(starting)} still starting, no progress"
        else:
            waited = "no rank has made its first step"
        self.say(f"hang: {waited} for {quiet:.0f} s; collecting each rank's stack and collectives into {stall}")
        ranks = {
            rank: {
                "steps": steps.get(rank),
                "pid": pids.get(rank),
                "alive": _alive(pids.get(rank)),
                "starting": rank in registrations.starting,
            }
            for rank in sorted({*steps, *pids}, key=int)
        }
        stack_note = self.pyspy(stall, pids)
        request = self.metrics_dir / HANG_REQUEST_FILE
        partial = self.metrics_dir / (HANG_REQUEST_FILE + ".tmp")
        partial.write_text(json.dumps({"dir": str(stall), "time": time.time()}))
        os.replace(partial, request)  # the metrics folder is this launch's own scratch space, not the record
        deadline = time.time() + ANSWER_SECONDS
        live = [r for r in ranks if ranks[r]["alive"] and r in pids]
        files = StallDir(stall)
        while time.time() < deadline and not all(files.answer(r).exists() for r in live):
            time.sleep(0.2)
        for rank in live:
            if not files.answer(rank).exists():
                self.faulthandler(stall, rank, pids[rank])
        files.collection.write_text(json.dumps({"quiet_seconds": quiet, "ranks": ranks, "stack_note": stack_note}))
        verdict = analyze(stall)
        files.verdict.write_text(json.dumps(verdict.as_json(), indent=1))
        self.say(f"hang: {verdict.headline} (evidence: {stall})")
        return verdict

    def registrations(self) -> Registrations:
        return read_registrations(self.metrics_dir)

    def pyspy(self, stall: Path, pids: dict[str, int]) -> str | None:
        """py-spy's dump of each rank, where it is installed and may attach; else a note of why not."""
        if os.environ.get(PYSPY_ENV) == "0":
            return f"py-spy: turned off ({PYSPY_ENV}=0); stacks from the ranks' own dumps"
        pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if not pyspy:
            return "py-spy: not installed (pip install py-spy); stacks from the ranks' own dumps"
        failures = []
        for rank, pid in pids.items():
            try:
                done = subprocess.run(
                    [pyspy, "dump", "--full-filenames", "--pid", str(pid)], capture_output=True, text=True, timeout=20
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                failures.append(f"rank {rank}: {error}")
                continue
            if done.returncode == 0:
                StallDir(stall).pyspy(rank).write_text(done.stdout)
            else:
                failures.append(f"rank {rank}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        if failures:
            return (
                "py-spy could not attach (it needs ptrace: root or CAP_SYS_PTRACE): "
                + "; ".join(failures)
                + "; stacks from the ranks' own dumps"
            )
        return None

    def faulthandler(self, stall: Path, rank: str, pid: int) -> None:
        """The rank did not answer (its main thread may hold the GIL): faulthandler, registered by the rank, writes
        every thread's stack from its signal handler."""
        source = hang_stacks_file(self.metrics_dir, rank)
        if rank not in self.registrations().faulthandler:
            return  # SIGUSR2 would end a process that did not register it (or is a job's own signal there)
        before = source.stat().st_size if source.exists() else 0
        try:
            os.kill(pid, STACK_SIGNAL)
        except ProcessLookupError:
            return
        time.sleep(1.0)
        with open(source, "rb") as stacks:
            stacks.seek(before)
            text = stacks.read()
        if text:
            StallDir(stall).faulthandler(rank).write_bytes(text)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie, not yet reaped, is gone as far as the run is concerned
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
