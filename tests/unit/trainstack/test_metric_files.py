"""The ranks' multiprocess files as every reader merges them (trainstack/metric_files.py)."""

from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key

from trainstack import catalog
from trainstack.metric_files import merged_metrics, progress_by_rank
from trainstack.monitoring.exporter.training import TrainingCollector
from trainstack.supervisor.hang_watch import steps_by_rank


def write_steps(metrics_dir: Path, pid: int, rank: str, steps: float) -> None:
    """A rank's counter file, as prometheus_client writes it."""
    family = catalog.TRAIN_STEPS.family_name
    values = MmapedDict(str(metrics_dir / f"counter_{pid}.db"))
    values.write_value(
        mmap_key(family, catalog.TRAIN_STEPS.name, ["rank"], [rank], catalog.TRAIN_STEPS.help), steps, 0.0
    )
    values.close()


def test_a_file_a_rank_has_created_but_not_yet_sized_is_skipped_by_every_reader(tmp_path):
    write_steps(tmp_path, 101, "0", 7.0)
    (tmp_path / "counter_102.db").touch()  # rank 1 between creating its file and sizing it, or killed there
    (tmp_path / "gauge_mostrecent_102.db").write_bytes(b"\0\0")

    assert steps_by_rank(tmp_path) == {"0": 7.0}
    assert {rank: progress[0] for rank, progress in progress_by_rank(str(tmp_path)).items()} == {"0": 7.0}
    served = {
        sample.labels["rank"]: sample.value
        for family in TrainingCollector(tmp_path).collect()
        for sample in family.samples
    }
    assert served == {"0": 7.0}


def test_once_sized_the_file_is_read(tmp_path):
    (tmp_path / "counter_102.db").touch()
    write_steps(tmp_path, 101, "0", 7.0)
    write_steps(tmp_path, 102, "1", 5.0)

    assert steps_by_rank(tmp_path) == {"0": 7.0, "1": 5.0}


def test_no_folder_reads_as_no_metrics(tmp_path, monkeypatch):
    assert merged_metrics(tmp_path / "absent") == []
    assert merged_metrics(None) == []
    # removed between the check and the listing: a new launch making it afresh
    monkeypatch.setattr(Path, "is_dir", lambda path: True)
    assert merged_metrics(tmp_path / "absent") == []
