"""From a Hugging Face checkpoint to a Hugging Face checkpoint, for every family: a
tiny random checkpoint written by transformers trains a few steps in Forge with no shape
typed (``model.options.init_from_hf`` alone), and ``forge-run export-hf`` gives back a
folder of the family's architecture that transformers loads with the trained model's
logits (float32 rounding: two libraries, two summation orders). Then what users of the
export expect: bf16, shards, the tokenizer for ``AutoTokenizer`` and
``pipeline("text-generation")``, an existing folder kept unless ``--overwrite``."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from train_helpers import read_metrics, tiny_config, write_config

from forge_core import cli
from forge_core.generate import load_for_inference
from forge_core.testing import assert_within_rounding, longest_sum

transformers = pytest.importorskip("transformers")

ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}
EXTRA = {
    "llama": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    },
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "mistral": {"sliding_window": 4096},
}


def checkpoint(path, family):
    # 260 tokens: the byte tokenizer's 258, padded as checkpoints often are.
    config = transformers.AutoConfig.for_model(
        family,
        vocab_size=260,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **EXTRA[family],
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)


def trained_run(tmp_path, family):
    checkpoint(tmp_path / "hf-in", family)
    config = tiny_config(tmp_path, "run", train={"steps": 3}, logging={"loggers": ["jsonl"]})
    config["model"]["options"] = {"init_from_hf": str(tmp_path / "hf-in")}
    assert cli.main([write_config(tmp_path / "run.yaml", config)]) == 0
    return tmp_path / "run"


def export(run_dir, out, *flags):
    return cli.main(["export-hf", str(run_dir), str(out), *flags])


def logits_agree(model, tokenizer, hf_dir, dtype=torch.float32):
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=False).eval()
    ids = torch.tensor([tokenizer.encode("the lazy dog jumps")])
    with torch.no_grad():
        expected = model(ids)
        assert_within_rounding(
            hf(ids).logits.float(),
            expected,
            dtype=dtype,
            terms=longest_sum(model, ids.shape[1]),
            what="the exported model's logits in transformers",
        )
    return hf


@pytest.mark.parametrize("family", sorted(ARCH))
def test_a_checkpoint_trains_and_exports_back_to_its_family(tmp_path, family):
    run_dir = trained_run(tmp_path, family)
    losses = [r["loss"] for r in read_metrics(run_dir)]
    assert len(losses) == 3 and all(loss == loss and loss < 10 for loss in losses)
    model, tokenizer, config, _ = load_for_inference(run_dir)
    assert config.model.options.family == family and config.model.options.dim == 32
    before = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf-in").model.norm.weight
    assert not torch.equal(model.norm.weight, before), "the run did not train the imported weights"
    assert export(run_dir, tmp_path / "hf-out") == 0
    hf = logits_agree(model, tokenizer, tmp_path / "hf-out")
    assert type(hf).__name__ == ARCH[family]
    assert json.loads((tmp_path / "hf-out/config.json").read_text())["vocab_size"] == 260


def test_export_options_users_expect(tmp_path, capsys):
    run_dir = trained_run(tmp_path, "qwen2")
    # The run directory alone is enough: the checkpoint holds every weight, and the
    # shapes the run resolved from config.json are in its saved config.
    shutil.rmtree(tmp_path / "hf-in")
    model, tokenizer, _, _ = load_for_inference(run_dir)
    out = tmp_path / "out"
    assert export(run_dir, out, "--dtype", "bf16") == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert transformers.AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_id and generation["pad_token_id"] == tokenizer.pad_id

    # An existing folder is kept unless --overwrite; then replaced by a complete export.
    capsys.readouterr()
    assert export(run_dir, out) == 2
    assert "already exists" in capsys.readouterr().err and (out / "model.safetensors").is_file()
    assert export(run_dir, out, "--overwrite", "--max-shard-size", "40KB") == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert not (out / "model.safetensors").exists() and len(set(index["weight_map"].values())) > 2
    assert not list(tmp_path.glob(".out.forge-*"))
    logits_agree(model, tokenizer, out)
    assert export(run_dir, tmp_path / "bad", "--max-shard-size", "lots") == 2
    assert "--max-shard-size: 'lots' is not a size" in capsys.readouterr().err

    # The byte tokenizer travels as a tokenizers JSON: same ids, and text generation works.
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    text = "the quick brown fox, déjà vu ✓"
    assert hf_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    assert hf_tokenizer.eos_token_id == tokenizer.eos_id
    generate = transformers.pipeline(
        "text-generation", model=str(out), tokenizer=str(out), device="cpu", trust_remote_code=False
    )
    result = generate("the quick", max_new_tokens=5, do_sample=False)
    assert result[0]["generated_text"].startswith("the quick")


def test_eval_of_a_run_started_from_a_hugging_face_checkpoint(tmp_path, capsys):
    """The checkpoint holds every weight: eval builds the model without reading the HF
    folder again (as sample and export-hf do), and evaluates."""
    run_dir = trained_run(tmp_path, "llama")
    capsys.readouterr()
    corpus = str(tmp_path / "corpus" / "*.txt")
    argv = ["eval", str(run_dir), "eval.source=text", f"eval.source_options={{paths: ['{corpus}']}}"]
    assert cli.main([*argv, "eval.max_batches=1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0
