"""What a DDP rank says about how its gradient communication is set up (trainstack/telemetry/comm_setup.py): the NCCL
switches in its environment, its process group's backend and the size of /dev/shm, published once with its other
series."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO
from trainstack import catalog
from trainstack.metric_files import merged_metrics

# A one-process DDP rank on gloo that starts timing its all-reduce, as the trainer does, with NCCL switches set.
DDP_RANK = """
import sys
from pathlib import Path
import torch
from trainstack.monitor import Monitor
from trainstack.telemetry.device import RankIdentity

identity = RankIdentity(rank=3, local_rank=0, node="node0", uuid="", run_id="setup", world_size=1, nodes=1,
                        mixed_precision="no", model="builtin:tiny-gpt", dataset="builtin:sequences")
monitor = Monitor(Path(sys.argv[1]), identity, flops_per_token=1.0, peak=None, device=torch.device("cpu"))
torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(sys.argv[1] + ".store", 1), rank=0,
                                     world_size=1)
assert monitor.watch(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4)))
monitor.close()
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="this machine mounts no /dev/shm to measure")
def test_a_ddp_rank_publishes_its_communication_setup_once_it_is_watched(tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONPATH": str(REPO),
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
    }
    env.pop("NCCL_P2P_DISABLE", None)
    env.pop("NCCL_SOCKET_IFNAME", None)
    rank = subprocess.run(
        [sys.executable, "-c", DDP_RANK, str(tmp_path / "run")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rank.returncode == 0, rank.stderr[-3000:]
    samples = {sample.name: sample for family in merged_metrics(metrics_dir) for sample in family.samples}
    assert samples[catalog.TRAIN_COMM_SETUP_INFO.name].labels == {
        "rank": "3",
        "backend": "gloo",
        "nccl_p2p_disable": "",
        "nccl_shm_disable": "1",
        "nccl_ib_disable": "1",
        "nccl_socket_ifname": "",
    }
    shm = samples[catalog.TRAIN_SHM_BYTES.name]
    assert (shm.labels, shm.value) == ({"rank": "3"}, shutil.disk_usage(Path("/dev/shm")).total)
