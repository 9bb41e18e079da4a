"""What a DDP rank says about its gradient communication, read in this process: the NCCL switches set and unset,
and no shared-memory file system (a real rank's series: tests/process/test_comm_setup.py)."""

from __future__ import annotations

import shutil

from trainstack.telemetry.comm_setup import CommSetup


def test_the_nccl_switches_set_are_read_and_the_unset_ones_are_empty(tmp_path):
    setup = CommSetup.read({"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}, str(tmp_path))
    assert setup.switches == {
        "nccl_p2p_disable": "1",
        "nccl_shm_disable": "",
        "nccl_ib_disable": "",
        "nccl_socket_ifname": "eth0",
    }
    assert setup.backend == ""  # no process group in this process
    assert setup.shm_bytes == shutil.disk_usage(tmp_path).total


def test_no_shared_memory_file_system_is_absent_not_zero(tmp_path):
    assert CommSetup.read({}, str(tmp_path / "no-shm")).shm_bytes is None
