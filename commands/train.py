"""`trainstack train`: check everything, then start the exporter and one rank per device through Accelerate.

The launcher is the process a container runs as PID 1 (behind tini), so it is the one that gets SIGTERM from
`docker stop` or a Kubernetes eviction. It passes the signal to the ranks only (not to their loader workers),
waits for them to agree, checkpoint and exit, and turns the outcome into a documented exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path

from trainstack import breakdown, environment
from trainstack.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, ConfigError
from trainstack.hang import hang_environment
from trainstack.lifetime import stop_grace, supervised_by_me
from trainstack.rundir import (
    FAILURE_FD_ENV,
    LAUNCHER_TRAIN,
    NNODES_ENV,
    USE_CPU_ENV,
    VERIFIED_CHECKPOINT_ENV,
    FirstFailure,
    RunDir,
    Summary,
    check_run_dir,
    new_run_id,
    read_summary,
    run_environment,
    write_summary,
)
from trainstack.supervisor.lease import RunDirLease, lease_timeout
from trainstack.supervisor.prometheus_sd import FileSdTarget, file_sd_target
from trainstack.supervisor.supervised import OwnAgent, SupervisedRun, findings, print_card, write_report
from trainstack.train.launcher import launch_config
from trainstack.train.launcher.doctor import DoctorConfig, Status, has_failures, render_table, run_checks, slurm_checks
from trainstack.train.launcher.fsdp_units import check_fsdp_units
from trainstack.train.launcher.launch_config import LaunchConfig, lease_wait, prometheus_sd_dir
from trainstack.train.rank import checkpoint
from trainstack.train.rank import config as train_config
from trainstack.train.rank.specs import check_dataset_spec, check_model_spec
from trainstack.write_failure import WriteFailure

PROGRAM = "trainstack train"


def say(line: str) -> None:
    print(f"{PROGRAM}: {line}", file=sys.stderr, flush=True)


def preflight(config: train_config.TrainConfig, launch: LaunchConfig) -> None:
    """Everything checkable before a rank starts that writes nothing: it runs before the run directory's lease."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the ranks run `python -m`, which imports factories from here too
    check_dataset_spec(config.dataset)
    check_model_spec(config.model)
    check_fsdp_units(config)
    train_config.require_device_support(config, on_cuda=not launch.use_cpu, world_size=launch.world_size)
    stop_grace()  # a bad TRAINSTACK_STOP_GRACE is refused now, not when an orphaned rank first reads it
    check_run_dir(config.run_dir, "--output-dir")


def resume_point(config: train_config.TrainConfig) -> Path | None:
    """The checkpoint to resume from, after tidying the checkpoints folder: only under the lease."""
    checkpoints = RunDir(config.run_dir).checkpoints
    checkpoint.remove_unsealed(checkpoints)  # a save killed part-way: never loadable
    folder = checkpoint.resolve_resume(
        config.resume, checkpoints, lambda line: print(f"trainstack train: warning: {line}", file=sys.stderr)
    )
    if folder:
        state = checkpoint.read_train_state(folder)
        checkpoint.require_strategy(folder, state, config.strategy)
        checkpoint.require_same_weights(folder, state, checkpoint.weights_shape(config.model, config.seq_len))
    return folder


def completed_before(config: train_config.TrainConfig) -> str | None:
    """Why there is nothing to train, when the run directory holds a completed run with the same stopping point
    (--max-steps, --epochs): rerunning the command that finished it must change nothing. None otherwise."""
    run_dir = RunDir(config.run_dir)
    try:
        summary = read_summary(run_dir.summary)
        saved = train_config.read_config_file(str(run_dir.config))
    except (OSError, ValueError, ConfigError):
        return None
    latest = checkpoint.complete_checkpoints(run_dir.checkpoints)
    if config.resume != "auto" or summary.get("exit_reason") != "completed" or not latest:
        return None
    steps = summary.get("steps")
    if steps is None or checkpoint.read_train_state(latest[-1]).get("step") != steps:
        return None  # trained further since that summary
    same_target = (saved.get("max_steps"), saved.get("epochs")) == (config.max_steps, config.epochs)
    lower_step_limit = config.epochs == saved.get("epochs") == 0 and 0 < config.max_steps <= steps
    if not (same_target or lower_step_limit):
        return None
    return (
        f"{run_dir.path} already holds a completed run ({steps} steps, run {summary.get('run_id')}); nothing "
        "changed: raise --max-steps or --epochs to train further, or choose another --output-dir"
    )


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
                raise ConfigError(
                    f"rendezvous host {launch.master_addr!r} did not resolve within "
                    f"{launch.rendezvous_timeout:g} s; check --master-addr / MASTER_ADDR"
                ) from None
            if not announced:
                print(f"trainstack train: waiting for {launch.master_addr} to resolve", file=sys.stderr)
                announced = True
            time.sleep(2)


class Launch:
    def __init__(
        self,
        config: train_config.TrainConfig,
        launch: LaunchConfig,
        resume_from: Path | None,
        run_id: str,
        lease: RunDirLease | None = None,
        discovery: FileSdTarget | None = None,
    ):
        self.config, self.launch, self.resume_from, self.discovery = config, launch, resume_from, discovery
        self.run_dir = RunDir(config.run_dir)
        self.run_id = run_id
        self.supervised = SupervisedRun(
            self.run_dir, launch.node_rank, lease, OwnAgent(say), say, config.collective_timeout
        )
        self.first_failure: FirstFailure | None = None  # the rank that failed first, as the agent saw it
        self.ranks_ended = False

    def sigterm_outside_the_ranks(self, signum, frame) -> None:
        """SIGTERM before the ranks start leaves at once (`_stop_before_ranks`); once they have ended (a
        scheduler's notice as the run finishes) the run's outcome stands, and its card and report, seconds away,
        are finished first."""
        if not self.ranks_ended:
            _stop_before_ranks(signum, frame)
        print("trainstack train: SIGTERM after the ranks ended: finishing the report, then exiting", file=sys.stderr)

    def prepare_run_dir(self) -> None:
        """This node's fresh metrics folder (SupervisedRun.fresh_metrics_dir); a resumed run appends to the
        record, a fresh start sets an earlier one aside. This node's environment is recorded as its ranks will get
        it."""

        def own_files() -> None:
            if self.resume_from is None:
                self.set_aside_previous_record()
            if self.launch.node_rank == 0:
                self.config.save(self.run_dir.config)
            environment.write(self.run_dir.environment(self.launch.node_rank), self.rank_environment())

        self.supervised.fresh_metrics_dir(own_files, lambda: checkpoint.resume_note(self.run_dir.checkpoints))

    def set_aside_previous_record(self) -> None:
        """A fresh start in a directory that holds an earlier attempt's record (it never saved a checkpoint, or
        its checkpoints were deleted): this node's part of it moves to `RunDir.previous(run id)`, never deleted."""
        first = self.launch.node_rank * self.launch.nproc_per_node
        files = [self.run_dir.rank_records(r) for r in range(first, first + self.launch.nproc_per_node)]
        files.append(self.run_dir.environment(self.launch.node_rank))
        if self.launch.node_rank == 0:
            files += [self.run_dir.summary, self.run_dir.report, self.run_dir.config]
        self.run_dir.set_aside(self.run_id, files, say)

    def rank_environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            **run_environment(self.run_dir.path, self.supervised.metrics_dir, self.run_id, time.time(), LAUNCHER_TRAIN),
        }
        if self.resume_from:
            env[VERIFIED_CHECKPOINT_ENV] = str(self.resume_from)  # hashed in preflight; ranks check sizes only
        env[NNODES_ENV] = str(self.launch.nnodes)
        env.update(hang_environment(self.run_dir.path, self.run_id, env))  # the Flight Recorder on
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a failed NCCL collective aborts, not hangs
        if self.launch.use_cpu:
            env[USE_CPU_ENV] = "1"
            cores = len(os.sched_getaffinity(0))
            # Ranks share the cores: oversubscribed intra-op threads make every rank slower than one.
            env.setdefault("OMP_NUM_THREADS", str(max(1, cores // self.launch.nproc_per_node)))
        return supervised_by_me(env)

    def rank_command(self) -> list[str]:
        launch = self.launch
        command = [
            sys.executable,
            "-m",
            "trainstack.train.launcher.agent",
            "--num_processes",
            str(launch.world_size),
            "--num_machines",
            str(launch.nnodes),
            "--machine_rank",
            str(launch.node_rank),
            "--main_process_ip",
            launch.master_addr,
            "--main_process_port",
            str(launch.master_port),
            "--mixed_precision",
            self.config.mixed_precision,
            "--dynamo_backend",
            "no",
        ]
        if self.config.strategy == "fsdp":
            # Accelerate's FSDP launch starts torchrun even for one rank: FSDP needs the process group that a
            # plain one-process launch does not create. CPU ranks: ACCELERATE_USE_CPU=1 as below.
            command += ["--use_fsdp", "--fsdp_version", "2"]
        elif launch.world_size > 1:
            # Not --cpu: that silently starts one process. With ACCELERATE_USE_CPU=1 this is MULTI_CPU over gloo.
            command.append("--multi_gpu")
        elif launch.use_cpu:
            command.append("--cpu")
        command += [
            "-m",
            "trainstack.train.rank",
            "--config",
            str(self.run_dir.config),
            "--resume",
            str(self.resume_from) if self.resume_from else "never",
        ]
        return command

    def run(self) -> int:
        self.started = time.time()
        self.prepare_run_dir()
        supervised = self.supervised
        with supervised.exporter_beside(self.launch.exporter_host, self.launch.exporter_port, discovery=self.discovery):
            # Signals go to the ranks while they run; once they have ended, to `sigterm_outside_the_ranks`
            with supervised.catching((signal.SIGTERM, signal.SIGINT)):
                if self.launch.nnodes > 1:
                    wait_for_rendezvous_host(self.launch)
                failures, failure_writer = os.pipe()
                env = {**self.rank_environment(), FAILURE_FD_ENV: str(failure_writer)}
                supervised.start(self.rank_command(), env, pass_fds=(failure_writer,))
                os.close(failure_writer)
                returncode = supervised.wait()
                self.ranks_ended = True
            supervised.end_leftovers()  # the lease is held until the ranks an agent killed alone are gone
            if self.launch.node_rank == 0:
                # A save cut short where the main process could not remove it itself (the agent ended it when a peer
                # failed first): never loadable, and its space is what a rerun needs. No rank is left to write there.
                checkpoint.remove_unsealed(self.run_dir.checkpoints)
            self.first_failure = read_first_failure(failures)
            self.add_time_breakdown(returncode)
            return self.outcome(returncode)

    def summary_of_this_launch(self) -> Summary:
        """summary.json if rank 0 wrote it in this launch, else {}. Every node of a run (and, with a fixed
        TRAINSTACK_RUN_ID, every launch) shares the run id: the summary is this launch's only on node 0, where rank 0
        runs, and only when written since it started."""
        summary_path = self.run_dir.summary
        summary = read_summary(summary_path)
        if (
            self.launch.node_rank == 0
            and summary.get("run_id") == self.run_id
            and summary_path.stat().st_mtime >= self.started
        ):
            return summary
        return {}

    def card_summary(self, code: int) -> Summary:
        """What the end-of-run card reads: summary.json where rank 0 wrote it in this launch; else, where the launch
        failed before it could (`code`), only that, so that the card judges its records without calling it
        healthy."""
        summary = self.summary_of_this_launch()
        if summary or code in (EXIT_OK, EXIT_PREEMPTED):
            return summary
        return {"exit_reason": "failed", "exit_code": code}

    def add_time_breakdown(self, returncode: int) -> None:
        """summary.json's `time_breakdown`, from every rank's records once all have exited: a rank's closing line
        ends its wall time (trainstack/breakdown.py), with the verdicts and the stall a failed launch
        (`returncode`) ended in. A storage that refuses it costs the breakdown only."""
        summary = self.summary_of_this_launch()
        times = breakdown.of_run(self.run_dir.path) if summary else None
        if times is None:
            return
        try:
            hang = self.supervised.ended_in_hang(returncode)
            write_summary(self.run_dir.summary, {**summary, **findings(self.run_dir.path, times, LAUNCHER_TRAIN, hang)})
        except WriteFailure as failure:
            print(f"trainstack train: warning: no time breakdown in the summary: {failure}", file=sys.stderr)

    def outcome(self, returncode: int) -> int:
        """Rank 0's verdict from summary.json when this launch wrote one (node 0), else the ranks' exit status."""
        summary_path = self.run_dir.summary
        summary = self.summary_of_this_launch()
        if summary:
            print(
                f"trainstack train: {summary['exit_reason']} after {summary['steps']} steps; {summary_path}",
                file=sys.stderr,
            )
            if summary["exit_reason"] == "preempted":
                print(
                    "trainstack train: checkpoint saved; rerun the same command to resume"
                    if self.config.keep_checkpoints
                    else "trainstack train: no checkpoint saved (--keep-checkpoints 0); the same command starts over",
                    file=sys.stderr,
                )
            if self.first_failure:  # the agent's exit code is the rank's that failed first, rank 0's may be a peer's
                return returncode
            return EXIT_FAILED if returncode and summary["exit_code"] == EXIT_OK else summary["exit_code"]
        if returncode in (EXIT_OK, EXIT_PREEMPTED):  # ranks on every node exit 75 once they agreed to stop
            return EXIT_PREEMPTED if self.supervised.received else returncode
        first = self.first_failure
        if self.supervised.received and first and first.exit_code == -signal.SIGTERM and not first.noted:
            # The SIGTERM the launcher passed on reached a rank before its handler (it was still starting): the stop
            # the user asked for, not a failure of that rank's.
            self.first_failure = None
            name = signal.Signals(self.supervised.received[0]).name
            print(
                f"trainstack train: stopped by {name} while the ranks were starting, before they could save; "
                "rerun the same command to resume from the latest checkpoint, if any",
                file=sys.stderr,
            )
            return EXIT_PREEMPTED
        return returncode if self.first_failure else EXIT_FAILED


def run_doctor(config: train_config.TrainConfig, launch: LaunchConfig, skip: bool) -> None:
    """The doctor's findings that need attention; a FAIL stops the launch before any rank starts. `skip`: a FAIL
    does not, and the node does not wait for the others' roll call in the run directory (up to 180 s)."""
    doctor = DoctorConfig.for_run(config, launch, roll_call=not skip)
    if slurm_checks.in_slurm_job(doctor):  # under the lease: no other launch's roll call is under way
        slurm_checks.tidy_roll_calls(doctor.output_dir, doctor.env)
    results = run_checks(doctor)
    if any(result.status != Status.PASS for result in results):
        print(render_table(results), file=sys.stderr)
    if has_failures(results) and not skip:
        raise ConfigError("preflight checks failed (FAIL above); fix them, or pass --skip-doctor to start anyway")


def read_first_failure(pipe: int) -> FirstFailure | None:
    """The agent's report from its pipe, once it has exited. Not waiting for the pipe to close: whatever the agent
    left running must not hold the launcher up."""
    os.set_blocking(pipe, False)
    try:
        report = os.read(pipe, 1 << 16).decode(errors="replace")
    except BlockingIOError:
        report = ""
    finally:
        os.close(pipe)
    return FirstFailure.from_json(report)


def checkpoints_kept(run_dir: Path) -> str:
    """What a report the storage refused leaves safe: the line ends naming the newest intact checkpoint."""
    newest = checkpoint.newest_intact(RunDir(run_dir).checkpoints)
    return f"; the checkpoints are untouched, the newest intact is {newest}" if newest else ""


def _stop_before_ranks(signum, frame) -> None:
    """SIGTERM while waiting for the lease or in preflight: leave at once, giving the lease back on the way."""
    print(f"trainstack train: stopped by {signal.Signals(signum).name} before any rank started", file=sys.stderr)
    raise SystemExit(EXIT_PREEMPTED)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The rank's and the launcher's flags, spelled in launch_config.py, which `trainstack doctor` takes too."""
    launch_config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """The launch; then, with --report on node 0, the report while the lease is still held."""
    launch = LaunchConfig.from_args(args)
    config = train_config.from_sources(args, on_cuda=not launch.use_cpu)
    wait = lease_wait(args)
    preflight(config, launch)
    run_id = new_run_id()
    discovery = file_sd_target(
        prometheus_sd_dir(args),
        run_id,
        launch.node_rank,
        launch.exporter_host,
        launch.exporter_port,
        launch.slurm,
        lambda line: print(f"trainstack train: warning: {line}", file=sys.stderr),
    )
    # Launch.run handles SIGTERM while ranks run; the caller's handler is back once the launch is over
    previous = signal.signal(signal.SIGTERM, _stop_before_ranks)
    try:
        # Before anything writes to the run directory, and held until the last rank has exited and the report is
        # written: a second launcher on a live run directory exits 2 having written nothing.
        with RunDirLease(config.run_dir, run_id, launch.node_rank, lease_timeout(args.lease_timeout)) as lease:
            lease.acquire(wait=wait)
            done = completed_before(config)
            if done:
                print(f"trainstack train: {done}", file=sys.stderr)
                return EXIT_OK
            resume_from = resume_point(config)
            run_doctor(config, launch, args.skip_doctor)
            launched = Launch(config, launch, resume_from, run_id, lease, discovery)
            signal.signal(signal.SIGTERM, launched.sigterm_outside_the_ranks)  # Launch.run's own while they run
            code = launched.run()
            if args.report and launch.node_rank == 0:
                this_launch = launched.card_summary(code)  # not an earlier launch's verdict
                report = write_report(config.run_dir, PROGRAM, checkpoints_kept, this_launch)
                code = code or report  # a report the disk refused fails a run that trained to its end
            elif launch.node_rank == 0:
                print_card(config.run_dir, PROGRAM, None, launched.card_summary(code))
            hang = launched.supervised.hang_line()
            if launched.first_failure:  # the last line: the one a user reads first
                print(
                    f"trainstack train: {launched.first_failure.line}"
                    + (f"; where the ranks waited: {hang}" if hang else ""),
                    file=sys.stderr,
                )
            elif hang and code:
                print(f"trainstack train: the run ended in a hang: {hang}", file=sys.stderr)
            return code
    finally:
        signal.signal(signal.SIGTERM, previous)
