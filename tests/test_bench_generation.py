"""``bench/generation.py`` at a tiny size, in process: both sides decode every row to
full length in alternated pairs, and greedy they agree token for token."""

from __future__ import annotations

import pytest
from conftest import load_bench

bench = load_bench("generation.py")

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--dim", "32", "--layers", "2", "--prompts", "3", "--min-len", "2", "--max-len", "9"]
TINY += ["--new-tokens", "6", "--pairs", "3"]


@pytest.mark.parametrize("mode", [[], ["--sample"]], ids=["greedy", "sampled"])
def test_the_bench_times_both_sides_in_pairs_on_the_same_rollouts(mode):
    rows, same = bench.run(bench.parse(TINY + mode))
    (row,) = rows
    assert row["comparison"] == "forge vs transformers" and row["pairs"] == 3
    assert row["a_tokens_s"] == pytest.approx(3 * 6 / row["a_wall"]) and row["b_cpu"] > 0
    if not mode:
        assert same == 1.0
