"""`trainstack train`: check everything, then start the exporter and one rank per device through Accelerate.

The launcher is the process a container runs as PID 1 (behind tini), so it is the one that gets SIGTERM from
`docker stop` or a Kubernetes eviction. It passes the signal to the ranks only (not to their loader workers),
waits for them to agree, checkpoint and exit, and turns the outcome into a documented exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from train import checkpoint, sharding
from train import config as train_config
from train.data import check_dataset_spec
from train.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, ConfigError
from train.lease import TIMEOUT_ENV, RunDirLease, lease_timeout
from train.model import check_model_spec
from train.performance import missing_compiler
from train.rank import RUN_ID_ENV
from train.telemetry import METRICS_DIR_ENV

DEFAULT_EXPORTER_PORT = 9450
DEFAULT_MASTER_PORT = 29500
CPU_STAND_IN_RANKS = 2  # without a GPU: two gloo ranks, the smallest world that exercises DDP for real


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"environment variable {name}={value!r} must be an integer") from None
    return None


def _env_str(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


@dataclass
class LaunchConfig:
    """Where the ranks run. Flags win over the torchrun / Kubernetes / Kubeflow environment variables."""

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    use_cpu: bool
    exporter_port: int
    exporter_host: str
    rendezvous_timeout: float

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank must be in 0..{self.nnodes - 1} for {self.nnodes} nodes, got "
                              f"{self.node_rank}")
        for name in ("master_port", "exporter_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535 or (name == "master_port" and port == 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be a TCP port (1-65535), got {port}")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchConfig:
        import torch

        gpus = torch.cuda.device_count()
        use_cpu = args.cpu or gpus == 0
        # Kubeflow Trainer's runtimes set PET_NPROC_PER_NODE=auto|gpu|cpu: all mean "the default for this node".
        if os.environ.get("PET_NPROC_PER_NODE") in ("auto", "gpu", "cpu"):
            use_cpu = use_cpu or os.environ["PET_NPROC_PER_NODE"] == "cpu"
            os.environ.pop("PET_NPROC_PER_NODE")
        nproc = args.nproc_per_node or _env_int("NPROC_PER_NODE", "PET_NPROC_PER_NODE")
        if nproc is None:
            nproc = CPU_STAND_IN_RANKS if use_cpu else gpus
        elif not use_cpu and nproc > gpus:
            raise ConfigError(f"--nproc-per-node {nproc} but only {gpus} GPU(s) are visible; one rank per GPU "
                              "(check CUDA_VISIBLE_DEVICES) or pass --cpu")
        nnodes = args.nnodes or _env_int("NNODES", "PET_NNODES") or 1
        node_rank = args.node_rank if args.node_rank is not None else _env_int(
            "NODE_RANK", "PET_NODE_RANK", "JOB_COMPLETION_INDEX") or 0
        master_port = args.master_port or _env_int("MASTER_PORT", "PET_MASTER_PORT")
        if master_port is None:
            master_port = DEFAULT_MASTER_PORT if nnodes > 1 else _free_port()
        return cls(
            nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank,
            master_addr=args.master_addr or _env_str("MASTER_ADDR", "PET_MASTER_ADDR") or "127.0.0.1",
            master_port=master_port, use_cpu=use_cpu,
            exporter_port=args.exporter_port, exporter_host=args.exporter_host,
            rendezvous_timeout=args.rendezvous_timeout,
        )


def _free_port() -> int:
    """A single-node job needs no fixed port; a free one lets several jobs share a host."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    train_config.add_arguments(parser)
    group = parser.add_argument_group("launch (flags win over torchrun/Kubernetes environment variables)")
    group.add_argument("--nproc-per-node", type=int, help="ranks on this node (default: one per GPU, 2 on CPU)")
    group.add_argument("--nnodes", type=int, help="nodes in the job (env NNODES; default 1)")
    group.add_argument("--node-rank", type=int, help="this node's rank (env NODE_RANK or JOB_COMPLETION_INDEX)")
    group.add_argument("--master-addr", help="rendezvous host: node 0's address (env MASTER_ADDR)")
    group.add_argument("--master-port", type=int, help="rendezvous port (env MASTER_PORT; default: 29500 "
                       "multi-node, a free port single-node)")
    group.add_argument("--rendezvous-timeout", type=float, default=600.0,
                       help="seconds to wait for the rendezvous host's name to resolve (default: 600)")
    group.add_argument("--cpu", action="store_true", help="run CPU ranks over gloo even if GPUs are present")
    group.add_argument("--exporter-port", type=int, default=DEFAULT_EXPORTER_PORT,
                       help=f"metrics exporter port (default: {DEFAULT_EXPORTER_PORT}; 0 turns it off)")
    group.add_argument("--exporter-host", default="127.0.0.1",
                       help="address the exporter binds (default: 127.0.0.1; 0.0.0.0 in containers)")
    group.add_argument("--skip-doctor", action="store_true",
                       help="start even if a preflight check FAILs (trainstack doctor shows them)")
    group.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                       help="write RUN_DIR/report.html when the ranks exit (default: on)")
    group.add_argument("--wait-for-lease", type=float, default=0.0, metavar="SECONDS",
                       help="when another launcher holds the run directory, wait this long for it to finish "
                       "instead of exiting 2 (default: 0)")
    group.add_argument("--lease-timeout", type=float, metavar="SECONDS",
                       help=f"a holder on another host whose heartbeat is older than this is taken over (env "
                       f"{TIMEOUT_ENV}; default: 60)")


def preflight(config: train_config.TrainConfig, launch: LaunchConfig) -> None:
    """Everything checkable before a rank starts that writes nothing: it runs before the run directory's lease."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the ranks run `python -m`, which imports factories from here too
    check_dataset_spec(config.dataset)
    check_model_spec(config.model)
    sharding.check_units_before_launch(config)
    if launch.use_cpu and config.mixed_precision == "fp16":
        raise ConfigError("--mixed-precision fp16 needs CUDA GPUs; use bf16 or no for CPU ranks")
    if problem := missing_compiler(config, on_cuda=not launch.use_cpu):
        raise ConfigError(problem)
    if launch.use_cpu and config.sync_batchnorm and launch.world_size > 1:
        raise ConfigError("--sync-batchnorm needs CUDA GPUs (PyTorch's SyncBatchNorm has no CPU kernel); turn it "
                          "off for CPU ranks")
    run_dir = config.run_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--output-dir {run_dir} is a file; choose a directory path")
    for existing in (run_dir, *run_dir.parents):
        if existing.exists():
            if not os.access(existing, os.W_OK):
                raise ConfigError(f"--output-dir {run_dir}: {existing} is not writable; choose another path")
            break


def resume_point(config: train_config.TrainConfig) -> Path | None:
    """The checkpoint to resume from, after tidying the checkpoints folder: only under the lease."""
    checkpoint.remove_unsealed(config.run_dir / "checkpoints")  # a save killed part-way: never loadable
    folder = checkpoint.resolve_resume(config.resume, config.run_dir / "checkpoints",
                                       lambda line: print(f"trainstack train: warning: {line}", file=sys.stderr))
    if folder:
        checkpoint.require_strategy(folder, checkpoint.read_train_state(folder), config.strategy)
    return folder


def completed_before(config: train_config.TrainConfig) -> str | None:
    """Why there is nothing to train, when the run directory holds a completed run with the same stopping point
    (--max-steps, --epochs): rerunning the command that finished it must change nothing. None otherwise."""
    run_dir = config.run_dir
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        saved = train_config.read_config_file(str(run_dir / "config.yaml"))
    except (OSError, ValueError, ConfigError):
        return None
    latest = checkpoint.complete_checkpoints(run_dir / "checkpoints")
    if config.resume != "auto" or summary.get("exit_reason") != "completed" or not latest:
        return None
    steps = summary.get("steps")
    if checkpoint.read_train_state(latest[-1]).get("step") != steps:
        return None  # trained further since that summary
    same_target = (saved.get("max_steps"), saved.get("epochs")) == (config.max_steps, config.epochs)
    lower_step_limit = config.epochs == saved.get("epochs") == 0 and 0 < config.max_steps <= steps
    if not (same_target or lower_step_limit):
        return None
    return (f"{run_dir} already holds a completed run ({steps} steps, run {summary.get('run_id')}); nothing "
            "changed: raise --max-steps or --epochs to train further, or choose another --output-dir")


def wait_for_rendezvous_host(launch: LaunchConfig) -> None:
    """On Kubernetes, pod 0's DNS name appears some seconds after the pods start: wait instead of failing."""
    deadline = time.monotonic() + launch.rendezvous_timeout
    announced = False
    while True:
        try:
            socket.getaddrinfo(launch.master_addr, launch.master_port)
            return
        except socket.gaierror:
            if time.monotonic() > deadline:
                raise ConfigError(f"rendezvous host {launch.master_addr!r} did not resolve within "
                                  f"{launch.rendezvous_timeout:g} s; check --master-addr / MASTER_ADDR") from None
            if not announced:
                print(f"trainstack train: waiting for {launch.master_addr} to resolve", file=sys.stderr)
                announced = True
            time.sleep(2)


def new_run_id() -> str:
    """Set TRAINSTACK_RUN_ID (e.g. to the Kubernetes Job uid) to name a multi-node run: its nodes share the run
    directory's lease, and the ranks adopt rank 0's id."""
    return os.environ.get(RUN_ID_ENV) or time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class Launch:
    def __init__(self, config: train_config.TrainConfig, launch: LaunchConfig, resume_from: Path | None,
                 run_id: str, lease: RunDirLease | None = None):
        self.config, self.launch, self.resume_from = config, launch, resume_from
        self.run_dir = config.run_dir
        self.run_id = run_id
        self.lease = lease
        # Per node: prometheus_client names files by PID, which repeats across pods on a shared volume, and each
        # node's exporter must serve only its own ranks.
        self.metrics_dir = self.run_dir / "metrics" / f"node-{launch.node_rank}"
        self.ranks: subprocess.Popen | None = None
        self.exporter: subprocess.Popen | None = None
        self.stop_signal: int | None = None
        self.signalled_pids: set[int] = set()

    def prepare_run_dir(self) -> None:
        """Metrics belong to one launch: a previous launch's series must never show up in this one. Telemetry
        belongs to the run: a resumed run appends to it. Only this node's files are touched: on a shared volume
        the other nodes are writing theirs."""
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir(parents=True)
        telemetry = self.run_dir / "telemetry"
        telemetry.mkdir(exist_ok=True)
        if self.resume_from is None:
            self.set_aside_previous_record()
        if self.launch.node_rank == 0:
            self.config.save(self.run_dir / "config.yaml")

    def set_aside_previous_record(self) -> None:
        """A fresh start in a directory that holds an earlier attempt's record (it never saved a checkpoint, or
        its checkpoints were deleted): that record moves to RUN_DIR/previous/before-<run id>/, never deleted."""
        first = self.launch.node_rank * self.launch.nproc_per_node
        names = [f"telemetry/rank-{rank}.jsonl" for rank in range(first, first + self.launch.nproc_per_node)]
        if self.launch.node_rank == 0:
            names += ["summary.json", "report.html"]
        aside = self.run_dir / "previous" / f"before-{self.run_id}"
        for name in names:
            if (self.run_dir / name).is_file():
                (aside / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.run_dir / name, aside / name)
                print(f"trainstack train: fresh start: kept the earlier {name} as {aside / name}", file=sys.stderr)

    def rank_environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env[METRICS_DIR_ENV] = str(self.metrics_dir.resolve())
        env[RUN_ID_ENV] = self.run_id
        if self.resume_from:
            env[checkpoint.VERIFIED_ENV] = str(self.resume_from)  # hashed in preflight; ranks check sizes only
        env["NNODES"] = str(self.launch.nnodes)
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a failed NCCL collective aborts, not hangs
        if self.launch.use_cpu:
            env["ACCELERATE_USE_CPU"] = "1"
            cores = len(os.sched_getaffinity(0))
            # Ranks share the cores: oversubscribed intra-op threads make every rank slower than one.
            env.setdefault("OMP_NUM_THREADS", str(max(1, cores // self.launch.nproc_per_node)))
        return env

    def rank_command(self) -> list[str]:
        launch = self.launch
        command = [sys.executable, "-m", "train.agent",
                   "--num_processes", str(launch.world_size), "--num_machines", str(launch.nnodes),
                   "--machine_rank", str(launch.node_rank), "--main_process_ip", launch.master_addr,
                   "--main_process_port", str(launch.master_port), "--mixed_precision", self.config.mixed_precision,
                   "--dynamo_backend", "no"]
        if self.config.strategy == "fsdp":
            # Accelerate's FSDP launch starts torchrun even for one rank: FSDP needs the process group that a
            # plain one-process launch does not create. CPU ranks: ACCELERATE_USE_CPU=1 as below.
            command += ["--use_fsdp", "--fsdp_version", "2"]
        elif launch.world_size > 1:
            # Not --cpu: that silently starts one process. With ACCELERATE_USE_CPU=1 this is MULTI_CPU over gloo.
            command.append("--multi_gpu")
        elif launch.use_cpu:
            command.append("--cpu")
        command += ["-m", "train", "--config", str(self.run_dir / "config.yaml"),
                    "--resume", str(self.resume_from) if self.resume_from else "never"]
        return command

    def start_exporter(self) -> None:
        if not self.launch.exporter_port:
            return
        self.exporter = subprocess.Popen(
            [sys.executable, "-m", "monitoring.exporter", "--host", self.launch.exporter_host,
             "--port", str(self.launch.exporter_port), "--metrics-dir", str(self.metrics_dir),
             "--run-dir", str(self.run_dir)],
            env={**os.environ, METRICS_DIR_ENV: str(self.metrics_dir.resolve())},
        )
        print(f"trainstack train: metrics at http://{self.launch.exporter_host}:{self.launch.exporter_port}/metrics",
              file=sys.stderr)

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def _forward_stop(self) -> None:
        """SIGTERM to each rank (the agent's direct children), once; loader workers are left to their rank."""
        import psutil

        try:
            ranks = psutil.Process(self.ranks.pid).children()
        except psutil.NoSuchProcess:
            return
        for rank in ranks:
            if rank.pid not in self.signalled_pids:
                self.signalled_pids.add(rank.pid)
                try:
                    rank.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    pass

    def run(self) -> int:
        self.started = time.time()
        self.prepare_run_dir()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start_exporter()
            if self.launch.nnodes > 1:
                wait_for_rendezvous_host(self.launch)
            # Own session: a terminal's Ctrl-C reaches only the launcher, which stops the ranks in order.
            # The agent inherits the lease file, so its flock holds while ranks may still write, even if this
            # launcher is killed alone.
            self.ranks = subprocess.Popen(self.rank_command(), env=self.rank_environment(), start_new_session=True,
                                          pass_fds=(self.lease.fd,) if self.lease and self.lease.fd else ())
            while self.ranks.poll() is None:
                if self.stop_signal is not None:
                    self._forward_stop()
                time.sleep(0.2)
            return self.outcome(self.ranks.returncode)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.stop_exporter()

    def stop_exporter(self) -> None:
        if self.exporter and self.exporter.poll() is None:
            self.exporter.terminate()
            try:
                self.exporter.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.exporter.kill()

    def outcome(self, returncode: int) -> int:
        """Rank 0's verdict from summary.json when this launch wrote one (node 0), else the ranks' exit status."""
        summary_path = self.run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        # Every node of a run (and, with a fixed TRAINSTACK_RUN_ID, every launch) shares the run id: the summary
        # is this launch's verdict only on node 0, where rank 0 runs, and only when written since it started.
        if (self.launch.node_rank == 0 and summary.get("run_id") == self.run_id
                and summary_path.stat().st_mtime >= self.started):
            print(f"trainstack train: {summary['exit_reason']} after {summary['steps']} steps; {summary_path}",
                  file=sys.stderr)
            if summary["exit_reason"] == "preempted":
                print("trainstack train: checkpoint saved; rerun the same command to resume", file=sys.stderr)
            return EXIT_FAILED if returncode and summary["exit_code"] == EXIT_OK else summary["exit_code"]
        if returncode in (EXIT_OK, EXIT_PREEMPTED):  # ranks on every node exit 75 once they agreed to stop
            return EXIT_PREEMPTED if self.stop_signal is not None else returncode
        return EXIT_FAILED


def run_doctor(config: train_config.TrainConfig, launch: LaunchConfig, skip: bool) -> None:
    """The doctor's findings that need attention; a FAIL stops the launch before any rank starts."""
    from train.doctor import DoctorConfig, Status, has_failures, render_table, run_checks

    results = run_checks(DoctorConfig.for_run(config, launch))
    if any(result.status != Status.PASS for result in results):
        print(render_table(results), file=sys.stderr)
    if has_failures(results) and not skip:
        raise ConfigError("preflight checks failed (FAIL above); fix them, or pass --skip-doctor to start anyway")


def write_report(run_dir: Path) -> None:
    from monitoring.report import write_report as render

    try:
        print(f"trainstack train: report: {render(run_dir)}", file=sys.stderr)
    except ConfigError as problem:
        print(f"trainstack train: warning: no report: {problem}", file=sys.stderr)


def _stop_before_ranks(signum, frame) -> None:
    """SIGTERM while waiting for the lease or in preflight: leave at once, giving the lease back on the way."""
    print(f"trainstack train: stopped by {signal.Signals(signum).name} before any rank started", file=sys.stderr)
    raise SystemExit(EXIT_PREEMPTED)


def run(args: argparse.Namespace) -> int:
    launch = LaunchConfig.from_args(args)
    config = train_config.from_sources(args, on_cuda=not launch.use_cpu)
    if args.wait_for_lease < 0:
        raise ConfigError(f"--wait-for-lease must be 0 or more seconds, got {args.wait_for_lease:g}")
    preflight(config, launch)
    run_id = new_run_id()
    signal.signal(signal.SIGTERM, _stop_before_ranks)  # Launch.run handles it while ranks run
    # Before anything writes to the run directory, and held until the last rank has exited and the report is
    # written: a second launcher on a live run directory exits 2 having written nothing.
    with RunDirLease(config.run_dir, run_id, launch.node_rank, lease_timeout(args.lease_timeout)) as lease:
        lease.acquire(wait=args.wait_for_lease)
        done = completed_before(config)
        if done:
            print(f"trainstack train: {done}", file=sys.stderr)
            return EXIT_OK
        resume_from = resume_point(config)
        run_doctor(config, launch, args.skip_doctor)
        code = Launch(config, launch, resume_from, run_id, lease).run()
        if args.report and launch.node_rank == 0:
            write_report(config.run_dir)
        return code
