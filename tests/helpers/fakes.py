"""Stand-ins that need no GPU and start nothing: a GPU's stream and events, a DDP model's hook registration, the
exporter's NVML rig on the fake host, diagnose's views and sources."""

from __future__ import annotations

import json

import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import trainstack.monitoring.nvml_fake as fake
from tests.helpers.runs import REPO
from trainstack.monitoring.diagnose.snapshot import GpuView, RankView
from trainstack.monitoring.exporter.app import build_registry
from trainstack.monitoring.exporter.config import ExporterConfig
from trainstack.monitoring.exporter.nvml import NvmlSession
from trainstack.monitoring.exporter.sampler import Sampler
from trainstack.telemetry.device import RankIdentity
from trainstack.thresholds import Thresholds


class FakeGpu:
    """A host clock and one stream: work queued at host time t starts when the stream is free and t has come."""

    def __init__(self) -> None:
        self.host = 0.0
        self.stream_free = 0.0
        self.events_made = 0
        self.synchronized = 0

    def host_works(self, seconds: float) -> None:
        self.host += seconds

    def queue(self, seconds: float) -> None:
        self.stream_free = max(self.stream_free, self.host) + seconds

    def drain(self) -> None:
        """The host blocks until the stream has run everything queued (a blocking copy, .item())."""
        self.host = max(self.host, self.stream_free)

    def new_event(self) -> FakeEvent:
        self.events_made += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu
        self.time: float | None = None

    def record(self) -> None:
        self.gpu.stream_free = self.time = max(self.gpu.stream_free, self.gpu.host)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.time is not None and end.time is not None, "elapsed_time of an event never recorded"
        return 1000 * (end.time - self.time)

    def synchronize(self) -> None:
        self.gpu.synchronized += 1
        self.gpu.host = max(self.gpu.host, self.time)


class Rig:
    """An NVML session, sampler and registry on the fake `host`, as the exporter builds them, with the sampler on a
    clock the test moves. By default the slow fields and GPM are read at every sample, as every scrape read them
    before."""

    def __init__(self, host, pcie_throughput=False, interval=1.0, slow_interval=1.0, gpm_interval=0.0):
        fake.load(host)
        config = ExporterConfig(
            port=0,
            nvml_module="trainstack.monitoring.nvml_fake",
            pcie_throughput=pcie_throughput,
            sample_interval_seconds=interval,
            slow_sample_interval_seconds=slow_interval,
        )
        self.clock = ManualClock()
        self.session = NvmlSession(fake, pcie_throughput=pcie_throughput, gpm_interval_seconds=gpm_interval)
        self.sampler = Sampler(self.session, interval, slow_interval, self.clock)
        self.registry = build_registry(config, self.sampler)

    def sample(self) -> None:
        """One tick of the sampler: the clock moves on by the interval and the sampler reads NVML."""
        self.clock.now += self.sampler.interval_seconds
        self.sampler.sample_now()

    def scrape(self) -> dict[tuple[str, frozenset], float]:
        """A fresh sample, then one scrape through the exposition format: (sample name, labels) -> value."""
        self.sample()
        return render(self.registry)


def render(registry) -> dict[tuple[str, frozenset], float]:
    """A scrape of what the registry serves now, without sampling."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, metric, **labels):
    return samples.get((metric, frozenset(labels.items())))


def errors(samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["call"], dict(labels)["error"]): v
        for (name, labels), v in samples.items()
        if name == "trainstack_exporter_nvml_errors_total"
    }


NOW = 1_800_000_000.0


LIMITS = Thresholds()


def kinds(verdicts) -> list[str]:
    return [verdict.kind for verdict in verdicts]


def rank(name: str, **figures) -> RankView:
    healthy = dict(
        steps=100,
        steps_per_second=3.0,
        samples_per_second=48.0,
        data_wait_ratio=0.02,
        step_seconds=0.3,
        forward_seconds=0.05,
        last_step_time=NOW - 1,
    )
    return RankView(rank=name, **{**healthy, **figures})


def gpu(index: int, **figures) -> GpuView:
    healthy = dict(
        utilization=0.97,
        memory_used_ratio=0.6,
        thermal_throttle_ratio=0.0,
        power_throttle_ratio=0.1,
        sm_clock_ratio=1.0,
    )
    return GpuView(index=str(index), uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3", **{**healthy, **figures})


class CountersSource:
    """A Source of fixed rates and instants, shaped as the exporter serves a rank's series."""

    description = "test"
    now = NOW

    def __init__(self, instants: dict[str, list], rates: dict[str, list]):
        self.instants, self.rates = instants, rates

    def instant(self, name: str) -> list:
        return self.instants.get(name, [])

    def rate(self, name: str) -> list:
        return self.rates.get(name, [])


def identity(uuid: str = "") -> RankIdentity:
    return RankIdentity(
        rank=0,
        local_rank=0,
        node="n",
        uuid=uuid,
        run_id="r",
        world_size=1,
        nodes=1,
        mixed_precision="no",
        model="m",
        dataset="d",
    )


class ManualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeDdpModel(torch.nn.parallel.DistributedDataParallel):
    def __init__(self) -> None:  # no process group: only its hook registration is used
        torch.nn.Module.__init__(self)
        self.module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        self.broadcast_buffers = True  # DDP's default: BatchNorm's statistics are broadcast every forward
        self.modules_buffers = list(self.module.buffers())
        self.hooks = []

    def register_comm_hook(self, state, hook) -> None:
        self.hooks.append((state, hook))


def fake_host() -> dict:
    """Four H100s of the fake's DGX: GPU 1 power-capped at a low clock, GPU 2 idle, GPU 3 hot and nearly full."""
    host = json.loads((REPO / "monitoring/nvml_fake/hosts/dgx_h100.json").read_text())
    host["gpus"] = host["gpus"][:4]
    # NVML's violation counters are in nanoseconds: 0.9e9 per second is 90% of the time.
    host["gpus"][1]["overrides"] = {
        "nvmlDeviceGetViolationStatus": {"NVML_PERF_POLICY_POWER": {"start": 0, "per_second": 0.9e9}},
        "nvmlDeviceGetClockInfo": {"NVML_CLOCK_SM": 1200},
    }
    host["gpus"][2]["overrides"] = {"nvmlDeviceGetUtilizationRates": {"gpu": 0, "memory": 0}}
    host["gpus"][3]["overrides"] = {
        "nvmlDeviceGetViolationStatus": {"NVML_PERF_POLICY_THERMAL": {"start": 0, "per_second": 0.5e9}},
        "nvmlDeviceGetMemoryInfo": {"used": 83_000_000_000},
    }
    return host


def rig(host, gpm_interval=0.0) -> Rig:
    """The exporter on `host`, its GPM samples timed on the clock the test moves."""
    built = Rig(host, gpm_interval=gpm_interval)
    built.session.clock = built.clock
    return built
