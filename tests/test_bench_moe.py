"""``bench/moe.py`` at a tiny size, in process: its two comparisons give a row each from
alternated pairs, its reference check catches grouped experts that disagree with the
loop, and its all-to-all timer counts every call and restores the collective. (The
ep=2 part launches torchrun and is run by hand: ``python bench/moe.py --ep``.)"""

from __future__ import annotations

import pytest
import torch
from conftest import load_bench

bench = load_bench("moe.py")


pytestmark = pytest.mark.usefixtures("one_thread")


TINY = ["--dim", "32", "--experts", "4", "--expert-hidden", "16", "--batch", "1", "--seq-len", "16"]
TINY += ["--pairs", "3", "--steps", "1"]


def test_the_bench_compares_moe_with_dense_and_grouped_with_loop_in_pairs():
    args = bench.parse(TINY)
    rows = bench.run(args)
    assert [r["comparison"] for r in rows] == ["moe vs dense", "grouped vs loop"]
    for row in rows:
        assert row["pairs"] == 3 and row["a_wall"] > 0 and row["b_cpu"] > 0
        assert row["a_tokens_s"] == pytest.approx(16 / row["a_wall"])
    lines = bench.table(rows).splitlines()
    assert lines[0].split()[:4] == ["A", "vs", "B", "A"] and len(lines) == 3
    assert lines[1].startswith("moe vs dense") and lines[1].split()[-1] == "3"


def test_the_dense_model_has_the_active_feed_forward_of_the_moe_one():
    args = bench.parse(TINY)
    moe, dense = bench.build("moe", args), bench.build("dense", args)
    active = args.top_k * sum(p[0].numel() for p in moe.layers["0"].feed_forward.experts.parameters())
    assert active == sum(p.numel() for p in dense.layers["0"].feed_forward.parameters())


def test_grouped_experts_that_disagree_with_the_loop_stop_the_bench(monkeypatch):
    build = bench.build

    def broken(kind, args):
        model = build(kind, args)
        if kind == "loop":
            with torch.no_grad():
                model.layers["1"].feed_forward.experts.w2[1:].mul_(1.5)
        return model

    monkeypatch.setattr(bench, "build", broken)
    with pytest.raises(AssertionError, match="grouped and loop experts disagree"):
        bench.run(bench.parse(TINY))


def test_the_all_to_all_timer_counts_every_call_and_restores_the_collective():
    import torch.distributed as dist

    original = dist.all_to_all_single
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with bench.AllToAllTime() as timer:
            for _ in range(3):
                out = torch.empty(4)
                dist.all_to_all_single(out, torch.arange(4.0))
        assert torch.equal(out, torch.arange(4.0)) and timer.calls == 3 and timer.seconds > 0
        assert dist.all_to_all_single is original
    finally:
        dist.destroy_process_group()


def test_the_ep_row_takes_the_medians_and_the_all_to_all_share():
    rows = {
        "ep_wall": [0.2, 0.3, 0.4],
        "ep_cpu": [0.4, 0.6, 0.8],
        "a2a": [0.1, 0.5, 0.2],
        "one_wall": [0.1, 0.1, 0.2],
        "one_cpu": [0.1, 0.2, 0.2],
    }
    row = bench.ep_row(rows, tokens=100)
    assert row["wall_ratio"] == pytest.approx(2.0) and row["cpu_ratio"] == pytest.approx(4.0)
    assert row["a2a_share"] == pytest.approx(0.2) and row["a_tokens_s"] == pytest.approx(100 / 0.3)
