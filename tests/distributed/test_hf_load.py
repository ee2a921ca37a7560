"""A sharded Hugging Face checkpoint (``model.safetensors.index.json``, several files)
loads under fsdp, tp and pp on 2 processes (torchrun, gloo): the model is built on the
meta device, each process materialises and reads only what it holds (fsdp and tp: half
of every sharded matrix; pp: its stage's layers), every parameter equals the
checkpoint's tensor exactly (a copy, no arithmetic), and the logits equal a single
process's. A Qwen3-MoE checkpoint loads the same way under ep (each process its experts)
and fsdp (a shard of the experts of each stack), in the same launch."""

from __future__ import annotations

import json

import pytest
import torch
from harness import HERE, torchrun

pytestmark = pytest.mark.distributed
transformers = pytest.importorskip("transformers")


#: The fields the MoE checkpoint shares with the dense one.
SHAPES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_load")
    config = transformers.AutoConfig.for_model(
        "qwen3",
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp / "hf", max_shard_size="20KB")
    assert (tmp / "hf/model.safetensors.index.json").is_file()
    moe = transformers.AutoConfig.for_model(
        "qwen3_moe",
        **{k: getattr(config, k) for k in SHAPES},
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        mlp_only_layers=[0],
    )
    transformers.AutoModelForCausalLM.from_config(moe).save_pretrained(tmp / "hf-moe", max_shard_size="20KB")
    out = tmp / "results.json"
    layouts = ["fsdp", "tp", "pp", "moe_ep", "moe_fsdp"]
    proc = torchrun(2, HERE / "hf_load.py", [str(out), str(tmp / "hf"), str(tmp / "hf-moe"), *layouts])
    if proc.returncode != 0 or not out.is_file():
        pytest.fail(
            f"torchrun exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return json.loads(out.read_text()), tmp / "hf"


def single_process_logits(hf_dir):
    """Logits of the probe, the parameter count and the parameter names of one process."""
    from forge_core.distributed.parallelize import materialize
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    model = build(LlamaOptions(init_from_hf=str(hf_dir)), 50, SdpaAttention(SdpaOptions()))
    materialize(model, "cpu")
    with torch.no_grad():
        logits = model(torch.arange(16).reshape(2, 8) % 50)
    return logits, sum(p.numel() for p in model.parameters()), {k for k, _ in model.named_parameters()}


@pytest.mark.parametrize("name", ["fsdp", "tp", "pp"])
def test_each_process_loads_what_it_holds_and_it_is_the_checkpoint(loaded, name):
    results, hf_dir = loaded
    expected, total, keys = single_process_logits(hf_dir)
    ranks = results[name]
    for rank in ranks:
        assert rank["built_on_meta"]
        assert rank["diffs"] and max(rank["diffs"].values()) == 0.0, rank["diffs"]
        if "logits" in rank:
            assert torch.allclose(torch.tensor(rank["logits"]), expected, rtol=1e-5, atol=1e-6)
    held = [rank["held"] for rank in ranks]
    if name == "fsdp":
        # Every parameter is sharded over the two processes (each holds half, rounded).
        assert sum(held) == total and max(held) - min(held) <= total // 20
    elif name == "pp":
        stages = [set(rank["diffs"]) for rank in ranks]
        assert not stages[0] & stages[1] and stages[0] | stages[1] == keys
        assert "tok_embeddings.weight" in stages[0] and "output.weight" in stages[1]
        assert sum(held) == total
    else:  # tp: the projections, embedding and head are split; norms are whole on both
        assert all(h < 0.6 * total for h in held)


@pytest.mark.parametrize("name", ["moe_ep", "moe_fsdp"])
def test_each_process_loads_its_experts_and_they_are_the_checkpoint(loaded, name):
    results, hf_dir = loaded
    expected, total, keys = single_process_logits(hf_dir.parent / "hf-moe")
    ranks = results[name]
    for rank in ranks:
        assert rank["built_on_meta"] and set(rank["diffs"]) == keys
        assert max(rank["diffs"].values()) == 0.0, rank["diffs"]
        assert torch.allclose(torch.tensor(rank["logits"]), expected, rtol=1e-5, atol=1e-6)
    # Each process holds half of every expert stack (ep: two of the four experts).
    assert all(rank["held"] < total for rank in ranks)
