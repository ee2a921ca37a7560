"""``bench/checkpoint_stall.py`` at a tiny size, in process: each way's figures come
from the trainer's own save path (a checkpoint complete after the wait, the async one
collected at a step boundary or at the wait), and the table compares the two."""

from __future__ import annotations

from conftest import load_bench

from forge_core.train.checkpoint import find_latest

bench = load_bench("checkpoint_stall.py", "bench_stall")


def test_the_bench_measures_both_ways_through_the_trainers_save(tmp_path):
    args = bench.parse(["--width", "16", "--layers", "2", "--batch", "2", "--base", "2", "--after", "2"])
    rows = [bench.measure(args, way, tmp_path / way) for way in bench.WAYS]
    for row, way in zip(rows, bench.WAYS):
        assert row["way"] == way and row["params"] == 2 * (16 * 16 + 16)
        assert row["call_wall"] > 0 and row["step_wall"] > 0
        assert find_latest(tmp_path / way / "checkpoints") == tmp_path / way / "checkpoints/step-000001"
    assert rows[0]["landed"] == 0 and 0 <= rows[1]["landed"] <= 2
    lines = bench.table(rows).splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["sync", "async"]
    assert lines[3].startswith("async / sync: save call ")
