"""``bench/train_throughput.py`` at a tiny size, in process: its rounds alternate the
sides, its ratios come from the same round, transformers' AdamW gets Forge's decay groups
by name with ``foreach``, and one process of each side trains a step from the same
weights (the same first loss)."""

from __future__ import annotations

import pytest
from conftest import REPO, load_bench

BENCH = REPO / "bench"
bench = load_bench("train_throughput.py", "train_throughput")

TINY = {"dim": 32, "layers": 1, "heads": 2, "kv_heads": 1, "seq": 16, "batch": 2, "vocab": 0}


def test_rounds_alternate_the_sides_and_32k_adds_the_chunked_loss_as_a_third():
    runs = bench.schedule(["quickstart", "vocab32k"], ["fp32"], ["eager"], pairs=3)
    quick = [(r["framework"], r["loss"], r["round"]) for r in runs if r["shape"] == "quickstart"]
    assert quick == [(f, "full", i) for i in range(3) for f in ("forge", "hf")]
    big = [(r["framework"], r["loss"]) for r in runs if r["shape"] == "vocab32k"]
    assert big == [("forge", "full"), ("hf", "full"), ("forge", "chunked")] * 3


def test_ratios_pair_each_forge_process_with_the_transformers_process_of_its_round():
    def result(framework, loss, round_, cpu, tokens_s):
        return {"shape": "vocab32k", "precision": "fp32", "mode": "eager", "framework": framework,
                "loss": loss, "round": round_, "cpu_s_per_step": cpu, "tokens_per_s": tokens_s}  # fmt: skip

    results = [
        result("forge", "full", 0, 1.0, 300.0),
        result("hf", "full", 0, 2.0, 100.0),
        result("forge", "chunked", 0, 4.0, 50.0),
        result("forge", "full", 1, 3.0, 100.0),
        result("hf", "full", 1, 3.0, 200.0),
    ]
    full, chunked = bench.comparisons(results)
    assert full["forge"] == "forge full" and full["pairs"] == 2
    assert full["cpu"] == [2.0, 1.0] and full["wall"] == [3.0, 0.5]
    assert chunked["forge"] == "forge chunked" and chunked["cpu"] == [0.5] and chunked["wall"] == [0.5]
    assert bench._median_range(full["cpu"]) == "1.50x [1.00-2.00]"


@pytest.fixture
def bench_on_path(monkeypatch, one_thread):
    monkeypatch.syspath_prepend(str(BENCH))  # the tokenizer spec names the module


def test_transformers_gets_forges_decay_groups_by_name_and_foreach(bench_on_path, tmp_path):
    cfg = {**TINY, "mode": "eager", "framework": "hf", "loss": "full", "precision": "fp32"}
    trainer = bench.build_forge({**cfg, "device": "cpu", "max_bytes": 20_000}, str(tmp_path))
    _, model, optimizer = bench.build_hf(trainer, compiled=False)
    assert optimizer.defaults["foreach"] is True
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    rates = {name: decay[id(p)] for name, p in model.named_parameters()}
    assert rates["model.layers.0.self_attn.q_proj.weight"] == bench.WEIGHT_DECAY
    assert rates["model.embed_tokens.weight"] == bench.WEIGHT_DECAY  # Forge decays embeddings
    assert rates["model.layers.0.input_layernorm.weight"] == 0.0
    assert rates["model.norm.weight"] == 0.0
    (forge_optimizer,) = trainer.parts.optimizers
    assert [g["weight_decay"] for g in optimizer.param_groups] == [
        g["weight_decay"] for g in forge_optimizer.param_groups
    ]


def test_one_process_of_each_side_measures_and_profiles_a_step_from_the_same_weights(bench_on_path):
    cfg = {**TINY, "shape": "tiny", "precision": "fp32", "mode": "eager", "loss": "full", "round": 0,
           "warmup": 1, "steps": 1, "device": "cpu", "threads": 1, "profile": True,
           "max_bytes": 20_000}  # fmt: skip
    forge, hf = (bench.worker({**cfg, "framework": f}) for f in ("forge", "hf"))
    for out in (forge, hf):
        assert out["tokens_per_s"] > 0 and out["cpu_s_per_step"] > 0
        assert out["profile_ms"]["matmul"] > 0 and out["profile_ms"]["data"] > 0
        assert out["profile_ms"]["loss"] > 0 and out["profile_ms"]["optimizer"] > 0
    # Forge's initial weights on both sides and the same first batch: the same first loss
    # (up to the float32 rounding of a different order of operations).
    assert hf["first_loss"] == pytest.approx(forge["first_loss"], rel=1e-5)
    assert forge["mfu"] is not None and hf["mfu"] is None
