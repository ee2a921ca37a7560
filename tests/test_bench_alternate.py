"""``bench/alternate.py``, the benches' shared timing loop: sides run in turns after
their warm-ups, a ratio is the median of the per-round ratios (not a ratio of medians),
and a row and its table carry both clocks."""

from __future__ import annotations

import pytest
from conftest import load_bench

alternate = load_bench("alternate.py")


def test_sides_run_in_turns_after_their_warm_ups():
    calls: list[str] = []
    sides = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = alternate.rounds(sides, pairs=3, steps=2, warmup=1)
    assert calls == list("abc") + ["a", "a", "b", "b", "c", "c"] * 3
    assert [len(times[s]["wall"]) for s in "abc"] == [3, 3, 3]
    assert all(t >= 0 for s in "abc" for kind in ("wall", "cpu") for t in times[s][kind])


def test_the_ratio_is_the_median_of_per_round_ratios():
    # Round 2 ran under load for both sides: the per-round ratios are 2, 2, 2; the ratio
    # of the medians would be 4 / 1.5.
    script = {
        "a": iter([(2.0, 1.0), (8.0, 4.0), (4.0, 2.0)]),
        "b": iter([(1.0, 0.5), (4.0, 2.0), (2.0, 1.0)]),
    }
    times = alternate.measured({s: (lambda s=s: next(script[s])) for s in "ab"}, pairs=3)
    assert alternate.ratio(times, "a", "b", "wall") == pytest.approx(2.0)
    row = alternate.compare("a vs b", times, "a", "b", tokens=100)
    assert row["wall_ratio"] == row["cpu_ratio"] == pytest.approx(2.0)
    assert row["a_wall"] == 4.0 and row["b_cpu"] == 1.0 and row["a_tokens_s"] == pytest.approx(25.0)
    lines = alternate.table([row]).splitlines()
    assert lines[1].split() == [
        "a",
        "vs",
        "b",
        "4000.0",
        "2000.0",
        "2.00",
        "2000.0",
        "1000.0",
        "2.00",
        "25",
        "50",
        "3",
    ]


def test_sync_brackets_every_timing_and_no_pairs_is_refused():
    events: list[str] = []
    alternate.timed(lambda: events.append("step"), steps=2, sync=lambda: events.append("sync"))
    assert events == ["sync", "step", "step", "sync"]
    with pytest.raises(ValueError, match="pairs must be at least 1"):
        alternate.measured({"a": lambda: (1.0, 1.0)}, pairs=0)
    assert alternate.load_line().startswith("load average ")
