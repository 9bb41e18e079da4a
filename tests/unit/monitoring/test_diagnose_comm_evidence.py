"""The comm-bound verdict's evidence (monitoring/diagnose/verdicts.py): what the all-reduce carried and at what bus
bandwidth, the links of the ranks' GPUs, the NCCL switches set and the size of /dev/shm, from snapshots; and the
snapshot read from the series that carry them, as the exporter serves them on the NVML fake."""

from __future__ import annotations

import pytest

from tests.helpers.fakes import LIMITS, NOW, CountersSource, Rig, gpu, kinds, rank, render
from trainstack import catalog
from trainstack.monitoring.diagnose.snapshot import Snapshot, read_snapshot
from trainstack.monitoring.diagnose.verdicts import diagnose

MiB = 1 << 20


def comm_rank(name: str, **figures):
    """A DDP rank that waits 50% of its 300 ms step for a 200 ms all-reduce, on GPU-<name>."""
    return rank(name, **{"uuid": f"GPU-{name}", "comm_exposed_ratio": 0.5, "comm_seconds": 0.2, **figures})


def comm_bound(ranks, gpus=()):
    verdicts = diagnose(Snapshot("test", NOW, ranks, list(gpus)), LIMITS)
    assert "comm-bound" in kinds(verdicts)
    return next(v for v in verdicts if v.kind == "comm-bound")


def test_gradient_bytes_per_step_and_the_ring_bus_bandwidth_they_were_carried_at():
    # 100 MB in 200 ms is 500 MB/s of algorithm bandwidth; a ring all-reduce over 4 ranks sends and receives 2*3/4
    # of the data on each rank's link.
    ranks = [comm_rank(str(i), comm_bytes_per_step=100e6, world_size=4) for i in range(4)]
    assert ranks[0].bus_bytes_per_second == pytest.approx(750e6)
    assert comm_bound(ranks).evidence[0] == (
        "rank 0: waits for communication 50% of its step time (150 ms exposed of 200 ms communication per "
        "step); 95.4 MiB communicated per step at 750.0 MB/s bus bandwidth"
    )
    fast = [comm_rank("0", comm_bytes_per_step=10e9, comm_seconds=0.1, world_size=2)]
    assert fast[0].bus_bytes_per_second == pytest.approx(100e9)  # 2*(2-1)/2 = 1: a pair moves every byte once
    assert "at 100.0 GB/s bus bandwidth" in comm_bound(fast).evidence[0]


@pytest.mark.parametrize("figures", [dict(world_size=1), dict(world_size=None), dict(comm_seconds=0.0)])
def test_no_bus_bandwidth_without_peers_or_time(figures):
    assert comm_rank("0", comm_bytes_per_step=1e6, **{"world_size": 2, **figures}).bus_bytes_per_second is None


def test_a_pcie_link_below_its_maximum_is_flagged_and_named_in_the_fix():
    a100 = dict(pcie_generation=4, pcie_width=16, pcie_max_generation=4, pcie_max_width=16, nvlinks_active=0)
    gpus = [gpu(0, **a100), gpu(1, **{**a100, "pcie_width": 8})]
    verdict = comm_bound([comm_rank("0"), comm_rank("1")], gpus)
    assert verdict.evidence[2:4] == (
        "rank 0's GPU 0: no NVLink active (traffic to other GPUs crosses PCIe); PCIe gen 4 x16",
        "rank 1's GPU 1: no NVLink active (traffic to other GPUs crosses PCIe); PCIe gen 4 x8, below its maximum "
        "gen 4 x16",
    )
    assert verdict.fix.startswith("bring the PCIe link of GPU 1 (gen 4 x8 of gen 4 x16) to its full speed")
    nvlinked = comm_bound(
        [comm_rank("0")],
        [gpu(0, pcie_generation=5, pcie_width=16, pcie_max_generation=5, pcie_max_width=16, nvlinks_active=18)],
    )
    assert nvlinked.evidence[1] == "rank 0's GPU 0: 18 NVLinks active; PCIe gen 5 x16"
    assert nvlinked.fix.startswith("fewer all-reduces")  # nothing specific to fix


def test_the_nccl_switches_set_are_listed_and_the_disabling_ones_unset_in_the_fix():
    switches = {"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}
    verdict = comm_bound([comm_rank(str(i), backend="nccl", nccl_switches=switches) for i in range(2)])
    assert "rank 0, rank 1: NCCL_P2P_DISABLE=1, NCCL_SOCKET_IFNAME=eth0 set (backend nccl)" in verdict.evidence
    assert verdict.fix.startswith("unset NCCL_P2P_DISABLE (")
    clean = comm_bound([comm_rank("0", backend="nccl")])
    assert "no NCCL switch set on any rank (backend nccl)" in clean.evidence
    assert not clean.fix.startswith("unset")


def test_a_small_dev_shm_is_flagged_against_what_nccl_needs_for_the_ranks_on_its_node():
    # 96 MiB per NCCL rank (trainstack/thresholds.py, as the doctor): two ranks need 192 MiB; Docker gives 64.
    ranks = [comm_rank(str(i), node="node0", backend="nccl", shm_bytes=64 * MiB) for i in range(2)]
    ranks.append(comm_rank("2", node="node1", backend="nccl", shm_bytes=16 << 30))
    verdict = comm_bound(ranks)
    assert verdict.evidence[-2:] == (
        "node node0: /dev/shm is 64.0 MiB, smaller than the 192.0 MiB NCCL's shared-memory transport needs for its 2 "
        "ranks",
        "node node1: /dev/shm is 16.0 GiB",
    )
    assert verdict.fix.startswith("give /dev/shm at least 1 GiB (docker run --shm-size=1g")
    gloo = [comm_rank("0", node="node0", backend="gloo", shm_bytes=64 * MiB)]  # gloo does not use it
    assert comm_bound(gloo).evidence[-1] == "node node0: /dev/shm is 64.0 MiB"


def test_the_snapshot_reads_the_setup_bytes_and_world_size_per_rank():
    per_rank = [({"rank": "0"}, 2.0), ({"rank": "1"}, 2.0)]
    setup = {
        "rank": "0",
        "backend": "nccl",
        "nccl_p2p_disable": "1",
        "nccl_shm_disable": "0",
        "nccl_ib_disable": "",
        "nccl_socket_ifname": "",
    }
    source = CountersSource(
        {
            "trainstack_train_steps_total": per_rank,
            catalog.TRAIN_RUN_INFO.name: [
                ({"rank": "0", "world_size": "2"}, 1.0),
                ({"rank": "1", "world_size": "2"}, 1),
            ],
            catalog.TRAIN_COMM_SETUP_INFO.name: [(setup, 1.0)],
            catalog.TRAIN_SHM_BYTES.name: [({"rank": "0"}, 64.0 * MiB)],
        },
        {
            "trainstack_train_steps_total": per_rank,
            "trainstack_train_comm_seconds_total": per_rank,
            "trainstack_train_comm_bytes_total": [({"rank": "0"}, 200e6)],
        },
    )
    setup_rank, bare = read_snapshot(source).ranks
    assert (setup_rank.comm_bytes_per_step, setup_rank.world_size, setup_rank.backend) == (100e6, 2, "nccl")
    assert setup_rank.nccl_switches == {"NCCL_P2P_DISABLE": "1"}  # 0 switches NCCL_SHM_DISABLE off
    assert setup_rank.shm_bytes == 64 * MiB
    assert setup_rank.bus_bytes_per_second == pytest.approx(100e6)
    assert (bare.comm_bytes_per_step, bare.backend, bare.nccl_switches, bare.shm_bytes) == (None, "", {}, None)


def rig_source(host) -> CountersSource:
    """The exporter's scrape on the fake `host`, as a Source: sample name -> its series."""
    rig = Rig(host)
    rig.sample()
    instants: dict[str, list] = {}
    for (name, labels), value in render(rig.registry).items():
        instants.setdefault(name, []).append((dict(labels), value))
    return CountersSource(instants, {})


def test_the_snapshot_reads_each_gpus_links_from_the_exporter_on_the_fake_hosts():
    pair = {g.index: g for g in read_snapshot(rig_source("pcie_pair")).gpus}
    assert (pair["0"].pcie_generation, pair["0"].pcie_width, pair["0"].nvlinks_active) == (4, 16, 0)
    assert not pair["0"].pcie_below_max
    assert (pair["1"].pcie_width, pair["1"].pcie_max_width, pair["1"].pcie_below_max) == (8, 16, True)
    dgx = read_snapshot(rig_source("dgx_h100")).gpus[0]
    assert (dgx.pcie_generation, dgx.nvlinks_active, dgx.pcie_below_max) == (5, 18, False)
    mixed = {g.name: g for g in read_snapshot(rig_source("mixed")).gpus}
    assert mixed["Tesla T4"].nvlinks_active is None  # no NVLink at all: the label is empty
