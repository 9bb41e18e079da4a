"""Hang evidence, the ranks' side and the contract with their supervisor (docs/diagnostics.md, "When a run hangs").

A rank (trainstack's own, or a user's loop through `trainstack.monitor`) calls `start_responder` once. It:
- writes `METRICS_DIR/hang-rank-N.json` ({"rank", "pid"}): how `trainstack train` and `trainstack watch` find the
  ranks' processes (the metrics directory is fresh each launch, so a stale pid is never read);
- registers faulthandler on SIGUSR2, writing every thread's Python stack to `METRICS_DIR/hang-rank-N.stacks.txt`:
  the C-level fallback that answers even when the rank's main thread holds the GIL;
- starts a daemon thread that, once a second, looks for the supervisor's request (`METRICS_DIR/hang-request.json`,
  naming an evidence directory under RUN_DIR/hang/) and answers it once with `rank-N.json` there: the main
  thread's Python stack and the Flight Recorder's entries of this process. NCCL keeps a recorder of its own
  (`_dump_nccl_trace_json`, its entries timed by CUDA events), apart from the one gloo writes
  (`_dump_fr_trace_json`): both are read. A rank blocked in a collective, a DataLoader or a file write has
  released the GIL, so the thread runs. At each poll the thread also writes the rank's step and forward counts
  (`publish_progress_each_poll`), which its loop writes only once a second: the supervisor and a rank that timed
  out then read where the rank stopped.

Nothing here kills, pauses or adds a collective. The environment a launcher hands over (`hang_environment`)
turns the Flight Recorder on, unless the user set it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from trainstack.rundir import (
    HANG_REQUEST_FILE,
    METRICS_DIR_ENV,
    RunDir,
    StallDir,
    hang_pid_file,
    hang_stacks_file,
)

# The Flight Recorder's ring buffer, entries per process group and rank; TORCH_NCCL_TRACE_BUFFER_SIZE is its
# older name. 2000 entries cover ~200 steps of a DDP model with 10 gradient buckets; its cost is in
# docs/benchmarks.md ("Flight Recorder on vs off"). TRAINSTACK_FLIGHT_RECORDER=0 leaves it off.
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_OLD_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"  # where torch dumps the buffer itself (an NCCL timeout): a file prefix
FR_BUFFER_DEFAULT = 2000
FR_SWITCH_ENV = "TRAINSTACK_FLIGHT_RECORDER"
# Seconds without a step on any rank before evidence is collected; unset: from the run's own step times
# (trainstack/thresholds.py HANG_*).
HANG_SECONDS_ENV = "TRAINSTACK_HANG_SECONDS"
# "0": never run py-spy, even when installed (the stacks then come from the ranks' own dumps).
PYSPY_ENV = "TRAINSTACK_PYSPY"
STACK_SIGNAL = signal.SIGUSR2
# Flight Recorder dumps -> whose entries they hold. Seen on an H100: NCCL's collectives are only in NCCL's own
# recorder; a CPU build of torch has no NCCL dump.
FR_DUMPS = {"_dump_fr_trace_json": "gloo's recorder", "_dump_nccl_trace_json": "NCCL's recorder"}
# What a hang verdict reads of each Flight Recorder entry (trainstack/hang_verdict.py).
FR_ENTRY_KEYS = (
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "input_sizes",
    "output_sizes",
    "state",
    "time_created_ns",
    "is_p2p",
)
POLL_SECONDS = 1.0

_faulthandler_registered: bool | None = None  # None: no responder in this process yet
_progress: list[Callable[[], None]] = []  # what the responder's thread publishes at each poll


def publish_progress_each_poll(publish: Callable[[], None]) -> Callable[[], None]:
    """Has the responder's thread call `publish` at each poll (a monitor's counted series: trainstack/telemetry/
    metrics.py's CountedSeries); returns what stops it. `publish` must be safe on another thread than the loop's."""
    _progress.append(publish)
    return lambda: _progress.remove(publish) if publish in _progress else None


def hang_environment(run_dir: Path, run_id: str, env: dict[str, str]) -> dict[str, str]:
    """The variables a launcher adds to its ranks' environment (`env`, the one they would get): the Flight
    Recorder on, its own dumps under RUN_DIR/hang/<run id>/ (made here: torch writes there on an NCCL timeout and
    makes no folder); a user's own setting of either wins."""
    if env.get(FR_SWITCH_ENV) == "0" or FR_BUFFER_ENV in env or FR_BUFFER_OLD_ENV in env:
        added = {}
    else:
        added = {FR_BUFFER_ENV: str(FR_BUFFER_DEFAULT)}
    size = added.get(FR_BUFFER_ENV) or env.get(FR_BUFFER_ENV) or env.get(FR_BUFFER_OLD_ENV) or "0"
    if FR_DUMP_ENV not in env and env.get(FR_SWITCH_ENV) != "0" and size.strip() != "0":
        prefix = RunDir(run_dir.resolve()).fr_dump_prefix(run_id)
        try:
            prefix.parent.mkdir(parents=True, exist_ok=True)
            added[FR_DUMP_ENV] = str(prefix)
        except OSError:
            pass  # a read-only run directory: torch's default place then (the launcher says why elsewhere)
    return added


def start_responder(rank: int | str, metrics_dir: str | None = None, starting: bool = False) -> bool:
    """Make this rank answer the supervisor's requests for evidence (see the module's docstring); once per
    process. `starting`: the rank has not reached its loop yet (trainstack's own rank calls it as it starts, so that
    a wait in its start-up has evidence too); the call from its loop then only says it is there. False where no
    responder was started (not under trainstack train or watch, or one runs already)."""
    global _faulthandler_registered
    metrics_dir = metrics_dir or os.environ.get(METRICS_DIR_ENV)
    if not metrics_dir or not Path(metrics_dir).is_dir():
        return False
    directory = Path(metrics_dir)
    if _faulthandler_registered is not None:
        if not starting:
            try:
                _announce(directory, rank, _faulthandler_registered, starting=False)
            except OSError:
                pass  # the supervisor keeps counting this rank's start-up: at worst, evidence it did not need
        return False
    try:
        # Only where SIGUSR2 is free: a job's own handler (a scheduler's "time is nearly up" signal) is left alone.
        registered = threading.current_thread() is threading.main_thread() and signal.getsignal(STACK_SIGNAL) in (
            signal.SIG_DFL,
            None,
        )
        if registered:
            stacks = open(hang_stacks_file(directory, rank), "a")  # noqa: SIM115 - faulthandler writes it until exit
            faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)
        _announce(directory, rank, registered, starting)
    except (OSError, ValueError, RuntimeError):
        return False
    _faulthandler_registered = registered
    main = threading.main_thread().ident
    threading.Thread(target=_respond, args=(directory, int(rank), main), name="trainstack-hang", daemon=True).start()
    return True


def _announce(directory: Path, rank: int | str, registered: bool, starting: bool) -> None:
    """The rank's pid file, replaced whole: the supervisor reads it while the rank rewrites it."""
    target = hang_pid_file(directory, rank)
    partial = target.with_suffix(".tmp")
    partial.write_text(
        json.dumps({"rank": int(rank), "pid": os.getpid(), "faulthandler": registered, "starting": starting})
    )
    os.replace(partial, target)


def _respond(directory: Path, rank: int, main: int) -> None:
    answered: set[str] = set()
    request = directory / HANG_REQUEST_FILE
    while True:
        time.sleep(POLL_SECONDS)
        for publish in tuple(_progress):
            try:
                publish()
            except Exception:  # noqa: BLE001 - a series write that failed now is retried at the next poll
                pass
        try:
            wanted = json.loads(request.read_text())
        except (OSError, ValueError):
            continue
        evidence = wanted.get("dir")
        if not evidence or evidence in answered:
            continue
        answered.add(evidence)
        try:
            answer(Path(evidence), rank, main)
        except Exception as error:  # noqa: BLE001 - evidence is best effort; the rank must go on
            print(f"trainstack rank {rank}: warning: no hang evidence: {error}", file=sys.stderr)


def answer(evidence: Path, rank: int, main: int) -> None:
    frame = sys._current_frames().get(main)
    stack = (
        [
            {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""}
            for f in traceback.extract_stack(frame)
        ]
        if frame
        else []
    )
    fr, fr_error = flight_recorder()
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "time": time.time(),
        "stack": stack,
        "flight_recorder": fr,
        "flight_recorder_error": fr_error,
    }
    target, partial = StallDir(evidence).answer(rank), StallDir(evidence).partial_answer(rank)
    partial.write_text(json.dumps(record))
    os.link(partial, target)  # never replaces: a second answer to the same directory fails here
    partial.unlink()


def flight_recorder() -> tuple[list[dict], str | None]:
    """This process's Flight Recorder entries (each collective: process group, sequence id, op, sizes, state), and
    why there are none or some may be missing: a recorder that fails to dump (NCCL's, after a CUDA error) must not
    leave an empty list that reads as a rank that has called no collective."""
    if "torch" not in sys.modules:
        return [], "torch is not imported"
    c10d = getattr(sys.modules["torch"]._C, "_distributed_c10d", None)
    dumps = {name: getattr(c10d, name) for name in FR_DUMPS if hasattr(c10d, name)}
    if not dumps:
        return [], "this torch has no Flight Recorder"
    entries: list[dict] = []
    errors = []
    for name, dump in dumps.items():
        try:
            entries += json.loads(dump(includeCollectives=True, onlyActive=False)).get("entries", [])
        except Exception as error:  # noqa: BLE001 - an old torch, a recorder turned off, a CUDA error
            errors.append(f"{FR_DUMPS[name]}: {type(error).__name__}: {error}")
    entries = [{k: e.get(k) for k in FR_ENTRY_KEYS} for e in entries]
    if errors:
        return entries, "; ".join(errors)
    if not entries and not os.environ.get(FR_BUFFER_ENV) and not os.environ.get(FR_BUFFER_OLD_ENV):
        return [], f"the Flight Recorder is off ({FR_BUFFER_ENV} unset)"
    return entries, None
