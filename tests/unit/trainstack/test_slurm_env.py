"""trainstack/slurm.py: Slurm's environment as the launcher's world, from environments like those a real Slurm sets
(tests/process/test_slurm.py reads them from a real one). No process: the host list is expanded in Python here."""

from __future__ import annotations

import argparse
import errno
import socket

import pytest

from trainstack.errors import ConfigError
from trainstack.rundir import bind_error
from trainstack.slurm import (
    EXPORTER_JOB_SLOTS,
    EXPORTER_NODE_SLOTS,
    EXPORTER_PORT_BASE,
    MASTER_PORT_BASE,
    MASTER_PORT_SPAN,
    SlurmWorld,
    expand_hostlist,
    exporter_port_of,
    master_port_of,
    tasks_per_node,
)
from trainstack.train.launcher import launch_config

# A step's task on the second node of a 2-node job, as slurm-wlm 22.05 sets it under `srun` (trimmed).
STEP_ON_N2 = {
    "SLURMD_NODENAME": "n2",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
}


def world(environ: dict[str, str]) -> SlurmWorld | None:
    return SlurmWorld.from_environ(environ, expand=expand_hostlist)


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3,5],gpu-[01-02]", ["n1", "n2", "n3", "n5", "gpu-01", "gpu-02"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("n[01-3]", ["n01", "n02", "n03"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a[1]-ib,b", ["a1-ib", "b"]),
        ("host0 host1", ["host0", "host1"]),
        ("x-[3-4].cluster", ["x-3.cluster", "x-4.cluster"]),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["n[1-2", "n1-2]", "n[2-1]", "n[a-b]", "n[1-]", "n1,,n2", "", "n[]"])
def test_a_malformed_hostlist_is_one_config_error(bad):
    with pytest.raises(ConfigError) as error:
        expand_hostlist(bad)
    assert "\n" not in str(error.value) and "hostlist" in str(error.value)


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("1") == [1]
    with pytest.raises(ConfigError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node("2(x)")


def test_a_step_task_on_the_second_node():
    found = world(STEP_ON_N2)
    assert found == SlurmWorld(
        job_id=4242,
        node_rank=1,
        nnodes=2,
        hosts=("n1", "n2"),
        master_port=MASTER_PORT_BASE + 4242,
        tasks_on_node=1,
        gpus_on_node=None,
        node_name="n2",
        restart_count=0,
        in_step=True,
    )
    assert found.master_addr == "n1"
    found.check_launchable()


def test_a_step_on_some_of_the_jobs_nodes_is_a_world_of_its_own():
    # `srun -N1 -w n2` in a 2-node job, as slurm-wlm 22.05 sets it: SLURM_NODEID counts within the step.
    environ = {**STEP_ON_N2, "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1"}
    environ.update(SLURM_STEP_NODELIST="n2", SLURM_STEP_TASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1")
    found = world(environ)
    assert found is not None
    assert (found.nnodes, found.node_rank, found.hosts, found.master_addr) == (1, 0, ("n2",), "n2")


def test_nnodes_falls_back_to_slurm_nnodes_and_the_restart_count_is_read():
    environ = {**STEP_ON_N2, "SLURM_RESTART_COUNT": "3"}
    del environ["SLURM_JOB_NUM_NODES"], environ["SLURM_STEP_NUM_NODES"]
    found = world(environ)
    assert found is not None and found.nnodes == 2 and found.restart_count == 3


def test_outside_slurm_or_under_torchrun_there_is_no_slurm_world():
    assert world({"PATH": "/bin"}) is None
    torchrun_rank = {**STEP_ON_N2, "RANK": "3", "GROUP_RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert world(torchrun_rank) is None
    # One of torchrun's names alone (a user's RANK) is not torchrun.
    assert world({**STEP_ON_N2, "RANK": "3"}) is not None


@pytest.mark.parametrize(
    ("extra", "gpus"),
    [
        ({}, None),
        ({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1"}, 4),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
    ],
)
def test_gpus_on_node(extra, gpus):
    found = world({**STEP_ON_N2, **extra})
    assert found is not None and found.gpus_on_node == gpus


def test_master_port_is_derived_from_the_job_id_in_an_unprivileged_range_below_the_ephemeral_ports():
    assert master_port_of(0) == MASTER_PORT_BASE
    assert master_port_of(123456) == MASTER_PORT_BASE + 3456
    ports = {master_port_of(job) for job in range(1, 3 * MASTER_PORT_SPAN)}
    assert min(ports) >= 1024 and max(ports) < 32768  # Linux's ephemeral range starts at 32768
    assert master_port_of(7) != master_port_of(8)  # neighbouring jobs on one node do not collide


def test_exporter_ports_are_distinct_per_node_and_per_job_in_their_own_range():
    assert exporter_port_of(0, 0) == EXPORTER_PORT_BASE
    assert exporter_port_of(4242, 1) == EXPORTER_PORT_BASE + (4242 % 550) * 8 + 1
    ports = {exporter_port_of(job, node) for job in range(3 * EXPORTER_JOB_SLOTS) for node in range(64)}
    assert min(ports) >= 1024 and max(ports) < 32768  # above the privileged ports, below Linux's ephemeral range
    assert max(ports) < 29400  # below torchrun's c10d (29400) and static (29500) rendezvous defaults
    masters = {master_port_of(job) for job in range(MASTER_PORT_SPAN)}
    assert not ports & masters and not ports & {29400, 29500, 9450}
    # The nodes of one job that share a host (the test cluster's two slurmd) each have their own port.
    job = [exporter_port_of(4242, node) for node in range(EXPORTER_NODE_SLOTS)]
    assert len(set(job)) == EXPORTER_NODE_SLOTS
    # Jobs side by side on one host: whatever their nodes' ranks, neighbouring ids never share a port.
    neighbours = [exporter_port_of(job, node) for job in range(4240, 4250) for node in range(EXPORTER_NODE_SLOTS)]
    assert len(set(neighbours)) == len(neighbours)
    assert exporter_port_of(4242, 0) == exporter_port_of(4242 + EXPORTER_JOB_SLOTS, 0)  # the documented collision


def test_the_port_probe_tells_a_port_in_use_from_a_free_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert bind_error("127.0.0.1", taken.getsockname()[1]).errno == errno.EADDRINUSE
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert bind_error("127.0.0.1", port) is None
    ipv6 = bind_error("::1", port)  # an IPv6 address is probed as one, on a host with IPv6 or without
    assert ipv6 is None or ipv6.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def test_a_port_whose_last_connections_linger_is_free():
    # A requeued segment's node 0 checks the port its previous segment's rendezvous store listened on: that
    # store's connections linger in TIME_WAIT, and the store binds with SO_REUSEADDR, as this listener does.
    # A plain bind fails on them; the store's own bind, and so the probe, does not (the test cluster's requeued
    # segment was refused before the probe set it).
    with socket.socket() as store:
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = store.accept()
            accepted.close()  # the store's side closes first: its end lingers in TIME_WAIT
    assert bind_error("", port) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 must be in 0..1"),
        ({"SLURM_NODEID": "-1"}, "SLURM_NODEID='-1' must be 0 or more"),
        ({"SLURM_STEP_NUM_NODES": "0"}, "SLURM_STEP_NUM_NODES='0' must be 1 or more"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "node list names 2 host(s) but its node count is 3"),
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' must be a whole number"),
        ({"SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE='two' must be a whole number"),
        ({"SLURM_RESTART_COUNT": "-2"}, "SLURM_RESTART_COUNT='-2' must be 0 or more"),
        ({"SLURM_STEP_NODELIST": "n[1-2"}, "'[' without ']'"),
        ({"SLURM_STEP_NODELIST": "", "SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""}, "SLURM_JOB_NODELIST is not"),
        ({"SLURM_STEP_TASKS_PER_NODE": "x"}, "is not like 2(x3),1"),
    ],
)
def test_nonsense_is_one_config_error_line(change, message):
    with pytest.raises(ConfigError) as error:
        world({**STEP_ON_N2, **change})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_batch_script_of_a_multi_node_job_is_refused_but_of_a_one_node_job_is_not():
    batch = {k: v for k, v in STEP_ON_N2.items() if not k.startswith(("SLURM_STEP", "SLURM_STEPID"))}
    batch.update(SLURMD_NODENAME="n1", SLURM_NODEID="0")
    found = world(batch)
    assert found is not None and not found.in_step
    with pytest.raises(ConfigError, match="srun --ntasks-per-node=1"):
        found.check_launchable()
    single = {**batch, "SLURM_JOB_NODELIST": "n1", "SLURM_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}
    single.update(SLURM_NNODES="1", SLURM_TASKS_PER_NODE="1")
    alone = world(single)
    assert alone is not None
    alone.check_launchable()


def test_two_tasks_on_a_node_are_refused():
    found = world({**STEP_ON_N2, "SLURM_STEP_TASKS_PER_NODE": "2(x2)"})
    assert found is not None and found.tasks_on_node == 2
    with pytest.raises(ConfigError, match="one task per node"):
        found.check_launchable()


def test_a_heterogeneous_layout_is_read_for_this_node():
    found = world({**STEP_ON_N2, "SLURM_STEP_TASKS_PER_NODE": "4,1"})
    assert found is not None and found.tasks_on_node == 1


def test_describe_is_one_line():
    found = world({**STEP_ON_N2, "SLURM_GPUS_ON_NODE": "8"})
    assert found is not None
    assert found.describe() == (
        f"slurm job 4242 node 1/2 (n2) master n1:{MASTER_PORT_BASE + 4242} tasks 1 gpus 8 restarts 0 step yes"
    )


# ---- the launcher's world under Slurm (train/launcher/launch_config.py) -----------------------------------------

WORLD_VARIABLES = ("NNODES", "PET_NNODES", "NODE_RANK", "PET_NODE_RANK", "JOB_COMPLETION_INDEX", "MASTER_ADDR")
WORLD_VARIABLES += ("PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT", "NPROC_PER_NODE", "PET_NPROC_PER_NODE")


def in_environ(monkeypatch, environ: dict[str, str]) -> None:
    """`environ` the process's world alone (no other Slurm or torchrun variable), its host list expanded in Python."""
    import os

    import trainstack.slurm

    for name in list(os.environ):
        if name.startswith("SLURM") or name in WORLD_VARIABLES or name in ("RANK", "GROUP_RANK", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(trainstack.slurm, "scontrol_hostnames", lambda hostlist: None)


def launch_world(monkeypatch, environ: dict[str, str], *flags: str, no_exporter: bool = True):
    """The launcher's world (LaunchConfig.from_args) for `flags` in `environ` alone, the host list expanded in
    Python (no scontrol process); no exporter (--exporter-port 0) unless `flags` name a port or no_exporter is
    False."""
    from trainstack.train.launcher.launch_config import LaunchConfig, add_arguments

    in_environ(monkeypatch, environ)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    exporter = [] if "--exporter-port" in flags or not no_exporter else ["--exporter-port", "0"]
    return LaunchConfig.from_args(parser.parse_args(["--cpu", *exporter, *flags]))


def test_the_launcher_takes_the_slurm_jobs_world(monkeypatch):
    found = launch_world(monkeypatch, STEP_ON_N2)
    assert (found.nnodes, found.node_rank, found.master_addr, found.master_port) == (2, 1, "n1", 15000 + 4242)
    assert found.nproc_per_node == 2  # the CPU stand-in's two ranks: GPUs come from the node, as without Slurm


def test_flags_and_torchruns_variables_win_over_slurms(monkeypatch):
    environ = {**STEP_ON_N2, "MASTER_ADDR": "head.example", "NODE_RANK": "0"}
    found = launch_world(monkeypatch, environ, "--master-port", "29999")
    assert (found.nnodes, found.node_rank, found.master_addr, found.master_port) == (2, 0, "head.example", 29999)
    assert launch_world(monkeypatch, STEP_ON_N2, "--nnodes", "1", "--node-rank", "0").nnodes == 1


def test_the_launcher_refuses_a_multi_node_jobs_batch_script(monkeypatch):
    batch = {k: v for k, v in STEP_ON_N2.items() if not k.startswith(("SLURM_STEP", "SLURM_STEPID"))}
    batch.update(SLURMD_NODENAME="n1", SLURM_NODEID="0")
    with pytest.raises(ConfigError, match="srun --ntasks-per-node=1"):
        launch_world(monkeypatch, batch)


def test_a_one_node_slurm_job_takes_a_free_port(monkeypatch):
    single = {**STEP_ON_N2, "SLURM_JOB_NODELIST": "n1", "SLURM_NODELIST": "n1", "SLURM_NODEID": "0"}
    single.update(SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURMD_NODENAME="n1", SLURM_STEP_TASKS_PER_NODE="1")
    single.update(SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="n1")
    found = launch_world(monkeypatch, single)
    assert (found.nnodes, found.node_rank, found.master_addr) == (1, 0, "n1")
    assert found.master_port != master_port_of(4242)  # the OS's pick, from its ephemeral range


def test_node_0_refuses_a_derived_port_in_use(monkeypatch):
    for job_id in range(4242, 4262):  # a derived port nobody else holds on this machine
        with socket.socket() as taken:
            try:
                taken.bind(("127.0.0.1", master_port_of(job_id)))
            except OSError:
                continue
            taken.listen()
            node_0 = {**STEP_ON_N2, "SLURM_JOB_ID": str(job_id), "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1"}
            with pytest.raises(ConfigError) as error:
                launch_world(monkeypatch, node_0)
            assert f"port {master_port_of(job_id)}, the rendezvous port of Slurm job {job_id}, is in use" in str(
                error.value
            )
            # Node 1 does not listen there: the port is node 0's to check.
            assert launch_world(monkeypatch, {**node_0, "SLURM_NODEID": "1"}).master_port == master_port_of(job_id)
            return
    pytest.fail("no derived port was free to hold")


def test_each_node_of_a_slurm_job_derives_its_own_exporter_port_unless_one_is_given(monkeypatch):
    node_0 = {**STEP_ON_N2, "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1"}
    for environ, node in ((node_0, 0), (STEP_ON_N2, 1)):
        found = launch_world(monkeypatch, environ, no_exporter=False)
        if found.exporter_port != exporter_port_of(4242, node):  # held by something else on this machine
            pytest.skip(f"port {exporter_port_of(4242, node)} is in use here")
        assert found.slurm is not None and found.slurm.node_rank == node
    assert launch_world(monkeypatch, STEP_ON_N2, "--exporter-port", "9999").exporter_port == 9999
    # The node's rank as the launcher takes it: a flag wins over SLURM_NODEID, for the port too.
    assert launch_world(monkeypatch, STEP_ON_N2, "--node-rank", "0", no_exporter=False).exporter_port == (
        exporter_port_of(4242, 0)
    )
    assert launch_world(monkeypatch, {}, no_exporter=False).exporter_port == 9450  # outside Slurm: the default


def test_a_derived_exporter_port_in_use_is_one_line_naming_the_port_the_node_and_the_flag(monkeypatch):
    for job_id in range(4242, 4262):  # a derived port nobody else holds on this machine
        port = exporter_port_of(job_id, 1)
        with socket.socket() as taken:
            try:
                taken.bind(("127.0.0.1", port))
            except OSError:
                continue
            taken.listen()
            environ = {**STEP_ON_N2, "SLURM_JOB_ID": str(job_id)}
            with pytest.raises(ConfigError) as error:
                launch_world(monkeypatch, environ, no_exporter=False)
            line = str(error.value)
            assert f"port {port}, the exporter port of Slurm job {job_id} on node 1 (n2), is in use" in line
            assert "--exporter-port" in line and "\n" not in line
            # Bound to every address, the exporter would collide with a listener on one of them too.
            with pytest.raises(ConfigError, match=f"port {port}"):
                launch_world(monkeypatch, environ, "--exporter-host", "0.0.0.0", no_exporter=False)
            return
    pytest.fail("no derived port was free to hold")


def test_the_doctor_shows_a_derived_port_in_use_as_a_fail_beside_its_other_checks(monkeypatch, capsys):
    """Where the launcher refuses in one line, `trainstack doctor` (run beside the job's launcher, whose exporter
    and rendezvous hold their ports) reports: a FAIL line for each port with the job's fix, its table whole, exit 2."""
    from trainstack.errors import EXIT_CONFIG
    from trainstack.train.launcher import doctor
    from trainstack.train.launcher.doctor import cli
    from trainstack.train.launcher.doctor.port_checks import check_exporter_port, check_rendezvous_port

    for job_id in range(4242, 4262):  # derived ports nobody else holds on this machine
        rendezvous, exporter = master_port_of(job_id), exporter_port_of(job_id, 0)
        with socket.socket() as taken_rendezvous, socket.socket() as taken_exporter:
            try:
                taken_rendezvous.bind(("", rendezvous))
                taken_exporter.bind(("127.0.0.1", exporter))
            except OSError:
                continue
            taken_rendezvous.listen()
            taken_exporter.listen()
            in_environ(monkeypatch, {**STEP_ON_N2, "SLURM_JOB_ID": str(job_id), "SLURM_NODEID": "0"})
            # The port checks alone: the others ask this machine's GPUs, disks and Slurm
            monkeypatch.setattr(
                doctor,
                "run_checks",
                lambda config: [check(config, None) for check in (check_rendezvous_port, check_exporter_port)],
            )
            parser = argparse.ArgumentParser()
            cli.add_arguments(parser)
            assert cli.run(parser.parse_args(["--cpu", "--exporter-host", "127.0.0.1"])) == EXIT_CONFIG
            table = capsys.readouterr().out
            assert f"*:{rendezvous} is already in use" in table and f"127.0.0.1:{exporter} is already in use" in table
            # The fixes are the job's: every node needs the one rendezvous port, and the holder may be its launcher
            assert "export MASTER_PORT=<a port free on node 0> in the batch script" in table
            assert "else pass --exporter-port <a free port>" in table and "stop that process" not in table
            assert table.rstrip().endswith("doctor: 0 PASS, 0 WARN, 2 FAIL")
            return
    pytest.fail("no derived ports were free to hold")


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (OSError(errno.EADDRINUSE, "Address already in use"), "is in use: pass --exporter-port <a free port>"),
        (OSError(errno.EADDRNOTAVAIL, "Cannot assign"), "--exporter-host 10.1.2.3 is not an address of n2: pass one"),
        (socket.gaierror(-2, "Name or service not known"), "--exporter-host 10.1.2.3 is not an address of n2"),
        (OSError(errno.EAFNOSUPPORT, "Address family not supported"), "cannot open 10.1.2.3 port"),
    ],
)
def test_a_derived_exporter_port_that_cannot_be_opened_says_why_in_one_line(monkeypatch, error, message):
    """A port taken, a host that is not this node's (before, both read as "in use"), a port this user may not
    open: each its own line. The probe is replaced: no address but loopback is bound in tests."""
    monkeypatch.setattr(launch_config, "bind_error", lambda host, port: error)
    args = argparse.Namespace(exporter_port=None, exporter_host="10.1.2.3")
    with pytest.raises(ConfigError) as refused:
        launch_config.exporter_port(args, world(STEP_ON_N2), 1)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--nproc-per-node", "0"), "--nproc-per-node must be at least 1, got 0"),  # never taken for "not given"
        (("--nnodes", "0"), "--nnodes must be at least 1, got 0"),
        (("--rendezvous-timeout", "-1"), "--rendezvous-timeout must be positive seconds, got -1"),
    ],
)
def test_a_zero_or_negative_world_flag_is_refused_not_taken_for_the_default(monkeypatch, flags, message):
    with pytest.raises(ConfigError, match=message):
        launch_world(monkeypatch, {}, *flags)
