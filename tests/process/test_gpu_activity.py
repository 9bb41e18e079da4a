"""GPM on a real Hopper GPU (marked gpu): tiny fp32 matmuls read hollow and large bf16 ones really busy, through
the rank's reader, the exporter's scrape and diagnose (the records on the NVML fake: tests/unit/monitoring/)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trainstack.telemetry.device import device_uuid
from trainstack.telemetry.gpu_activity import GpuActivity

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (9, 0)


def busy_loop(size: int, dtype: torch.dtype, stop: threading.Event) -> None:
    """Chains of `size` matmuls replayed as a CUDA graph: no launch gaps, so utilization reads near 100% whatever
    the size, while a small fp32 matmul keeps a few SMs busy and a large bf16 one all of them, on tensor cores."""
    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype) / size**0.5
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS picks and loads its kernels)
        (a @ b).tanh()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x = a
        for _ in range(200):
            x = (x @ b).tanh()
    while not stop.is_set():
        graph.replay()
        torch.cuda.synchronize()


def measured(size: int, dtype: torch.dtype):
    """The rank's reader and the exporter's scrape, through diagnose, while the GPU runs `size` matmuls in `dtype`."""
    import pynvml

    from tests.helpers.fakes import CountersSource
    from trainstack.monitoring.diagnose.snapshot import read_snapshot
    from trainstack.monitoring.diagnose.verdicts import diagnose
    from trainstack.monitoring.exporter.gpu import GpuCollector
    from trainstack.monitoring.exporter.nvml import NvmlSession
    from trainstack.monitoring.exporter.sampler import Sampler
    from trainstack.thresholds import Thresholds

    stop = threading.Event()
    worker = threading.Thread(target=busy_loop, args=(size, dtype, stop))
    worker.start()
    try:
        time.sleep(1.0)  # past the warm-up
        activity = GpuActivity.open(device_uuid(torch.device("cuda", 0)))
        session = NvmlSession(pynvml)
        sampler = Sampler(session, 1.0, 30.0)
        sampler.sample_now(slow=True)
        time.sleep(2.0)
        sampler.sample_now(slow=False)
        fields = activity.read()
        instants: dict[str, list] = {}
        for family in GpuCollector(sampler).collect():
            for sample in family.samples:
                instants.setdefault(sample.name, []).append((sample.labels, sample.value))
        verdicts = diagnose(read_snapshot(CountersSource(instants, {})), Thresholds())
        activity.close()
        session.close()
        return fields, [v.kind for v in verdicts]
    finally:
        stop.set()
        worker.join()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of the Hopper generation or newer (GPM)")
def test_on_a_hopper_gpu_tiny_fp32_work_reads_hollow_and_large_bf16_work_really_busy():
    tiny, tiny_verdicts = measured(64, torch.float32)
    assert tiny["sm_active_ratio"] < 0.5 and tiny["tensor_active_ratio"] < 0.02, tiny
    assert "gpu-underused" in tiny_verdicts, tiny_verdicts
    large, large_verdicts = measured(8192, torch.bfloat16)
    assert large["sm_active_ratio"] > 0.8 and large["tensor_active_ratio"] > 0.3, large
    assert not {"gpu-underused", "no-tensor-cores"} & set(large_verdicts), large_verdicts
