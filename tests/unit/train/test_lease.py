"""The run-directory lease on its own, no training: refusal that writes nothing, joining nodes, stale takeover
(same machine by PID, other machines by heartbeat), takeover races, heartbeats and waiting."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.lease import lease, snapshot
from trainstack.lease_lock import lock
from trainstack.rundir import LEASE_DIR
from trainstack.supervisor.lease import Holder, LeaseHeld, RunDirLease, this_machine


def write_holder(run_dir: Path, node_rank: int = 0, **fields) -> Path:
    """A lease file as a launcher that is no longer here (or elsewhere) left it."""
    record = {
        "run_id": "old-run",
        "node_rank": node_rank,
        "host": "node-a",
        "machine": this_machine(),
        "pid": os.getpid(),
        "pid_started": 0.0,
        "since": time.time() - 100,
        "timeout": 60.0,
        "token": "feedfacefeedface",
        **fields,
    }
    path = run_dir / LEASE_DIR / f"node-{node_rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_held_names_its_holder_and_release_leaves_no_trace(tmp_path):
    run_dir = tmp_path / "a" / "run"
    with lease(run_dir, "run-1") as held:
        held.acquire()
        record = json.loads((run_dir / LEASE_DIR / "node-0.json").read_text())
        assert record["run_id"] == "run-1" and record["pid"] == os.getpid() and record["node_rank"] == 0
        assert Holder(**record).pid_started > 0
    assert not (tmp_path / "a").exists()  # the folders it made for itself, removed again while empty


def test_a_second_run_is_refused_in_one_line_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "summary.json").write_text("{}")
    with lease(run_dir, "first") as first:
        first.acquire()
        before = snapshot(tmp_path)
        mtime = (run_dir / LEASE_DIR / "node-0.json").stat().st_mtime_ns
        with pytest.raises(LeaseHeld) as refused:
            lease(run_dir, "second").acquire()
        assert snapshot(tmp_path) == before
        assert (run_dir / LEASE_DIR / "node-0.json").stat().st_mtime_ns == mtime
    message = str(refused.value)
    assert "\n" not in message
    assert f"PID {os.getpid()}" in message and "run first" in message and "since 20" in message
    assert "--wait-for-lease" in message and "--output-dir" in message


def test_nodes_of_one_run_share_the_directory_and_another_run_is_refused_by_any_node(tmp_path):
    run_dir = tmp_path / "run"
    node0, node1 = lease(run_dir, "job-uid", 0), lease(run_dir, "job-uid", 1)
    node0.acquire()
    node1.acquire()
    with pytest.raises(LeaseHeld, match="run job-uid"):
        lease(run_dir, "other", 1).acquire()
    node0.release()  # node 1 still writes: another run stays out
    with pytest.raises(LeaseHeld, match="node 1"):
        lease(run_dir, "other", 0).acquire()
    node1.release()
    with lease(run_dir, "other") as later:
        later.acquire()


def test_a_second_launcher_for_the_same_node_of_the_same_run_is_refused(tmp_path):
    """A replacement pod gets the same run id (the Job's uid) and node rank: it must wait for the old pod."""
    with lease(tmp_path, "job-uid", 0) as old:
        old.acquire()
        with pytest.raises(LeaseHeld):
            lease(tmp_path, "job-uid", 0).acquire()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    write_holder(tmp_path, pid=os.getpid(), pid_started=1.0)  # this PID runs, but started long after 1970
    said = []
    with lease(tmp_path, "new-run", said=said) as taker:
        taker.acquire()
    assert "is gone" in said[0]


def test_a_holder_on_another_machine_is_judged_by_its_heartbeat(tmp_path):
    path = write_holder(tmp_path, machine="another-boot/pid:[1]", host="node-b")
    now = [time.time()]
    clock = lambda: now[0]  # noqa: E731
    with pytest.raises(LeaseHeld, match="host node-b"):
        lease(tmp_path, "new-run", clock=clock, timeout=30).acquire()
    now[0] = path.stat().st_mtime + 61  # past its own timeout (60) too: a reader uses the longer of the two
    said = []
    with lease(tmp_path, "new-run", said=said, clock=clock, timeout=30) as taker:
        taker.acquire()
    assert "no heartbeat for 61 s (timeout 60 s)" in said[0]


def test_a_held_flock_keeps_a_holder_alive_whatever_else_says(tmp_path):
    with lease(tmp_path, "holder") as held:
        held.acquire()
        forgetful = lease(tmp_path, "new-run", alive=lambda pid, started: False, clock=lambda: time.time() + 3600)
        # The launcher's PID gone, its lock held: CPU ranks forked with the lease's file, still stopping.
        with pytest.raises(LeaseHeld, match=r"whose processes still hold it while they stop \(its PID is gone\);"):
            forgetful.acquire()
        with pytest.raises(LeaseHeld) as alive_holder:
            lease(tmp_path, "new-run").acquire()
        assert "its PID is gone" not in str(alive_holder.value)


def test_a_live_launchers_lease_is_shared_by_the_processes_it_starts(tmp_path):
    with lease(tmp_path, "holder") as held:
        held.acquire()
        rank = os.open(held.path, os.O_RDONLY)
        try:
            assert lock(rank, fcntl.LOCK_SH, blocking_tries=0)  # the launcher's own lock is shared too
        finally:
            os.close(rank)


def test_a_process_sharing_a_gone_launchers_lease_keeps_it_until_it_ends(tmp_path):
    path = write_holder(tmp_path, pid_started=1.0)  # its launcher is gone (this PID started long after 1970)
    rank = os.open(path, os.O_RDONLY)  # a rank started afresh, still saving: `hold_for_life`'s lock
    try:
        assert lock(rank, fcntl.LOCK_SH, blocking_tries=0)
        with pytest.raises(LeaseHeld, match="whose processes still hold it while they stop"):
            lease(tmp_path, "new-run").acquire()
        assert path.exists()
    finally:
        os.close(rank)
    said = []
    with lease(tmp_path, "new-run", said=said) as taker:
        taker.acquire()
    assert "its PID" in said[0] and "is gone" in said[0]


def test_another_launchers_probe_of_a_stale_lease_is_no_sign_of_life(tmp_path):
    """A launcher judging a lease file locks it for a moment, as each probe does; a second taker that met that
    lock must not take it for a live holder (two takers each seeing the other's probe both backed off)."""
    probe = os.open(write_holder(tmp_path, pid=2**22 + 7), os.O_RDWR)  # no such PID: stale
    fcntl.flock(probe, fcntl.LOCK_EX)
    threading.Timer(0.03, os.close, args=(probe,)).start()
    with lease(tmp_path, "taker") as taker:
        taker.acquire()
        assert json.loads((tmp_path / LEASE_DIR / "node-0.json").read_text())["run_id"] == "taker"


def _race(takers: dict[str, RunDirLease]) -> dict[str, str]:
    """Both acquire at the same instant; each ends "held" or "refused"."""
    start, outcomes = threading.Barrier(len(takers)), {}

    def take(name):
        start.wait()
        try:
            takers[name].acquire()
            outcomes[name] = "held"
        except LeaseHeld:
            outcomes[name] = "refused"

    threads = [threading.Thread(target=take, args=(name,)) for name in takers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_two_takers_of_one_stale_lease_never_both_win(tmp_path):
    for attempt in range(10):
        run_dir = tmp_path / str(attempt)
        write_holder(run_dir, pid=2**22 + 7)  # no such PID: stale
        takers = {name: lease(run_dir, name) for name in ("a", "b")}
        outcomes = _race(takers)
        assert sorted(outcomes.values()) == ["held", "refused"], outcomes
        for taker in takers.values():
            taker.release()


def test_two_runs_starting_at_once_on_different_nodes_never_both_hold(tmp_path):
    for attempt in range(10):
        run_dir = tmp_path / str(attempt)
        takers = {"a": lease(run_dir, "a", 0), "b": lease(run_dir, "b", 1)}
        outcomes = _race(takers)
        assert list(outcomes.values()).count("held") <= 1, outcomes  # both may back off; never both hold
        for taker in takers.values():
            taker.release()


def test_a_takeover_leaves_a_file_that_changed_since_it_was_judged(tmp_path):
    stale = Holder(**json.loads(write_holder(tmp_path, token="0" * 16).read_text()))
    write_holder(tmp_path, token="1" * 16)  # a newer holder took it meanwhile
    taker = lease(tmp_path, "taker")
    assert taker._take_over(tmp_path / LEASE_DIR / "node-0.json", stale, "test", 0.0) is False
    assert json.loads((tmp_path / LEASE_DIR / "node-0.json").read_text())["token"] == "1" * 16


def test_the_heartbeat_touches_the_file_while_held(tmp_path):
    with lease(tmp_path, "beating", timeout=0.6) as held:  # a beat every 0.05 s
        held.acquire()
        path = tmp_path / LEASE_DIR / "node-0.json"
        os.utime(path, (0, 0))
        deadline = time.monotonic() + 10
        while path.stat().st_mtime == 0:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.02)
        assert abs(path.stat().st_mtime - time.time()) < 5


def test_waiting_says_so_once_then_takes_the_released_lease(tmp_path):
    first = lease(tmp_path, "first")
    first.acquire()
    threading.Timer(1.5, first.release).start()
    said = []
    with lease(tmp_path, "second", said=said) as second:
        second.acquire(wait=60)
        assert json.loads((tmp_path / LEASE_DIR / "node-0.json").read_text())["run_id"] == "second"
    assert len(said) == 1 and "waiting up to 60 s" in said[0]


def test_waiting_gives_up_after_the_time_given(tmp_path):
    with lease(tmp_path, "first") as first:
        first.acquire()
        started = time.monotonic()
        with pytest.raises(LeaseHeld):
            lease(tmp_path, "second").acquire(wait=0.5)
        assert time.monotonic() - started >= 0.5


def test_a_fresh_start_sets_an_earlier_attempts_record_aside_and_a_resume_keeps_it(tmp_path):
    from trainstack.commands.train import Launch
    from trainstack.train.launcher.launch_config import LaunchConfig
    from trainstack.train.rank.config import TrainConfig

    launch = LaunchConfig(
        nproc_per_node=2,
        nnodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        use_cpu=True,
        exporter_port=0,
        exporter_host="127.0.0.1",
        rendezvous_timeout=1.0,
    )
    config = TrainConfig(output_dir=str(tmp_path))
    old = {
        "telemetry/rank-0.jsonl": b'{"time": 1}\n',
        "telemetry/rank-1.jsonl": b'{"time": 2}\n',
        "summary.json": b"{}",
        "report.html": b"<html>",
        "config.yaml": b"mine: the user's own\n",  # a fresh start never writes over it
    }
    for name, data in old.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    Launch(config, launch, tmp_path / "checkpoints/step-00000005", "resumed").prepare_run_dir()
    resumed = {name: (tmp_path / name).read_bytes() for name in old if name != "config.yaml"}
    assert resumed == {name: data for name, data in old.items() if name != "config.yaml"}  # a resume appends
    (tmp_path / "config.yaml").write_bytes(old["config.yaml"])
    Launch(config, launch, None, "fresh").prepare_run_dir()
    aside = tmp_path / "previous" / "before-fresh"
    assert {name: (aside / name).read_bytes() for name in old} == old
    assert not any((tmp_path / name).exists() for name in old if name != "config.yaml")
    assert (tmp_path / "config.yaml").read_bytes() != old["config.yaml"]  # this run's own, the user's kept aside
