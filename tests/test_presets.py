"""Every preset in ``configs/`` that starts from a Hub id, judged and run through the
code path a user's run takes, so a preset cannot rot:

- at the real model's shapes: a Hub cache laid out here holds the real ``config.json``
  (the facts below) with safetensors headers of the real shapes (no tensor data), and
  ``forge-run check PRESET --world-size N`` passes (N: the ``--nproc`` its comment gives);
- at a reduced shape: the same id in the cache holds a tiny random checkpoint whose
  ``config.json`` keeps the real one's kind (family, tied embeddings, rope scaling) with
  small sizes, and ``forge-run PRESET`` trains two steps in process, on the CPU.

Shapes are never typed in a preset; they come from ``config.json``, so a preset that
typed one (or named an option the real checkpoint contradicts) fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hub_cache import TOKENIZER_VOCAB, header_only_checkpoint, put, random_checkpoint, tokenizer
from train_helpers import read_metrics

from forge_core import cli
from forge_plugins.hub import COMMIT

REPO = Path(__file__).resolve().parent.parent

_LLAMA3 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "max_position_embeddings": 40960,
    "use_sliding_window": False,
    "sliding_window": None,
    "head_dim": 128,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
#: The config.json of each model a preset starts from, as published on the Hub.
REAL = {
    "meta-llama/Llama-3.2-1B": {
        **_LLAMA3,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "meta-llama/Llama-3.1-8B": {
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "Qwen/Qwen3-0.6B": {
        **_QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-8B": {
        **_QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN3,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "max_window_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
    },
}
#: The sizes a reduced checkpoint takes (the kind of model stays the real one's).
REDUCED = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,  # wider than hidden / heads, as Qwen3's heads are
    "vocab_size": TOKENIZER_VOCAB + 20,
}
#: ... and a reduced mixture of experts (ignored by a dense config.json).
REDUCED_MOE = {"moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2}


def reduced(repo_id: str) -> dict:
    """The reduced ``config.json`` of a preset's model (8 experts: ep 8 still divides them)."""
    real = REAL[repo_id]
    # Only where the real file has it (qwen's): a field the family does not read is refused.
    windows = {"max_window_layers": 2} if "max_window_layers" in real else {}
    return {**real, **REDUCED, **windows, **(REDUCED_MOE if "num_experts" in real else {})}


#: What a two-step run on the CPU changes: never a model option.
SMALL_RUN = (
    "run.device=cpu",
    "train.precision=fp32",
    "train.steps=2",
    "train.warmup_steps=1",
    "train.batch_size=8",
    "train.peak_tflops=1.0",
    "data.seq_len=32",
    "checkpoint.every=2",
    "logging.loggers=[jsonl]",
)


def presets() -> dict[str, dict]:
    """``{file name: config}`` of every config in ``configs/`` that starts from a Hub id."""
    found = {}
    for path in sorted((REPO / "configs").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        source = config.get("model", {}).get("options", {}).get("init_from_hf", "")
        if re.fullmatch(r"[\w.-]+/[\w.-]+", source):
            found[path.name] = config
    return found


PRESETS = presets()


def world_size(name: str) -> int:
    """The process count the preset states (``run.world_size``), else 1."""
    return PRESETS[name].get("run", {}).get("world_size") or 1


def commented_world_size(name: str) -> int:
    """The process count the preset's comment runs it with (``forge-run --nproc N``)."""
    found = re.search(
        r"forge-run --nproc (\d+) configs/" + re.escape(name), (REPO / "configs" / name).read_text()
    )
    return int(found.group(1)) if found else 1


def test_the_presets_are_found_and_each_model_has_its_facts():
    expected = (
        "llama-3.2-1b",
        "llama-3.1-8b-fsdp",
        "llama-3.1-8b-lora",
        "qwen3-0.6b",
        "qwen3-8b-fsdp",
        "qwen3-30b-a3b-ep",
    )
    assert {f"{name}.yaml" for name in expected} <= set(PRESETS)
    ids = {config["model"]["options"]["init_from_hf"] for config in PRESETS.values()}
    assert ids <= set(REAL), f"presets of models without their config.json facts here: {ids - set(REAL)}"
    assert world_size("llama-3.1-8b-fsdp.yaml") == 8 and world_size("llama-3.2-1b.yaml") == 1
    # A preset made for more than one process states it, as its comment runs it.
    for name in PRESETS:
        assert world_size(name) == commented_world_size(name), name


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A working directory with ``configs/`` and ``data/train.jsonl``, and an empty Hub
    cache with the network off."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "data").mkdir()
    lines = [
        json.dumps({"text": f"def f{i}(x):\n    return x * {i}  # the quick brown fox\n"}) for i in range(60)
    ]
    (tmp_path / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def cache_model(project: Path, repo_id: str, checkpoint: Path) -> Path:
    tokenizer(checkpoint)
    return put(project / "hub", repo_id, checkpoint)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_passes_check_at_the_real_models_shapes(project, capsys, name):
    repo_id = PRESETS[name]["model"]["options"]["init_from_hf"]
    cache_model(project, repo_id, header_only_checkpoint(project / "ck", REAL[repo_id]))
    # A preset that states its world size is judged at it without --world-size.
    given = [] if world_size(name) > 1 else ["--world-size", "1"]
    code = cli.main(["check", f"configs/{name}", *given])
    out = capsys.readouterr().out
    assert code == 0 and f"world size {world_size(name)}" in out, out
    if not given:
        assert "(run.world_size: the processes this config is made for)" in out, out


def test_a_preset_made_for_8_processes_is_refused_at_another_world_size(project, capsys):
    name = "llama-3.1-8b-fsdp.yaml"
    repo_id, n = PRESETS[name]["model"]["options"]["init_from_hf"], world_size(name)
    assert n == 8
    cache_model(project, repo_id, header_only_checkpoint(project / "ck", REAL[repo_id]))
    refusal = (
        f"run.world_size = {n}: this config is made for {n} processes, but the world size is 1",
        f"Launch {n} processes (`forge-run --nproc {n} CONFIG`",
        "overriding run.world_size=1",
    )
    assert cli.main(["check", f"configs/{name}", "--world-size", "1"]) == 2
    out = capsys.readouterr().out
    assert "[run.world-size]" in out and all(words in out for words in refusal), out
    # A run of one process is refused before anything is built.
    assert cli.main([f"configs/{name}", f"run.out_dir={project / 'run'}"]) == 2
    out = capsys.readouterr()
    assert all(words in out.err for words in refusal) and not (project / "run").exists(), out.err


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_trains_two_steps_at_a_reduced_shape(project, capsys, name):
    repo_id = PRESETS[name]["model"]["options"]["init_from_hf"]
    snapshot = cache_model(project, repo_id, random_checkpoint(project / "ck", reduced(repo_id)))
    # One process: a preset's fixed degrees other than the world-filling dp_shard drop to 1,
    # and the world size it states with them.
    degrees = [
        f"parallel.{dim}=1" for dim in ("ep", "tp", "cp", "pp") if dim in PRESETS[name].get("parallel", {})
    ]
    stated = ["run.world_size=1"] if world_size(name) > 1 else []
    code = cli.main([f"configs/{name}", *SMALL_RUN, *degrees, *stated, f"run.out_dir={project / 'run'}"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    losses = [m["loss"] for m in read_metrics(project / "run") if "loss" in m]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses), losses
    saved = yaml.safe_load((project / "run" / "config.yaml").read_text())["model"]["options"]
    # The run records the snapshot it started from, and the shapes config.json gave.
    assert COMMIT.fullmatch(saved["revision"]) and saved["revision"] == snapshot.name
    assert (saved["dim"], saved["n_layers"], saved["head_dim"]) == (32, 2, 16)
    assert saved["tie_embeddings"] is REAL[repo_id]["tie_word_embeddings"]


FINE_TUNING = "docs/fine-tuning.md"
#: The page's sections played here (each other section has its own test).
SECTIONS = ("Models by Hub id", "Presets")


def section(name: str) -> str:
    text = (REPO / FINE_TUNING).read_text()
    start = text.index(f"\n## {name}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_fine_tuning_page_runs_as_pasted(tmp_path, monkeypatch):
    """The commands of the page's :data:`SECTIONS`, from a checkout's root (``configs/``
    linked in), against a Hub cache holding a reduced checkpoint under every preset's
    id; each training command with :data:`SMALL_RUN` appended."""
    from doc_chapters import Setting, play_chapters

    for repo_id in {config["model"]["options"]["init_from_hf"] for config in PRESETS.values()}:
        folder = tmp_path / "checkpoints" / repo_id
        put(tmp_path / "hub", repo_id, tokenizer(random_checkpoint(folder, reduced(repo_id))))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    page = "".join(section(name) for name in SECTIONS)
    (tmp_path / "play").mkdir()
    played = play_chapters(
        {FINE_TUNING: page},
        tmp_path / "play",
        {FINE_TUNING: Setting(links=("configs",), train_overrides=SMALL_RUN)},
    )
    assert played[FINE_TUNING] is None, played[FINE_TUNING]
