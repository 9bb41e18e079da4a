"""trainstack/ratios.py: each ratio's arithmetic, which diagnose, the report and the ranks apply in Python and the
recording rules in PromQL (their values are checked by monitoring/prometheus/tests/recording.test.yml)."""

from __future__ import annotations

import pytest

from trainstack import ratios


def test_a_share_is_undefined_without_step_time_and_capped_at_the_whole():
    assert ratios.DATA_WAIT_SHARE.of(1.0, 4.0) == 0.25
    assert ratios.DATA_WAIT_SHARE.of(1.0, 0.0) is None
    # a wait counted when it ends can fall in a window that caught less of the step
    assert ratios.DATA_WAIT_SHARE.of(5.0, 4.0) == 1.0
    assert ratios.STEP_SECONDS.of(5.0, 4.0) == 1.25


def test_the_recording_rule_divides_the_same_rates_and_caps_the_same_way():
    expr = ratios.DATA_WAIT_SHARE.promql("2m")
    assert expr == (
        "clamp_max(\n  rate(trainstack_train_data_wait_seconds_total[2m])\n"
        "  / (rate(trainstack_train_step_duration_seconds_sum[2m]) > 0),\n  1\n)"
    )
    assert ratios.MEMORY_USED_SHARE.promql() == (
        "trainstack_gpu_memory_used_bytes\n/ (trainstack_gpu_memory_total_bytes > 0)"
    )


def test_the_straggler_wait_is_what_the_most_waiting_rank_waits_beyond_each():
    steps = {"0": 0.2, "1": 0.2, "2": 0.2}
    waits = ratios.STRAGGLER_WAIT.of({"0": 0.3, "1": 0.02, "2": 0.25}, steps)
    assert waits == pytest.approx({"0": 0.0, "1": 0.28, "2": 0.05})
    assert ratios.STRAGGLER_WAIT.of({"0": 0.29, "1": 0.02}, steps) == pytest.approx({"0": 0.0, "1": 0.27})  # two ranks
    assert ratios.STRAGGLER_WAIT.of({"0": 0.1}, steps) == {}  # a rank alone waits for no one
    # Rank 0 saves a checkpoint alone: its 60 ms steps leave the pause out, rank 1's 84 ms steps hold its wait for it
    # (28 ms a step against rank 0's 11): 17 ms of rank 1's 84, where the shares alone differ by 15%
    lone = ratios.STRAGGLER_WAIT.of({"0": 11 / 60, "1": 28 / 84}, {"0": 0.060, "1": 0.084})
    assert lone == pytest.approx({"0": 17 / 84, "1": 0.0})
    assert ratios.STRAGGLER_WAIT.promql("w", "s") == (
        "(\n  max by (job) (w * s)\n  - on (job) group_right ()\n  (w * s)\n)\n/ on (job) group_left ()\nmax by (job) (s)"
    )


def test_throttle_prefers_the_counter_then_the_reasons_the_rule_matches():
    assert ratios.THERMAL_THROTTLE.of(0.3, {"sw_power_cap"}) == 0.3
    # hw_slowdown counts as thermal in diagnose as in the recording rule
    assert ratios.THERMAL_THROTTLE.of(None, {"hw_slowdown"}) == 1.0
    assert 'reason=~"sw_thermal_slowdown|hw_thermal_slowdown|hw_slowdown"' in ratios.THERMAL_THROTTLE.promql()
    assert ratios.POWER_THROTTLE.of(None, {"hw_slowdown"}) == 0.0
    assert ratios.POWER_THROTTLE.of(None, None) is None
