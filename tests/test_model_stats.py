"""Statistics a model reports about its training forwards (:mod:`forge_core.train.model_stats`):
found by method and named by block, summed over the processes that saw different tokens
but not over copies, each pipeline stage reporting its own layers (and not its shape
inference's forward), refused when a module breaks the contract, logged by a real run
(every micro-batch, not the evaluation's forwards) to ``metrics.jsonl``, TensorBoard and
the console line; the MoE llama's blocks against a hand count. A test double
(:mod:`toy_router`) stands for any model that reports."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import torch
from toy_router import Router, ToyModel, ToyOptions, ToyPlugin

from forge_core.api import ForgeError
from forge_core.parallel_dims import mesh_dims
from forge_core.registry import load_registries
from forge_core.train.model_stats import ModelStatistics, copies, reporters

OPTIONS = ToyOptions(dim=8, experts=4, top_k=2, n_layers=2)
VOCAB = 32


def toy(seed: int = 0) -> ToyModel:
    torch.manual_seed(seed)
    return ToyModel(OPTIONS, VOCAB)


def tokens(rows: int = 4, seq: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, seq), generator=torch.Generator().manual_seed(seed))


def hand_count(model: ToyModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's assignments per expert, recomputed outside the routers."""
    counts, x = [], model.emb(ids)
    for block in model.layers.values():
        chosen = block.router.gate(x).topk(OPTIONS.top_k, dim=-1).indices
        counts.append(torch.bincount(chosen.reshape(-1), minlength=OPTIONS.experts).double())
        x = x + block.experts(x, chosen)
    return counts


def cv(load: torch.Tensor) -> float:
    share = load / load.sum()
    return float(share.std(unbiased=False) / share.mean())


def run_processes(parts_per_rank, weight, forward):
    """Each "process" (a thread) forwards its parts and collects; the all-gather is real
    (between the threads), the all-reduce is the sum of what each returns."""
    n = len(parts_per_rank)
    boxes: list = [None] * n
    barrier = threading.Barrier(n)

    def gather_of(rank):
        def gather(obj):
            boxes[rank] = obj
            barrier.wait()
            return list(boxes)

        return gather

    collectors = [ModelStatistics(parts, weight, gather_of(r)) for r, parts in enumerate(parts_per_rank)]
    local: list = [None] * n
    failed: list = []

    def work(rank):
        try:
            forward(rank)
            local[rank] = collectors[rank].local()
        except Exception as exc:  # noqa: BLE001 - raised in the test's thread below
            failed.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    summed = [sum(values) for values in zip(*local)]
    return [c.metrics(summed) for c in collectors]


def test_reporters_are_found_by_method_and_named_by_the_block_that_holds_them():
    model = toy()
    assert [name for name, _ in reporters([model])] == ["toy_router/layers.0", "toy_router/layers.1"]
    # Two in one block: their own paths; one outside the blocks: its path; a group of its own.
    model.layers["0"].second = Router(8, 4, 2)
    model.extra = Router(8, 4, 2)
    model.extra.stats_group = "gate"
    assert [name for name, _ in reporters([model])] == [
        "toy_router/layers.0.router",
        "toy_router/layers.0.second",
        "toy_router/layers.1",
        "gate/extra",
    ]


def test_one_process_reports_each_layer_and_the_whole_model_from_a_hand_count():
    model, ids = toy(), tokens()
    stats = ModelStatistics([model], 1.0)
    for micro in (ids[:2], ids[2:]):  # two micro-batches: both count
        model(micro)
    m = stats.metrics(stats.local())
    loads = [a + b for a, b in zip(hand_count(model, ids[:2]), hand_count(model, ids[2:]))]
    for i, load in enumerate(loads):
        assert m[f"toy_router/layers.{i}/load_cv"] == pytest.approx(cv(load), rel=1e-12)
        assert m[f"toy_router/layers.{i}/load_max"] == pytest.approx(float(load.max() / load.sum()))
        assert m[f"toy_router/layers.{i}/assignments"] == 4 * 16 * OPTIONS.top_k
    assert m["toy_router/load_cv"] == pytest.approx(cv(loads[0] + loads[1]), rel=1e-12)
    assert m["toy_router/max/load_cv"] == max(cv(load) for load in loads)
    # Read and reset: the next step starts from zero.
    model(ids[:1])
    assert stats.metrics(stats.local())["toy_router/layers.0/assignments"] == 16 * OPTIONS.top_k


def test_without_a_summarize_function_the_scalar_totals_are_reported():
    class Plain(torch.nn.Module):
        def step_stats(self):
            return {"count": torch.tensor(3.0), "vector": torch.ones(2)}

    stats = ModelStatistics([Plain()], 1.0)
    assert stats.metrics(stats.local()) == {
        "test_model_stats/model/count": 3.0,
        "test_model_stats/max/count": 3.0,
        "test_model_stats/count": 3.0,
    }


def degrees_copies(**degrees) -> int:
    return copies(mesh_dims(load_registries()["parallelism"]), degrees)


def test_copies_count_only_processes_that_hold_the_same_layers_over_the_same_tokens():
    assert degrees_copies(dp_shard=2) == 1  # different batches
    assert degrees_copies(dp_replicate=2, dp_shard=2) == 1
    assert degrees_copies(cp=2) == 1  # the same batch, different tokens
    assert degrees_copies(pp=2) == 1  # different layers
    assert degrees_copies(tp=2) == 2  # the same tokens through the same router
    assert degrees_copies(dp_shard=2, cp=2, tp=2, pp=2) == 2


def test_processes_sum_different_tokens_not_copies_and_pipeline_stages_report_their_own_layers():
    ids = tokens(rows=4)
    reference = toy()
    alone = ModelStatistics([reference], 1.0)
    reference(ids)
    expected = alone.metrics(alone.local())

    # Data parallel (or context parallel): each process routes its own rows, weight 1.
    dp = [toy(), toy()]
    got = run_processes(
        [[m] for m in dp], 1.0 / degrees_copies(dp_shard=2), lambda r: dp[r](ids[2 * r : 2 * r + 2])
    )
    assert got[0] == got[1] == pytest.approx(expected, rel=1e-12)

    # Tensor parallel: both copies route every row; counted once.
    tp = [toy(), toy()]
    got = run_processes([[m] for m in tp], 1.0 / degrees_copies(tp=2), lambda r: tp[r](ids))
    assert got[0] == pytest.approx(expected, rel=1e-12)
    twice = [toy(), toy()]  # the control: copies summed as if they saw different tokens
    got = run_processes([[m] for m in twice], 1.0, lambda r: twice[r](ids))
    assert got[0]["toy_router/layers.0/assignments"] == 2 * expected["toy_router/layers.0/assignments"]

    # Pipeline: stage r holds layer r only (keys as in the whole model) and reports it.
    whole = toy()
    stages = []
    for r in range(2):
        stage = copy.copy(whole)
        stage._modules = dict(whole._modules)
        stage.layers = torch.nn.ModuleDict({str(r): whole.layers[str(r)]})
        stages.append(stage)
    whole(ids)
    got = run_processes([[s] for s in stages], 1.0, lambda r: None)
    assert got[0] == got[1] == pytest.approx(expected, rel=1e-12)


def test_a_module_that_breaks_the_contract_is_refused_naming_it():
    class Returns(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.value = value

        def step_stats(self):
            return self.value() if callable(self.value) else self.value

    with pytest.raises(ForgeError, match=r"Returns.step_stats\(\) \(test_model_stats/model\) returned list"):
        ModelStatistics([Returns([1.0])], 1.0).local()
    with pytest.raises(ForgeError, match=r"returned 'load' = 'high'; a statistic is a number or a tensor"):
        ModelStatistics([Returns({"load": "high"})], 1.0).local()
    keys = iter([{"a": torch.zeros(())}, {"a": torch.zeros(()), "b": torch.zeros(())}])
    stats = ModelStatistics([Returns(lambda: next(keys))], 1.0)
    stats.local()
    with pytest.raises(ForgeError, match="test_model_stats/model/b was not reported at the first step"):
        stats.local()
    with pytest.raises(ForgeError, match=r"shape \[4\] on one process and \[3\] on another"):
        run_processes(
            [[Returns({"load": torch.zeros(4)})], [Returns({"load": torch.zeros(3)})]], 1.0, lambda r: None
        )


def test_a_run_logs_the_statistics_of_every_micro_batch_to_jsonl_tensorboard_and_the_console(
    tmp_path, capsys
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from train_helpers import read_metrics, tiny_config, write_config

    from forge_core.cli.train import train

    cfg = tiny_config(
        tmp_path,
        name="routed",
        model={"name": "toy_routed", "options": {"dim": 8, "experts": 4, "top_k": 2, "n_layers": 2}},
        train={"steps": 3, "batch_size": 4, "grad_accum": 2},
        data={"heldout": {"fraction": 0.2}},
        eval={"enabled": True, "every": 2, "max_batches": 1},
        logging={"loggers": ["console", "jsonl", "tensorboard"], "options": {"console": {"bar": False}}},
    )
    assert (
        train(write_config(tmp_path / "r.yaml", cfg), [], extra_plugins=(("toy", ToyPlugin()),))
        == "completed"
    )
    records = read_metrics(tmp_path / "routed")
    for r in records:
        # Two micro-batches of 2 rows x 32 tokens, each token to top_k 2 experts; the
        # evaluation's forwards (step 2) add nothing.
        assert r["toy_router/layers.0/assignments"] == 2 * (2 * 32) * 2
        assert r["toy_router/layers.1/load_cv"] <= r["toy_router/max/load_cv"]
        assert 0 < r["toy_router/layers.0/load_min"] <= 0.25 <= r["toy_router/layers.0/load_max"]
    acc = EventAccumulator(str(tmp_path / "routed/tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {e.step: e.value for e in acc.Scalars("toy_router/max/load_cv")}
    assert got == pytest.approx({r["step"]: r["toy_router/max/load_cv"] for r in records}, rel=1e-6)
    out, err = capsys.readouterr()
    last = records[-1]
    assert f"toy_router cv {last['toy_router/max/load_cv']:.2f}" in err
    # MFU counts the parameters a token uses, and the model line says so.
    assert "M active per token: MFU counts these" in out
    info = json.loads((tmp_path / "routed/run.json").read_text())
    gates, experts, head = 4 * 8, 4 * 8 * 8, info["vocab_size"] * 8
    assert info["matmul_parameters"] == 2 * (gates + experts) + head
    assert info["active_matmul_parameters"] == 2 * (gates + experts * 2 // 4) + head


def moe_llama():
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions, MoEOptions

    moe = MoEOptions(num_experts=4, top_k=2, expert_hidden=8, every=2, aux_loss=0.01)
    options = LlamaOptions(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=16, moe=moe)
    torch.manual_seed(0)
    return build(options, vocab_size=VOCAB, attention=SdpaAttention(SdpaOptions()))


def test_an_moe_llama_reports_its_moe_blocks_from_every_training_forward_once():
    """Under activation checkpointing, over two micro-batches and an evaluation forward:
    the loads are those of the two training forwards, counted by hand from the router's
    own choices; the recomputation in backward and the evaluation add nothing."""
    from forge_plugins.parallel.checkpointing import checkpointed

    model, ids = moe_llama(), tokens()
    for block in model.layers.values():
        block.forward = checkpointed(block.forward)
    seen = []  # (chosen experts, training forward, inside backward)
    model.layers["1"].feed_forward.router.register_forward_hook(
        lambda module, args, out: seen.append(
            (out[2].detach(), module.training, torch._C._current_graph_task_id() != -1)
        )
    )
    stats = ModelStatistics([model], 1.0)
    assert [name for name, _ in stats.modules] == ["moe/layers.1"]  # block 0 is dense
    for micro in (ids[:2], ids[2:]):
        model(micro).float().logsumexp(-1).sum().backward()
    model.eval()
    with torch.no_grad():
        model(ids[:1])
    summed = stats.local()
    totals, m = stats.totals(summed)["moe/layers.1"], stats.metrics(summed)
    counted = [chosen for chosen, training, backward in seen if training and not backward]
    assert len(counted) == 2 and len(seen) == 5  # two forwards, their two recomputations, the evaluation
    load = torch.bincount(torch.cat(counted).reshape(-1), minlength=4).double()
    assert torch.equal(totals["tokens_per_expert"], load)
    assert float(totals["forwards"]) == 2 and float(totals["assignments"]) == 4 * 16 * 2
    assert m["moe/layers.1/load_cv"] == pytest.approx(float(load.std(correction=0) / load.mean()), rel=1e-12)
    assert m["moe/layers.1/load_max"] == pytest.approx(float(load.max() / load.mean()), rel=1e-12)
    assert m["moe/layers.1/dropped_frac"] == 0 and m["moe/layers.1/aux_loss"] > 0
    assert {k for k in m if not k.startswith("moe/layers.1/")} == {
        f"moe/{where}{figure}"
        for where in ("", "max/")
        for figure in ("load_min", "load_max", "load_cv", "aux_loss", "z_loss", "dropped_frac")
    }
    # Every tracker gets them under these names (MLflow would rewrite a refused character).
    from forge_plugins.loggers.mlflow import metric_name
    from forge_plugins.loggers.tracking import numeric_metrics

    assert {metric_name(k) for k in numeric_metrics(m)} == set(m)


def test_a_pipeline_stage_drops_what_its_first_forward_counted():
    """Shape inference runs each stage's forward once before the first step's
    microbatches (on uninitialised hidden states after the first stage): not counted."""
    from forge_plugins.parallel.pipeline import drop_first_forward_stats

    model, ids = toy(), tokens()
    drop_first_forward_stats(model)
    stats = ModelStatistics([model], 1.0)
    model(ids)  # shape inference's
    model(ids[:1])
    model(ids[1:2])
    assert stats.totals(stats.local())["toy_router/layers.0"]["forwards"] == 2
    model(ids[:1])  # the hook is gone: later forwards count
    assert stats.totals(stats.local())["toy_router/layers.0"]["forwards"] == 1
