"""Where each rank of a hung run waits, from the evidence in one RUN_DIR/hang/stall-<n>/ folder (trainstack/hang.py
collects it): each rank's Python stack and its Flight Recorder entries. Pure: no torch, no process; the launcher,
`trainstack watch` and `trainstack diagnose --run-dir` all read the same folder through `analyze`.

The verdict, in order: a rank whose process is gone (it died); two ranks that ran different collectives at the same
sequence number of a process group (mismatched); ranks behind the others' last collective (they never joined it:
named with where their stack is); else no rank is in a collective, and each stuck rank's place is named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainstack.rundir import RunDir, StallDir, hang_pid_files


@dataclass
class Hang:
    headline: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    culprits: list[int] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"headline": self.headline, "evidence": self.evidence, "fix": self.fix, "culprits": self.culprits}


def latest_stall(hang_dir: Path) -> Path | None:
    stalls = RunDir(Path(hang_dir).parent).stalls()
    return stalls[-1].path if stalls else None


def read_verdict(hang_dir: Path) -> Hang | None:
    """The latest stall's verdict under RUN_DIR/hang, analyzing it afresh if no verdict was written."""
    stall = latest_stall(hang_dir)
    return None if stall is None else verdict_of(stall)


def verdict_of(stall: Path) -> Hang:
    """One stall folder's verdict.json, or its analysis when the collection did not get to write one."""
    try:
        data = json.loads(StallDir(stall).verdict.read_text())
        return Hang(
            data["headline"], list(data.get("evidence", [])), data.get("fix", ""), list(data.get("culprits", []))
        )
    except (OSError, ValueError, KeyError):
        return analyze(stall)


def latest_hang(run_dir: Path, metrics_dirs: Iterable[Path] = ()) -> tuple[Hang, float] | None:
    """The latest stall's verdict under RUN_DIR/hang and when its evidence was collected; None also where it was
    collected before the ranks of the launch whose metrics folders are `metrics_dirs` registered for hang evidence
    (their hang-rank-N.json, trainstack/hang.py; a launch's metrics folder is fresh): an earlier launch's stall,
    which would otherwise read as this launch hanging until its first step."""
    hang_dir = RunDir(Path(run_dir)).hang
    stall = latest_stall(hang_dir)
    if stall is None:
        return None
    collected_at = stall.stat().st_mtime
    if collected_at < _registered(metrics_dirs):
        return None
    verdict = read_verdict(hang_dir)
    return (verdict, collected_at) if verdict else None


def _registered(metrics_dirs: Iterable[Path]) -> float:
    """When the launch's first rank registered for hang evidence; 0 where none did (a watched command without
    trainstack.monitor, a launch whose folder is gone)."""
    times = []
    for path in (pid_file for folder in metrics_dirs for pid_file in hang_pid_files(folder)):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue  # the launch ended meanwhile
    return min(times, default=0.0)


# ---- stacks -----------------------------------------------------------------------------------------------------
# trainstack's rank-side instrumentation: the loop API, its telemetry (which wraps torch.distributed's collectives)
# and watch's automatic layer; never the user's code, whatever folder trainstack runs from.
INSTRUMENTATION = tuple(
    f"/{module.replace('.', '/')}{end}"
    for module, end in (("trainstack.telemetry", "/"), ("trainstack.auto", "/"), ("trainstack.monitor", ".py"))
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{Path(self.file).name}:{self.line} in `{self.function}`"

    @property
    def library(self) -> bool:
        """The one rule for a library frame (the standard library, an installed package, a frozen module, and
        trainstack's own rank-side instrumentation, which stands between the user's call and torch's wherever
        trainstack is installed from, a checkout too): the verdict names the innermost frame that is not one, the
        user's own code, and the library call it made."""
        return (
            "site-packages" in self.file
            or "dist-packages" in self.file
            or "/lib/python3" in self.file
            or self.file.startswith("<")
            or any(part in self.file for part in INSTRUMENTATION)
        )


FAULTHANDLER_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
PYSPY_LINE = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>[^():]+):(?P<line>\d+)\)")


def stack_from_faulthandler(text: str) -> list[Frame]:
    """The main thread's frames, outermost first, from faulthandler's last dump in `text` (innermost first)."""
    blocks = text.split("Current thread")
    if len(blocks) < 2:
        blocks = text.split("Thread 0x")
    last = blocks[-1] if blocks else ""
    main = last.split("\nThread 0x")[0]
    frames = [Frame(m["file"], int(m["line"]), m["function"]) for m in FAULTHANDLER_LINE.finditer(main)]
    return frames[::-1]


def stack_from_pyspy(text: str) -> list[Frame]:
    """The main thread's frames, outermost first, from `py-spy dump` (its first thread, innermost first)."""
    threads = re.split(r"\nThread ", text)
    chosen = next(
        (t for t in threads[1:] if "MainThread" in t.splitlines()[0]), threads[1] if len(threads) > 1 else text
    )
    frames = [Frame(m["file"], int(m["line"]), m["function"]) for m in map(PYSPY_LINE.match, chosen.splitlines()) if m]
    return frames[::-1]


def where(stack: list[Frame]) -> str:
    """A rank's place, as the verdict names it: the innermost frame of the user's code, and the innermost library
    frame it called into (a DataLoader's `__next__`, a collective, a torch.save)."""
    if not stack:
        return "at an unknown place (no stack)"
    own = [i for i, f in enumerate(stack) if not f.library]
    if not own:
        return f"at {stack[-1]}"
    last = own[-1]
    text = f"at {stack[last]}"
    called = _interesting(stack) or (stack[-1] if last < len(stack) - 1 else None)
    if called is not None:
        text += f", in `{called.function}` ({_library_name(called)})"
    return text


def _interesting(frames: list[Frame]) -> Frame | None:
    """The call worth naming: a DataLoader's `__next__`, a c10d collective, a checkpoint's save."""
    for frame in frames:
        # py-spy names methods with their class (`_BaseDataLoaderIter.__next__`), Python's own stacks do not
        if "torch/utils/data" in frame.file and frame.function.rsplit(".", 1)[-1] in (
            "__next__",
            "_next_data",
            "_get_data",
        ):
            return frame
    for frame in reversed(frames):
        if "torch/distributed/distributed_c10d" in frame.file:
            return frame
    for frame in frames:
        if (
            "checkpoint" in Path(frame.file).name or Path(frame.file).name == "serialization.py"
        ) and "save" in frame.function:
            return frame
    return None


def _library_name(frame: Frame) -> str:
    parts = Path(frame.file).parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1 :]) + f":{frame.line}"
    return f"{Path(frame.file).name}:{frame.line}"


def _in_checkpoint(stack: list[Frame], verb: str) -> bool:
    """Whether a frame of `stack` saves or loads (`verb`) a checkpoint or model state. The verb tells them apart:
    a save is a checkpoint write; a load (a resume reading its checkpoint, a model through from_pretrained, which
    passes through safetensors and transformers' `_get_resolved_checkpoint_files` too) is a rank preparing its model."""
    return any(
        verb in frame.function
        and re.search(rf"checkpoint|serialization|safetensors|{verb}_state", f"{frame.file}:{frame.function}")
        for frame in stack
    )


def kind(stack: list[Frame]) -> str:
    """collective, dataloader, checkpoint, data (fetching or preparing what it trains on, before the loop), compute
    (in autograd's backward, or a module's forward, innermost), or other: what a rank's innermost frames say it waits
    for."""
    files = " ".join(f"{f.file}:{f.function}" for f in stack[-12:])
    if "torch/distributed/" in files and ("distributed_c10d" in files or "c10d_logger" in files):
        return "collective"
    innermost = f"{stack[-1].file}:{stack[-1].function}" if stack else ""
    if re.search(r"torch/autograd/.*:_engine_run_backward|torch/nn/modules/.*:(forward|_call_impl)$", innermost):
        return "compute"
    if "torch/utils/data" in files:
        return "dataloader"
    if _in_checkpoint(stack[-12:], "save"):
        return "checkpoint"
    if _in_checkpoint(stack[-12:], "load") or re.search(
        r"/datasets/|/huggingface_hub/|:load_token_data|:load_dataset|:from_pretrained", files
    ):
        return "data"
    return "other"


# ---- one rank's evidence ----------------------------------------------------------------------------------------
@dataclass
class RankEvidence:
    rank: int
    stack: list[Frame]
    stack_source: str
    entries: list[dict]
    recorder_note: str | None
    alive: bool = True
    steps: float | None = None
    answered: bool = False  # the rank's own answer is there: its recorder's entries, or why it has none
    starting: bool = False  # it had not reached its loop (trainstack's own rank, loading data or building)

    @property
    def no_collective_yet(self) -> bool:
        """Its recorder was on and holds nothing: the rank has called no collective (a hang before its first step)."""
        return self.answered and self.recorder_note is None and not self.entries


def load(stall: Path) -> tuple[dict, dict[int, RankEvidence]]:
    collection: dict = {}
    try:
        collection = json.loads(StallDir(stall).collection.read_text())
    except (OSError, ValueError):
        pass
    ranks: dict[int, RankEvidence] = {}
    for rank_text, info in collection.get("ranks", {}).items():
        rank = int(rank_text)
        ranks[rank] = RankEvidence(
            rank, [], "none", [], None, info.get("alive", True), info.get("steps"), starting=info.get("starting", False)
        )
    files = StallDir(stall)
    for rank in sorted(files.ranks()):
        ranks.setdefault(rank, RankEvidence(rank, [], "none", [], None))
        try:
            record = json.loads(files.answer(rank).read_text())
        except (OSError, ValueError):
            continue
        evidence = ranks[rank]
        evidence.stack = [Frame(f["file"], f["line"], f["function"]) for f in record.get("stack", [])]
        evidence.stack_source = "the rank's own thread" if evidence.stack else "none"
        evidence.entries = record.get("flight_recorder") or []
        evidence.recorder_note = record.get("flight_recorder_error")
        evidence.answered = True
    for rank, evidence in ranks.items():
        pyspy, faults = files.pyspy(rank), files.faulthandler(rank)
        if pyspy.is_file() and (frames := stack_from_pyspy(pyspy.read_text(errors="replace"))):
            evidence.stack, evidence.stack_source = frames, "py-spy"
        elif (
            not evidence.stack
            and faults.is_file()
            and (frames := stack_from_faulthandler(faults.read_text(errors="replace")))
        ):
            evidence.stack, evidence.stack_source = frames, "faulthandler"
    return collection, dict(sorted(ranks.items()))


def _op(entry: dict) -> str:
    name = entry.get("profiling_name") or "?"
    return name.split(":", 1)[1] if ":" in name else name


DEFAULT_GROUP = "0"  # the name c10d gives the default process group: every rank is in it


def _group(entry: dict) -> str:
    """The process group's name, unique across backends; pg_id is numbered by each recorder on its own (a gloo
    side group and NCCL's default group can both be 0)."""
    named = entry.get("process_group")
    return str(named[0]) if named else str(entry.get("pg_id") or 0)


def _last_by_group(evidence: RankEvidence) -> dict[str, dict]:
    last: dict[str, dict] = {}
    for entry in evidence.entries:
        if entry.get("is_p2p") or not entry.get("collective_seq_id"):
            continue
        group = _group(entry)
        if group not in last or entry["collective_seq_id"] > last[group]["collective_seq_id"]:
            last[group] = entry
    return last


def _names(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# ---- the verdict ------------------------------------------------------------------------------------------------
FIXES = {
    "died": "the rank's own log says why it died (`dmesg` for the kernel's OOM killer); rerun the same command to "
    "resume from the last checkpoint",
    "mismatch": "every rank must call the same collectives in the same order with the same sizes: look for a "
    "collective under `if rank == 0:` (logging, a metric, saving), or an uneven last batch that gives one "
    "rank an extra step (drop_last=True, or a DistributedSampler with even shards)",
    "collective": "the rank(s) named never called the collective the others wait in: a collective under "
    "`if rank == 0:` (a metric, a log line, a checkpoint) that the other ranks skip, or a rank that "
    "left the loop early (an uneven last batch: drop_last=True)",
    "dataloader": "the rank waits for its DataLoader: a loader worker that is stuck or died, a dataset read from a "
    "slow or unreachable file system; py-spy dump --pid on its worker processes shows where",
    "checkpoint": "the rank is writing a checkpoint: a slow or full file system (docs/training.md, checkpoints); "
    "save asynchronously or less often",
    "data": "the rank is still preparing its data or model (downloading, reading, tokenizing, filling the datasets "
    "cache, reading the checkpoint it resumes from) while the others wait for it: a slow or unreachable file system or hub, a cache locked by another job "
    "(HF_HOME or HF_DATASETS_CACHE on shared storage), or a large corpus tokenized at every start (tokenize it once "
    "and train on the result); past --collective-timeout the waiting ranks fail",
    "other": "the stacks above show where each rank is: a deadlock (a lock, a queue, a subprocess) or a wait on "
    "something outside the job",
    "compute": "no rank waits: each is computing its step, which takes longer than the stall threshold (a model or "
    "batch too large for the device: minutes a step on a CPU); shrink them, or raise the threshold "
    "(TRAINSTACK_HANG_SECONDS) where such steps are expected",
}


def analyze(stall: Path) -> Hang:
    collection, ranks = load(stall)
    evidence: list[str] = []
    for r in ranks.values():
        steps = "starting (before its loop), " if r.starting else f"step {r.steps:.0f}, " if r.steps is not None else ""
        if not r.alive:
            evidence.append(f"rank {r.rank}: {steps}its process is gone")
            continue
        last = _last_by_group(r)
        collective = (
            "; ".join(
                f"last collective {_op(e)} #{e['collective_seq_id']} of group {g}" for g, e in sorted(last.items())
            )
            or f"no Flight Recorder entries ({r.recorder_note or 'none recorded'})"
        )
        if last and r.recorder_note:  # one recorder answered, another did not: its collectives are missing
            collective += f" (Flight Recorder incomplete: {r.recorder_note})"
        evidence.append(f"rank {r.rank}: {steps}{collective}; {where(r.stack)} (stack from {r.stack_source})")
    if note := collection.get("stack_note"):
        evidence.append(note)

    dead = [r.rank for r in ranks.values() if not r.alive]
    if dead:
        return Hang(
            f"{_names(dead)} died; the other ranks wait for {'it' if len(dead) == 1 else 'them'}",
            evidence,
            FIXES["died"],
            dead,
        )

    alive = [r for r in ranks.values()]
    lasts = {r.rank: _last_by_group(r) for r in alive}
    groups = sorted({g for last in lasts.values() for g in last}, key=lambda name: (len(name), name))
    for group in groups:
        by_seq: dict[int, dict[int, dict]] = {}
        for r in alive:
            for entry in r.entries:
                if _group(entry) == group and entry.get("collective_seq_id") and not entry.get("is_p2p"):
                    by_seq.setdefault(entry["collective_seq_id"], {})[r.rank] = entry
        for seq in sorted(by_seq):
            calls = by_seq[seq]
            shapes = {(_op(e), json.dumps(e.get("input_sizes"))) for e in calls.values()}
            if len(calls) > 1 and len(shapes) > 1:
                said = "; ".join(
                    f"rank {rank} {_op(e)} of sizes {e.get('input_sizes')} {where(ranks[rank].stack)}"
                    for rank, e in sorted(calls.items())
                )
                return Hang(
                    f"mismatched collectives at #{seq} of process group {group}: {said}",
                    evidence,
                    FIXES["mismatch"],
                    sorted(calls),
                )
        have = {rank: last[group] for rank, last in lasts.items() if group in last}
        top = max(e["collective_seq_id"] for e in have.values())
        waiting = sorted(rank for rank, e in have.items() if e["collective_seq_id"] == top)
        # Every rank is in the default group (0): one that has called no collective at all is behind in it.
        behind = sorted(
            r.rank
            for r in alive
            if r.rank not in waiting and (r.rank in have or (group == DEFAULT_GROUP and r.no_collective_yet))
        )
        unknown = sorted(r.rank for r in alive if r.rank not in have and r.rank not in behind)
        if not behind and unknown:
            op = _op(have[waiting[0]])
            places = "; ".join(f"rank {rank} is {where(ranks[rank].stack)}" for rank in unknown)
            culprit_kind = next(
                (kind(ranks[rank].stack) for rank in unknown if kind(ranks[rank].stack) != "collective"), "collective"
            )
            return Hang(
                f"{_names(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in {op} #{top} of process "
                f"group {group}; {_names(unknown)} gave no Flight Recorder entries: {places}",
                evidence,
                FIXES["collective" if culprit_kind in ("collective", "other", "compute") else culprit_kind],
                unknown,
            )
        if behind and waiting:
            op = _op(have[waiting[0]])
            places = "; ".join(f"rank {rank} is {where(ranks[rank].stack)}" for rank in behind)
            culprit_kind = next(
                (kind(ranks[rank].stack) for rank in behind if kind(ranks[rank].stack) != "collective"), "collective"
            )
            waits = f"{_names(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in it"
            return Hang(
                f"{_names(behind)} {'has' if len(behind) == 1 else 'have'} not joined {op} #{top} of process "
                f"group {group} ({waits}); {places}",
                evidence,
                FIXES["collective" if culprit_kind in ("collective", "other", "compute") else culprit_kind],
                behind,
            )

    stuck = [r for r in alive if kind(r.stack) != "collective"] or alive
    places = "; ".join(f"rank {r.rank} is {where(r.stack)}" for r in stuck)
    in_collective = [r.rank for r in alive if kind(r.stack) == "collective" and r not in stuck]
    tail = f" while {_names(in_collective)} wait in a collective" if in_collective else ""
    kinds = [kind(r.stack) for r in stuck]
    if set(kinds) == {"compute"} and not in_collective:  # a step longer than the threshold, not a hang
        return Hang(f"no rank waits: every rank is computing its step; {places}", evidence, FIXES["compute"], [])
    culprit_kind = next((k for k in kinds if k not in ("other", "compute")), "other")
    if culprit_kind == "collective":
        culprit_kind = "other"
    return Hang(
        f"no rank is behind the others' collectives; {places}{tail}",
        evidence,
        FIXES[culprit_kind],
        [r.rank for r in stuck],
    )
