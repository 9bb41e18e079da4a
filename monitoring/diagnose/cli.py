"""`trainstack diagnose`: why a live run is not using its GPUs well, from its exporter or from Prometheus.

Exit status: 0 healthy, 1 a problem was found (the verdicts say which), 2 the source is not an exporter or a
Prometheus server (or a flag is wrong), 69 the source cannot be reached (an exporter that answers the first scrape
and is gone by the second had a run that ended meanwhile: that first reading is judged, and a note says so). A job
that runs but reports no rank telemetry (a watched command without trainstack.monitor) is judged on its GPUs alone:
its headline says NOT JUDGED and why (never HEALTHY), a note says how to get the rest, and its exit status is the
GPU verdicts' (0 on a host without GPUs: nothing found, which is no claim of health). With --run-dir, a run that
has ended (its summary.json written, its lease let go) gets the verdict its launcher kept, whatever answers at --url;
a --run-dir that holds no run, or whose run another run's exporter does not speak for, is refused (exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from trainstack import thresholds
from trainstack.errors import EXIT_OK, ConfigError, RuntimeFailure
from trainstack.monitoring.diagnose.sources import PROMETHEUS_WINDOW
from trainstack.rundir import SHOWN, RunDir, exporter_url

EXIT_PROBLEM = 1
DEFAULT_URL = exporter_url()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"an exporter (its /metrics) or a Prometheus server (default {DEFAULT_URL}: the launcher's exporter)",
    )
    parser.add_argument(
        "--source",
        choices=("auto", "exporter", "prometheus"),
        default="auto",
        help="what --url is (default auto: a Prometheus answers /api/v1/status/buildinfo)",
    )
    parser.add_argument("--job", help="Prometheus only: the scrape job of the run, when it holds several")
    parser.add_argument(
        "--window",
        default=PROMETHEUS_WINDOW,
        help=f"Prometheus only: rate() range (default {PROMETHEUS_WINDOW}, the recording rules'; "
        "shorter for a run younger than that)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        help="exporter only: seconds between the two scrapes that give the rates (default 10)",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=thresholds.STALL.value,
        help=f"no step for this long is a stall (default {thresholds.STALL.promql}, as the "
        f"{thresholds.STALL.alert} alert)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="the run's directory (--output-dir of trainstack train, --run-dir of watch): a stall "
        "then names where each rank waits, from the evidence in RUN_DIR/hang/; once the run has ended (no "
        f"exporter answers), the verdict its launcher kept in {SHOWN.summary}",
    )
    parser.add_argument("--json", action="store_true", help="print verdicts and figures as JSON")


def run(args: argparse.Namespace) -> int:
    from trainstack.ceilings import of_ranks
    from trainstack.hang_verdict import latest_hang
    from trainstack.monitoring.diagnose.render import render_json, render_text
    from trainstack.monitoring.diagnose.snapshot import read_snapshot, served_run_ids
    from trainstack.monitoring.diagnose.sources import open_source
    from trainstack.monitoring.diagnose.verdicts import diagnose, figures, not_judged, notes

    if not args.interval > 0:
        raise ConfigError(f"--interval must be positive seconds, got {args.interval}")
    limits = thresholds.Thresholds(stall_seconds=args.stall_seconds)
    selector = f'job="{args.job}"' if args.job else ""
    run = None if args.run_dir is None else checked_run_dir(args.run_dir)
    if run is not None and ended(run):  # whatever answers at --url now is another run's
        return diagnose_ended(args.run_dir, args.json)

    def check_first(instant) -> None:  # another run's exporter is said at once, not after the interval
        if run is not None:
            require_the_same_run(run, served_run_ids(instant), args.url)

    try:
        source = open_source(args.url, args.source, args.interval, selector, args.window, check_first)
    except RuntimeFailure as failure:
        if run is None:
            raise
        raise RuntimeFailure(
            f"{failure}; {run.path} holds no finished run (no {run.summary.name}): it is going with its exporter "
            f"elsewhere (pass --url with the port its launcher printed), or its launcher was killed (`trainstack "
            f"report {run.path}` reads what it recorded)"
        ) from None
    snapshot = read_snapshot(source)
    if run is not None:
        require_the_same_run(run, snapshot.run_ids, args.url)
        found = latest_hang(args.run_dir, run.all_node_metrics())  # this launch's stall only
        snapshot = dataclasses.replace(snapshot, hang=found)
    verdicts = diagnose(snapshot, limits)
    render = render_json if args.json else render_text
    said = [source.ended_meanwhile] if source.ended_meanwhile else []
    print(
        render(
            snapshot.source,
            verdicts,
            figures(snapshot),
            said + notes(snapshot, limits),
            of_ranks(snapshot.ranks),
            not_judged(snapshot, limits),
            snapshot.unjudged,
        ),
        flush=True,
    )
    return EXIT_PROBLEM if verdicts else EXIT_OK


def checked_run_dir(path: Path) -> RunDir:
    run = RunDir(path)
    if not run.holds_a_run():
        raise ConfigError(
            f"--run-dir {path} is not a run directory (no {run.summary.name}, lease, records, metrics or hang evidence): "
            "pass the "
            "--output-dir of trainstack train or the --run-dir of trainstack watch"
        )
    return run


def require_the_same_run(run: RunDir, served: frozenset[str], url: str) -> None:
    """The source must speak for the run directory's run: another run's exporter on the default port is not it."""
    held = run.lease_run_ids()
    if served and held and not served & held:
        raise ConfigError(
            f"{url} serves run {', '.join(sorted(served))}, not {run.path}'s ({', '.join(sorted(held))}): pass "
            "--url with the port that run's launcher printed"
        )


def ended(run: RunDir) -> bool:
    """Whether the run has ended: its launcher wrote summary.json and let go of the run directory's lease."""
    return run.summary.is_file() and not run.lease.exists()


def diagnose_ended(run_dir: Path, as_json: bool) -> int:
    """A run whose exporter is gone with it: the verdict its launcher kept in summary.json, as its end-of-run card
    (or summary.json's own keys with --json, and the figures its records give, as the card's throughput), where
    `trainstack diagnose` judges a live one."""
    import json

    from trainstack.monitoring.diagnose.finished import end_card, judgement, launcher_of
    from trainstack.rundir import read_summary

    run = RunDir(run_dir)
    summary: dict = dict(read_summary(run.summary))  # read by keys from a list, so a plain dict
    problem = bool(summary.get("verdicts") or summary.get("hang"))
    source = f"{run.summary} (the run has ended)"
    if as_json:
        kept = ("exit_reason", "exit_code", "judged", "not_judged", "ranks_not_judged", "verdicts", "hang")
        figures = judgement(run, launcher_of(summary)).figures
        shown = {"source": source, **{key: summary[key] for key in kept if key in summary}, "figures": figures}
        print(json.dumps(shown, indent=2))
    else:
        print(f"trainstack diagnose: {source}")
        print("\n".join(end_card(run_dir, summary)))
        if run.report.is_file():
            print(f"report: {run.report}")
    return EXIT_PROBLEM if problem else EXIT_OK
