"""From a Snapshot to verdicts: each names what keeps the GPUs from being used, with its evidence and a fix.
Each verdict's kind, thresholds and fix are its problem's (trainstack/problems.py), which the alerts read too; a
check here adds what only the snapshot can say (the ranks, the GPUs, the hang's evidence)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from trainstack import breakdown, catalog
from trainstack import problems as P
from trainstack.monitoring.diagnose.snapshot import GpuProcess, GpuView, RankView, Snapshot
from trainstack.rundir import INSTRUMENT_HINT, UNSEEN_RANKS
from trainstack.thresholds import Thresholds
from trainstack.units import human_bytes

MIB, GIB = 1 << 20, 1 << 30
# A link's most, per direction, to set measured traffic against (hardware figures, not thresholds). PCIe: bytes per
# second per lane after line encoding (8b/10b for gen 1-2, 128b/130b for gen 3-5, FLIT for gen 6), times the width.
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
# NVLink 2, 3 and 4 (V100, A100, H100) all carry 25 GB/s per link and direction (H100: 18 links, 450 GB/s each way);
# NVLink 5 (Blackwell) doubles it, so there the share shown is twice the real one.
NVLINK_BYTES_PER_SECOND = 25e9


@dataclass(frozen=True)
class Verdict:
    kind: str
    summary: str
    evidence: tuple[str, ...]
    fix: str


def _percent(ratio: float | None) -> str:
    return "unknown" if ratio is None else f"{100 * ratio:.0f}%"


def _ranks_list(ranks: list[RankView]) -> str:
    return ", ".join(f"rank {r.rank}" for r in ranks)


def _fix(kind: str, ranks: list[RankView]) -> str:
    """The problem's fix in the words of whoever started `ranks` (problems.Fix.words)."""
    fix = P.PROBLEMS[kind].fix
    assert fix is not None, f"{kind} names no fix"
    return fix.words([r.launcher for r in ranks])


def _knob(ranks: list[RankView], train: str, script: str) -> str:
    """A knob in the user's words, as problems.Fix.words picks them: for what a verdict adds to its problem's fix
    from the snapshot (a setting the ranks say is off)."""
    return P.Fix(train, script).words([r.launcher for r in ranks])


def _uninstrumented(snapshot: Snapshot, limits: Thresholds) -> bool:
    """A job runs but no rank reports telemetry: `trainstack watch` says it runs a command, NVML lists a process on
    a GPU, or a GPU is busy."""
    return not snapshot.ranks and (
        bool(snapshot.command)
        or bool(snapshot.processes)
        or any((g.utilization or 0.0) >= limits.gpu_idle_ratio for g in snapshot.gpus)
    )


def no_training(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    if snapshot.ranks or _uninstrumented(snapshot, limits):  # the latter: a job without telemetry (notes)
        return None
    evidence = [
        f"GPU {g.index} ({g.uuid}) utilization {_percent(g.utilization)}"
        for g in snapshot.gpus
        if g.utilization is not None
    ]
    return Verdict(
        P.NO_TRAINING,
        "the source has no training series: no rank has started, or the exporter reads the wrong metrics directory",
        tuple(evidence) or (f"no {catalog.TRAIN_PREFIX}* series at all",),
        _fix(P.NO_TRAINING, []),
    )


def not_started(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    if not snapshot.ranks or any(r.last_step_time for r in snapshot.ranks):
        return None
    registered = f"{len(snapshot.ranks)} rank(s) registered but none has completed a step"
    if snapshot.hang is not None:  # the launcher's evidence of this launch (the exporter serves no earlier one's)
        hang = snapshot.hang[0]
        return Verdict(
            P.STALLED,
            f"no rank has completed its first step: {hang.headline}",
            (registered, *hang.evidence),
            f"{hang.fix}; --collective-timeout turns such a hang into an error",
        )
    return Verdict(
        P.NO_STEP_YET,
        registered,
        (f"{catalog.TRAIN_LAST_STEP.name} is 0 on every rank",),
        _fix(P.NO_STEP_YET, snapshot.ranks),
    )


def stalled(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    step_times = [r.last_step_time for r in snapshot.ranks if r.last_step_time]
    if not step_times:
        return None
    last_step = max(step_times)
    age = snapshot.now - last_step
    # Evidence collected since the last step (the launcher's threshold follows the run's step times) is this stall.
    hang = snapshot.hang[0] if snapshot.hang and snapshot.hang[1] > last_step else None
    if age <= limits.stall_seconds and hang is None:
        return None
    evidence = [
        f"rank {r.rank}: step {r.steps:.0f}, last step {snapshot.now - r.last_step_time:.0f} s ago"
        for r in snapshot.ranks
        if r.last_step_time
    ]
    most = max(r.steps for r in snapshot.ranks)
    behind = [r for r in snapshot.ranks if r.steps < most]
    if behind:
        evidence.append(f"{_ranks_list(behind)} stopped first ({most:.0f} steps elsewhere)")
    utilization = {g.uuid: g.utilization for g in snapshot.gpus if g.utilization is not None}
    gpu_ranks = [r for r in snapshot.ranks if r.uuid in utilization]
    idle = [r for r in gpu_ranks if utilization[r.uuid] < limits.gpu_idle_ratio]
    if idle and len(idle) < len(gpu_ranks):
        # A rank blocked in an NCCL collective keeps its GPU at 100% (the kernel spins); the one stuck elsewhere
        # leaves its GPU idle.
        evidence.append(
            f"{_ranks_list(idle)}: GPU idle while the other ranks' GPUs are busy waiting in NCCL: the likely culprit"
        )
    if hang is not None:
        return Verdict(
            P.STALLED,
            f"no rank has completed a step for {age:.0f} s: {hang.headline}",
            (*evidence, *hang.evidence),
            f"{hang.fix}; --collective-timeout turns such a hang into an "
            "error; rerun the same command to resume from the last checkpoint",
        )
    return Verdict(
        P.STALLED,
        f"no rank has completed a step for {age:.0f} s (threshold {limits.stall_seconds:g} s) while the exporter is up",
        tuple(evidence),
        _fix(P.STALLED, snapshot.ranks),
    )


def gpus_unused(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """A GPU no rank runs on; without rank telemetry (an uninstrumented job), a GPU no process holds memory on."""
    if snapshot.ranks:
        used = {r.uuid for r in snapshot.ranks if r.uuid}
        where = "the ranks run on CPU while" if not used else f"{len(snapshot.ranks)} rank(s) use {len(used)} GPU(s);"
        user, unused = "rank", "no rank's uuid"
    elif snapshot.processes:
        used = {p.uuid for p in snapshot.processes}
        where = f"processes use {len(used)} GPU(s) while"
        user, unused = "process", "no process on it"
    else:
        return None
    idle = [
        g
        for g in snapshot.gpus
        if g.uuid not in used and (g.utilization is None or g.utilization < limits.gpu_idle_ratio)
    ]
    if not idle:
        return None
    return Verdict(
        P.GPUS_UNUSED,
        f"{where} {len(idle)} of {len(snapshot.gpus)} visible GPU(s) sit idle with no {user} on them",
        tuple(
            f"GPU {g.index} ({g.name or g.uuid}): utilization "
            f"{'unknown' if g.utilization is None else _percent(g.utilization)}, {unused}"
            for g in idle
        ),
        _fix(P.GPUS_UNUSED, snapshot.ranks),
    )


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"


def _process_name(process: GpuProcess) -> str:
    where = f" on {process.instance}" if process.instance else ""
    return f"pid {process.pid}" + (f" ({process.name})" if process.name else "") + where


def _against(value: float | None, first: float | None, first_gpu: GpuView) -> str:
    return f" ({value / first:.2f}x GPU {first_gpu.index}'s)" if first and value is not None else ""


def _driven_gpus_evidence(held: list[tuple[GpuProcess, GpuView]]) -> list[str]:
    """One process's GPUs, each against its first (the lowest index: nn.DataParallel's output device)."""
    (first, first_gpu), *others = held
    evidence = [
        f"{_process_name(first)} is the main user of GPUs {', '.join(g.index for _, g in held)}",
        f"GPU {first_gpu.index}: {_gib(first.memory_bytes)} used by it, utilization "
        f"{_percent(first_gpu.utilization)} (its first GPU)",
    ]
    evidence += [
        f"GPU {gpu.index}: {_gib(process.memory_bytes)} used by it"
        f"{_against(process.memory_bytes, first.memory_bytes, first_gpu)}, utilization "
        f"{_percent(gpu.utilization)}{_against(gpu.utilization, first_gpu.utilization, first_gpu)}"
        for process, gpu in others
    ]
    # each GPU here is busy (one_process_many_gpus), so its utilization is known
    if all(
        first.memory_bytes > p.memory_bytes and (first_gpu.utilization or 0.0) > (g.utilization or 0.0)
        for p, g in others
    ):
        evidence.append(
            f"GPU {first_gpu.index} is the busiest and the fullest: nn.DataParallel's shape (it "
            "scatters each batch, gathers the outputs and computes the loss there)"
        )
    return evidence


def one_process_many_gpus(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """One process is the main memory user of several busy GPUs: nn.DataParallel, or a model split by hand. Read
    from NVML's process map alone, so it judges any job, instrumented or not (TrainstackOneProcessManyGPUs, the
    same rule)."""
    busy = {g.uuid: g for g in snapshot.gpus if (g.utilization or 0.0) >= limits.process_gpu_busy_ratio}
    order = {g.uuid: position for position, g in enumerate(snapshot.gpus)}  # by index
    driven = []
    for held in snapshot.gpus_held().values():
        held_busy = sorted((p for p in held if p.uuid in busy), key=lambda p: order[p.uuid])
        if len(held_busy) >= 2:
            driven.append([(p, busy[p.uuid]) for p in held_busy])
    if not driven:
        return None
    return Verdict(
        P.ONE_PROCESS_MANY_GPUS,
        "one process drives several GPUs (nn.DataParallel, or a model split by hand): "
        + "; ".join(f"{_process_name(held[0][0])} on {len(held)} GPUs" for held in driven),
        tuple(line for held in driven for line in _driven_gpus_evidence(held)),
        _fix(P.ONE_PROCESS_MANY_GPUS, snapshot.ranks),
    )


def _sentence(text: str) -> str:
    """A fix that follows a full stop: its first letter capitalized."""
    return text[:1].upper() + text[1:]


def _data_wait_evidence(rank: RankView) -> str:
    if rank.clock != "gpu":
        return f"rank {rank.rank}: blocked on the loader {_percent(rank.data_wait_ratio)} of its step time"
    # The host's wait is no evidence on a GPU: it can sit in next() while the GPU works through queued steps.
    host = (
        ""
        if rank.host_data_wait_ratio is None
        else f"; its host waited in the loader {_percent(rank.host_data_wait_ratio)}"
    )
    return (
        f"rank {rank.rank}: its GPU sat idle for want of the next batch {_percent(rank.data_wait_ratio)} of "
        f"its step time (GPU timeline{host})"
    )


def input_bound(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """Reads each rank's data wait on its own device's clock: on a GPU, the time the GPU starved."""
    waiting = [
        r for r in snapshot.ranks if r.data_wait_ratio is not None and r.data_wait_ratio > limits.input_bound_ratio
    ]
    if not waiting:
        return None
    return Verdict(
        P.INPUT_BOUND,
        f"input-bound: {_ranks_list(waiting)} wait(s) for the data loader more than "
        f"{_percent(limits.input_bound_ratio)} of the time",
        tuple(_data_wait_evidence(r) for r in waiting),
        f"{_fix(P.INPUT_BOUND, snapshot.ranks)}; in DDP every other rank waits for the slowest loader",
    )


def straggler(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """Judged where the ranks wait for each other: at the collectives (ratios.STRAGGLER_WAIT). A rank slowed
    anywhere in its step makes its peers wait for it there and waits least itself; forward time and data wait,
    in the evidence, say which part of its step is slow."""
    beyond = snapshot.straggler_waits()
    if not beyond:
        return None
    named = max(beyond, key=lambda rank: beyond[rank])
    share = beyond[named]
    if share <= limits.straggler_wait_ratio:
        return None
    slow = next(r for r in snapshot.ranks if r.rank == named)
    measured = [r for r in snapshot.ranks if r.rank in beyond]
    longest = max(r.step_seconds for r in measured if r.step_seconds is not None)  # STRAGGLER_WAIT's base
    cost = f"{1000 * share * longest:.0f} ms of each {1000 * longest:.0f} ms step ({_percent(share)})"
    return Verdict(
        P.STRAGGLER,
        f"rank {named} is a straggler: the other rank(s) wait for it {cost} at the collectives "
        f"(threshold {_percent(limits.straggler_wait_ratio)})",
        tuple(_straggler_evidence(measured)),
        "the others wait for it at each collective (the gradient all-reduce, DDP's buffer broadcast, any its framework "
        f"or loop calls); the evidence says which part of its step is slow.{_lone_pause(slow, measured)} "
        f"{_sentence(_fix(P.STRAGGLER, measured))}",
    )


SHARES_DIFFER = 0.02
"""How far apart two ranks' shares of their time in one pause, or of their steps waiting for data, must be for the
evidence to show them: less is the scheduler's noise."""
LONE_PAUSE_FIX = {
    breakdown.CHECKPOINT_SAVE: "save on every rank at once (torch.distributed.checkpoint: each rank writes its own "
    "shard), or in the background (torch.distributed.checkpoint.async_save), or less often",
    breakdown.EVALUATION: "evaluate on every rank, each on its share of the held-out set (a DistributedSampler), or "
    "less often",
    breakdown.CHECKPOINT_LOAD: "load on every rank at once, or broadcast what one rank loaded",
    breakdown.COMPILE: "give every rank the same shapes (pad or bucket the batches) so that none compiles alone, or "
    "mark the varying dimension dynamic (torch._dynamo.mark_dynamic)",
}
"""For a pause the straggler takes alone (RankView.paused_ratio), what takes it off the others' critical path."""


def _lone_pause(slow: RankView, ranks: list[RankView]) -> str:
    """Where the straggler pauses more than every peer (a checkpoint rank 0 alone saves, an evaluation on one rank),
    the sentence that names that pause and its fix: its peers go on to their next collective and wait there."""
    peers = [r for r in ranks if r is not slow]
    alone = {
        part: share
        for part, share in slow.paused_ratio.items()
        if peers and all(share - r.paused_ratio.get(part, 0.0) > SHARES_DIFFER for r in peers)
    }
    if not alone:
        return ""
    part = max(alone, key=lambda name: alone[name])
    return (
        f" It pauses alone: {breakdown.PAUSE_WORDS[part]} {_percent(alone[part])} of its time, and the others wait "
        f"for it at their next collective: {LONE_PAUSE_FIX[part]}."
    )


def _straggler_evidence(ranks: list[RankView]) -> list[str]:
    """Each rank's wait at the collectives and its forward time per step; its data wait and its pauses where the
    ranks' differ."""
    data_waits = [r.data_wait_ratio for r in ranks if r.data_wait_ratio is not None]
    data_differs = len(data_waits) > 1 and max(data_waits) - min(data_waits) > SHARES_DIFFER
    pauses_differ = [
        part
        for part in breakdown.PAUSES
        if max(r.paused_ratio.get(part, 0.0) for r in ranks) - min(r.paused_ratio.get(part, 0.0) for r in ranks)
        > SHARES_DIFFER
    ]

    def per_step(ratio: float, r: RankView) -> str:
        return (
            _percent(ratio) if r.step_seconds is None else f"{1000 * ratio * r.step_seconds:.1f} ms ({_percent(ratio)})"
        )

    lines = []
    for r in ranks:
        assert r.comm_exposed_ratio is not None, "ranks whose waits were measured (straggler_waits)"
        parts = [f"rank {r.rank}: waits at the collectives {per_step(r.comm_exposed_ratio, r)} per step"]
        if r.forward_seconds is not None:
            parts.append(f"forward {1000 * r.forward_seconds:.1f} ms per step")
        if data_differs and r.data_wait_ratio is not None:
            parts.append(f"waits for data {per_step(r.data_wait_ratio, r)} per step")
        parts += [
            f"{breakdown.PAUSE_WORDS[part]} {_percent(r.paused_ratio.get(part, 0.0))} of its time"
            for part in pauses_differ
        ]
        lines.append(", ".join(parts))
    return lines


def comm_bound(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """Judged on the least exposed rank: a straggler's peers wait for it inside the all-reduce, but the straggler
    itself does not, so only a slow link makes every rank wait (and the straggler check names a slow rank). The
    evidence says what the link carried and what may slow it: the GPUs' links, NCCL switches, /dev/shm."""
    measured = [r for r in snapshot.ranks if r.comm_exposed_ratio is not None]
    if len(measured) < len(snapshot.ranks) or not measured:
        return None
    least = min(r.comm_exposed_ratio for r in measured if r.comm_exposed_ratio is not None)
    if least <= limits.comm_bound_ratio:
        return None
    gpus = {g.uuid: g for g in snapshot.gpus}
    links = [(r, gpus[r.uuid]) for r in measured if r.uuid in gpus]
    evidence = [_comm_per_rank(r) for r in measured]
    evidence += [_links(r, g) for r, g in links]
    evidence += [line for r, g in links if (line := _link_traffic(r, g))]
    evidence += _nccl_switches(measured)
    shm = _shm_by_node(snapshot, limits)
    evidence += [_shm(node, *figures) for node, figures in shm.items()]
    small_shm = {node: needed for node, (size, _, needed) in shm.items() if size < needed}
    first = [
        fix
        for fix in (_switches_fix(measured), _shm_fix(small_shm), _pcie_fix([g for _, g in links if g.pcie_below_max]))
        if fix
    ]
    return Verdict(
        P.COMM_BOUND,
        f"communication-bound: every rank waits at least {_percent(least)} of its step time for "
        f"communication (threshold {_percent(limits.comm_bound_ratio)}): compute does not hide it",
        tuple(evidence),
        "".join(f"{fix}; " for fix in first) + _fix(P.COMM_BOUND, measured),
    )


def _comm_per_rank(r: RankView) -> str:
    assert r.comm_exposed_ratio is not None, "a rank whose wait was measured"
    total = "" if r.comm_seconds is None else f" of {1000 * r.comm_seconds:.0f} ms communication per step"
    exposed = "" if r.step_seconds is None else f"{1000 * r.comm_exposed_ratio * r.step_seconds:.0f} ms exposed"
    carried = ""
    if r.comm_bytes_per_step is not None:
        bus = r.bus_bytes_per_second
        carried = f"; {human_bytes(r.comm_bytes_per_step)} communicated per step" + (
            "" if bus is None else f" at {_bandwidth(bus)} bus bandwidth"
        )
    return (
        f"rank {r.rank}: waits for communication {_percent(r.comm_exposed_ratio)} of its step time "
        f"({exposed}{total}){carried}"
    )


def _bandwidth(bytes_per_second: float) -> str:
    """As nccl-tests prints it: decimal GB/s, or MB/s for a link slower than one GB/s."""
    if bytes_per_second >= 1e9:
        return f"{bytes_per_second / 1e9:.1f} GB/s"
    return f"{bytes_per_second / 1e6:.1f} MB/s"


def _links(r: RankView, g: GpuView) -> str:
    if g.nvlinks_active:
        nvlink = f"{g.nvlinks_active} NVLinks active"
    else:
        nvlink = "no NVLink" if g.nvlinks_active is None else "no NVLink active"
        nvlink += " (traffic to other GPUs crosses PCIe)"
    parts = [nvlink]
    if g.pcie_generation is not None and g.pcie_width is not None:
        pcie = f"PCIe gen {g.pcie_generation} x{g.pcie_width}"
        if g.pcie_below_max:
            pcie += f", below its maximum gen {g.pcie_max_generation} x{g.pcie_max_width}"
        parts.append(pcie)
    return f"rank {r.rank}'s GPU {g.index}: " + "; ".join(parts)


def _link_traffic(r: RankView, g: GpuView) -> str:
    """What GPM measured on the GPU's links, against their most: a link near its most is the bottleneck; one far
    below it while the ranks wait says the traffic takes another path (sockets, the host) or is latency-bound."""
    parts = []
    for link, most in (
        ("nvlink", (g.nvlinks_active or 0) * NVLINK_BYTES_PER_SECOND),
        ("pcie", PCIE_LANE_BYTES_PER_SECOND.get(g.pcie_generation or 0, 0.0) * (g.pcie_width or 0)),
    ):
        sent, received = (g.link_bytes_per_second.get(f"{link} {way}") for way in ("transmit", "receive"))
        if sent is None or received is None:
            continue
        name = "NVLink" if link == "nvlink" else "PCIe"
        against = f" of {_bandwidth(most)} each way ({_percent(max(sent, received) / most)})" if most else ""
        parts.append(f"{name} {_bandwidth(sent)} out, {_bandwidth(received)} in{against}")
    return f"rank {r.rank}'s GPU {g.index} carried (GPM): " + "; ".join(parts) if parts else ""


def _nccl_switches(ranks: list[RankView]) -> list[str]:
    """The switches set, one line per set of ranks sharing them; where the ranks publish their setup and set none,
    one line saying so."""
    published = [r for r in ranks if r.backend]
    by_switches: dict[tuple, list[RankView]] = {}
    for r in published:
        if r.nccl_switches:
            by_switches.setdefault(tuple(sorted(r.nccl_switches.items())), []).append(r)
    if published and not by_switches:
        return [f"no NCCL switch set on any rank (backend {published[0].backend})"]
    return [
        f"{_ranks_list(group)}: {', '.join(f'{name}={value}' for name, value in switches)} set "
        f"(backend {group[0].backend})"
        for switches, group in by_switches.items()
    ]


def _switches_fix(ranks: list[RankView]) -> str:
    disabled = sorted(
        {name for r in ranks if r.backend != "gloo" for name in r.nccl_switches if name.endswith("_DISABLE")}
    )
    return f"unset {', '.join(disabled)} (a debugging switch that takes the fast path away)" if disabled else ""


def _shm_by_node(snapshot: Snapshot, limits: Thresholds) -> dict[str, tuple[float, int, float]]:
    """node -> (the smallest /dev/shm its ranks report, its ranks, what NCCL needs there), where a rank reports it.
    NCCL's shared-memory transport needs thresholds.SHM_PER_RANK per rank; a gloo job does not use it."""
    found: dict[str, tuple[float, int, float]] = {}
    for node in {r.node for r in snapshot.ranks}:
        on_node = [r for r in snapshot.ranks if r.node == node]
        sizes = [r.shm_bytes for r in on_node if r.shm_bytes is not None]
        if sizes:
            needed = 0.0 if all(r.backend == "gloo" for r in on_node) else len(on_node) * limits.shm_mib_per_rank * MIB
            found[node] = (min(sizes), len(on_node), needed)
    return dict(sorted(found.items()))


def _shm(node: str, shm: float, ranks: int, needed: float) -> str:
    where = f"node {node}" if node else "the node"
    if shm < needed:
        return (
            f"{where}: /dev/shm is {human_bytes(shm)}, smaller than the {human_bytes(needed)} NCCL's "
            f"shared-memory transport needs for its {ranks} rank{'s' if ranks > 1 else ''}"
        )
    return f"{where}: /dev/shm is {human_bytes(shm)}"


def _shm_fix(small: dict[str, float]) -> str:
    if not small:
        return ""
    size = max(1, math.ceil(max(small.values()) / GIB))
    return (
        f"give /dev/shm at least {size} GiB (docker run --shm-size={size}g or --ipc=host; Kubernetes: an emptyDir "
        "with medium: Memory)"
    )


def _pcie_fix(narrowed: list[GpuView]) -> str:
    if not narrowed:
        return ""
    gpus = ", ".join(
        f"GPU {g.index} (gen {g.pcie_generation} x{g.pcie_width} of gen {g.pcie_max_generation} x{g.pcie_max_width})"
        for g in narrowed
    )
    return (
        f"bring the PCIe link of {gpus} to its full speed: reseat the card, move it to a full-width slot, check "
        "the BIOS's lane settings and risers"
    )


def host_bound(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """A GPU that runs out of queued work with batches at hand and no all-reduce to wait for: the host does not
    launch kernels fast enough (trainstack/breakdown.py measures the idle time from NVML's utilization samples)."""
    idle = [
        r for r in snapshot.ranks if r.host_bound_ratio is not None and r.host_bound_ratio > limits.host_bound_ratio
    ]
    if not idle:
        return None

    def evidence(rank: RankView) -> str:
        others = [
            f"{what} {_percent(share)}"
            for what, share in (
                ("starved for data", rank.data_wait_ratio),
                ("waiting on communication", rank.comm_exposed_ratio),
            )
            if share is not None
        ]
        besides = f" (besides: {', '.join(others)})" if others else ""
        return (
            f"rank {rank.rank}: its GPU idled {_percent(rank.host_bound_ratio)} of its step time waiting for the "
            f"host{besides}"
        )

    return Verdict(
        P.HOST_BOUND,
        f"host-bound: {_ranks_list(idle)}: the GPU idles more than "
        f"{_percent(limits.host_bound_ratio)} of its step time although it has data and waits on no communication",
        tuple(evidence(r) for r in idle),
        _fix(P.HOST_BOUND, idle),
    )


def _activity(g: GpuView) -> str:
    figures = [f"SM activity {_percent(g.sm_active)}"]
    figures += [
        f"{what} {_percent(value)}"
        for what, value in (
            ("occupancy", g.sm_occupancy),
            ("tensor-core activity", g.tensor_active),
            ("DRAM bandwidth", g.dram_active),
        )
        if value is not None
    ]
    busy = "" if g.utilization is None else f"utilization {_percent(g.utilization)}, "
    return f"GPU {g.index}: {busy}{', '.join(figures)}"


def _rank_setup(r: RankView, g: GpuView) -> str:
    """What the rank says of how it feeds its GPU: samples per optimizer step, precision, torch.compile."""
    said = []
    if r.samples_per_step is not None:
        said.append(f"{r.samples_per_step:.0f} samples per optimizer step (per-GPU batch x accumulation)")
    if r.mixed_precision:
        said.append(f"mixed precision {r.mixed_precision}")
    if r.compiled is not None:
        said.append(f"torch.compile {'on' if r.compiled else 'off'}")
    return f"rank {r.rank} on GPU {g.index}: {', '.join(said)}" if said else ""


def _memory_bound(g: GpuView, limits: Thresholds) -> str:
    if g.dram_active is None or g.dram_active < limits.memory_bound_dram_ratio:
        return ""
    return (
        f"GPU {g.index}: DRAM bandwidth at {_percent(g.dram_active)} of its maximum while its SMs work: its "
        "kernels wait on memory (memory-bound), which more SMs would not help; fusing kernels cuts the traffic"
    )


def gpu_underused(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """A GPU that reads busy (a kernel runs most of the time) while most of its SMs idle (GPM): too little work per
    kernel. NVML's utilization cannot tell it from a GPU at full work (docs/diagnostics.md, "Busy is not working")."""
    hollow = [
        g
        for g in snapshot.gpus
        if g.utilization is not None
        and g.sm_active is not None
        and g.utilization >= limits.gpu_underused_utilization_ratio
        and g.sm_active < limits.gpu_underused_sm_active_ratio
    ]
    if not hollow:
        return None
    ranks = {r.uuid: r for r in snapshot.ranks if r.uuid}
    evidence: list[str] = []
    on_hollow: list[RankView] = []
    for g in hollow:
        rank = ranks.get(g.uuid)
        on_hollow += [rank] if rank else []
        evidence += filter(None, (_activity(g), _rank_setup(rank, g) if rank else None, _memory_bound(g, limits)))
    fixes = [_fix(P.GPU_UNDERUSED, on_hollow)]
    if any(r.mixed_precision == "no" for r in on_hollow):
        fixes.append(
            _knob(on_hollow, "--mixed-precision bf16", "torch.autocast(device_type='cuda', dtype=torch.bfloat16)")
            + " (bf16 autocast: the tensor cores do the matmuls)"
        )
    if not any(r.compiled for r in on_hollow):
        fixes.append(
            _knob(on_hollow, "--compile", "model = torch.compile(model)")
            + ' (torch.compile fuses small kernels) or CUDA graphs (mode="reduce-overhead"): fewer, larger kernels'
        )
    fixes.append(
        "fewer tiny kernels in the model's code (fused optimizers: AdamW(fused=True); no per-parameter Python loops)"
    )
    return Verdict(
        P.GPU_UNDERUSED,
        f"{len(hollow)} GPU(s) read busy but do little: a kernel runs at least "
        f"{_percent(limits.gpu_underused_utilization_ratio)} of the time while under "
        f"{_percent(limits.gpu_underused_sm_active_ratio)} of their SMs work",
        tuple(evidence),
        "; ".join(fixes),
    )


def no_tensor_cores(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    """A working GPU whose tensor cores stay idle: its matmuls run on the plain fp32 units (fp32 without TF32)."""
    idle = [
        g
        for g in snapshot.gpus
        if g.sm_active is not None
        and g.tensor_active is not None
        and g.sm_active >= limits.no_tensor_cores_sm_active_ratio
        and g.tensor_active < limits.no_tensor_cores_tensor_active_ratio
    ]
    if not idle:
        return None
    ranks = {r.uuid: r for r in snapshot.ranks if r.uuid}
    evidence = []
    for g in idle:
        evidence.append(_activity(g))
        if (rank := ranks.get(g.uuid)) and rank.mixed_precision:
            evidence.append(
                f"rank {rank.rank} on GPU {g.index}: mixed precision {rank.mixed_precision}"
                + (" (fp32 matmuls use the tensor cores only with TF32 on)" if rank.mixed_precision == "no" else "")
            )
    return Verdict(
        P.NO_TENSOR_CORES,
        f"{len(idle)} GPU(s) work without their tensor cores: at least "
        f"{_percent(limits.no_tensor_cores_sm_active_ratio)} of the SMs busy, tensor cores under "
        f"{_percent(limits.no_tensor_cores_tensor_active_ratio)} of the time",
        tuple(evidence),
        _fix(P.NO_TENSOR_CORES, [rank for g in idle if (rank := ranks.get(g.uuid))]),
    )


def throttled(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    evidence = []
    for g in snapshot.gpus:
        if g.thermal_throttle_ratio is not None and g.thermal_throttle_ratio > limits.thermal_throttle_ratio:
            evidence.append(
                f"GPU {g.index}: clocks held down by temperature {_percent(g.thermal_throttle_ratio)} of the time"
            )
        if (
            g.power_throttle_ratio is not None
            and g.power_throttle_ratio > limits.power_throttle_ratio
            and g.sm_clock_ratio is not None
            and g.sm_clock_ratio < limits.power_throttle_clock_ratio
        ):
            evidence.append(
                f"GPU {g.index}: at its power cap {_percent(g.power_throttle_ratio)} of the time, SM "
                f"clock {_percent(g.sm_clock_ratio)} of its maximum"
            )
    if not evidence:
        return None
    return Verdict(
        P.THROTTLED,
        f"{len(evidence)} GPU throttling finding(s): the throttled GPUs' ranks hold up the job",
        tuple(evidence),
        _fix(P.THROTTLED, snapshot.ranks),
    )


def memory_full(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    full = [
        g for g in snapshot.gpus if g.memory_used_ratio is not None and g.memory_used_ratio > limits.memory_full_ratio
    ]
    if not full:
        return None
    return Verdict(
        P.MEMORY_FULL,
        f"GPU memory nearly full on {len(full)} GPU(s) (over {_percent(limits.memory_full_ratio)})",
        tuple(f"GPU {g.index}: {_percent(g.memory_used_ratio)} of its memory used" for g in full),
        f"a longer batch or fragmentation ends in CUDA out of memory: {_fix(P.MEMORY_FULL, snapshot.ranks)}",
    )


def low_mfu(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    measured = [r for r in snapshot.ranks if r.mfu is not None]
    if not measured:
        return None
    mean = statistics.fmean(r.mfu for r in measured if r.mfu is not None)
    if mean >= limits.low_mfu_ratio:
        return None
    return Verdict(
        P.LOW_MFU,
        f"low MFU: the ranks use {_percent(mean)} of the GPUs' peak FLOP/s (under {_percent(limits.low_mfu_ratio)})",
        tuple(f"rank {r.rank}: MFU {_percent(r.mfu)}" for r in measured),
        _fix(P.LOW_MFU, measured),
    )


def gpu_data_stale(snapshot: Snapshot, limits: Thresholds) -> Verdict | None:
    stale = {
        where: (age, interval)
        for where, (age, interval) in snapshot.gpu_sample_ages.items()
        if age > limits.gpu_sample_stale_intervals * interval
    }
    if not stale:
        return None
    return Verdict(
        P.GPU_DATA_STALE,
        f"the exporter's GPU data is stale: no GPU sample for more than "
        f"{limits.gpu_sample_stale_intervals:g} sampling intervals, so the GPU figures here are old",
        tuple(
            f"{where}: sample {age:.0f} s old, read every {interval:g} s"
            for where, (age, interval) in sorted(stale.items())
        ),
        f"an NVML call hangs in the driver or the host is starved of CPU: {_fix(P.GPU_DATA_STALE, snapshot.ranks)}",
    )


CHECKS: tuple[Callable[[Snapshot, Thresholds], Verdict | None], ...] = (
    no_training,
    not_started,
    stalled,
    gpus_unused,
    one_process_many_gpus,
    input_bound,
    straggler,
    comm_bound,
    host_bound,
    gpu_underused,
    no_tensor_cores,
    throttled,
    memory_full,
    low_mfu,
    gpu_data_stale,
)


def diagnose(snapshot: Snapshot, limits: Thresholds) -> list[Verdict]:
    """Every problem found, most fundamental first; empty when the run is healthy."""
    return [verdict for check in CHECKS if (verdict := check(snapshot, limits)) is not None]


def uninstrumented(snapshot: Snapshot) -> str:
    """The note on a job without rank telemetry: what runs, what can be judged, and how to get the rest."""
    if snapshot.command_processes:
        running = f"{snapshot.command_processes} process(es) of the watched command are running"
    elif snapshot.command:
        running = "the watched command has ended"
    else:
        running = "the GPUs are in use"
    judged = "GPU checks only" if snapshot.gpus else "no GPU here, so nothing can be judged"
    return f"uninstrumented: {running} with no rank telemetry ({judged}); {INSTRUMENT_HINT}"


def not_judged(snapshot: Snapshot, limits: Thresholds) -> str | None:
    """Why no rank could be judged, where a job ran but no rank reports telemetry; None where ranks were judged (or
    no job ran: no-training says so). An empty verdict list then means nothing was judged, never healthy."""
    if not _uninstrumented(snapshot, limits):
        return None
    if snapshot.command_processes:
        running = f"{snapshot.command_processes} process(es) of the watched command run"
    elif snapshot.command:
        running = "the watched command ran"
    else:
        running = "the GPUs are in use"
    gpus = "its GPUs were checked alone" if snapshot.gpus else "no GPU here to check"
    return f"{running}, but no rank reports telemetry ({UNSEEN_RANKS}): {gpus}"


def notes(snapshot: Snapshot, limits: Thresholds) -> list[str]:
    """What the reader must know that is no problem of the run: a job that runs but reports no rank telemetry
    gets the GPU verdicts only (none without a GPU), and one line on how to get the others; GPUs without GPM, whose
    checks could not be judged."""
    return ([uninstrumented(snapshot)] if _uninstrumented(snapshot, limits) else []) + _without_gpm(snapshot)


def _without_gpm(snapshot: Snapshot) -> list[str]:
    """GPUs whose exporter says they answer no GPM: the checks that read it cannot judge them; one line per reason."""
    by_reason: dict[str, list[str]] = {}
    for g in snapshot.gpus:
        if g.gpm_supported is False:
            by_reason.setdefault(g.gpm_reason, []).append(g.index)
    return [
        f"GPU {', '.join(indices)}: no GPM ({reason or 'unknown reason'}): gpu-underused and no-tensor-cores "
        "could not be judged there, nor the links' measured traffic"
        for reason, indices in by_reason.items()
    ]


def figures(snapshot: Snapshot) -> dict[str, float | int | str | None]:
    """The figures a healthy verdict shows (and --json always carries)."""
    ranks, gpus = snapshot.ranks, snapshot.gpus

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    waits = {r.rank: r.data_wait_ratio for r in ranks if r.data_wait_ratio is not None}
    exposed = {r.rank: r.comm_exposed_ratio for r in ranks if r.comm_exposed_ratio is not None}
    host_waits = [r.host_data_wait_ratio for r in ranks if r.host_data_wait_ratio is not None]
    clocks = {r.clock for r in ranks}
    beyond = snapshot.straggler_waits()
    last = [r.last_step_time for r in ranks if r.last_step_time]
    return {
        "command_processes": snapshot.command_processes,
        "ranks": len(ranks),
        "steps_per_second": mean(r.steps_per_second for r in ranks),
        "samples_per_second": sum(r.samples_per_second or 0.0 for r in ranks) if ranks else None,
        "data_wait_ratio_max": max(waits.values()) if waits else None,
        "data_wait_clock": clocks.pop() if len(clocks) == 1 else ("mixed" if clocks else None),
        "host_data_wait_ratio_max": max(host_waits) if host_waits else None,
        "straggler_wait_ratio_max": max(beyond.values()) if beyond else None,
        "comm_exposed_ratio_min": min(exposed.values()) if exposed else None,
        "last_step_age_seconds": snapshot.now - max(last) if last else None,
        "mfu_mean": mean(r.mfu for r in ranks),
        "gpus": len(gpus),
        "gpu_utilization_mean": mean(g.utilization for g in gpus),
        "gpu_sm_active_mean": mean(g.sm_active for g in gpus),
        "gpu_tensor_active_mean": mean(g.tensor_active for g in gpus),
        "gpu_dram_active_max": max((g.dram_active for g in gpus if g.dram_active is not None), default=None),
        "gpu_memory_used_ratio_max": max(
            (g.memory_used_ratio for g in gpus if g.memory_used_ratio is not None), default=None
        ),
    }
