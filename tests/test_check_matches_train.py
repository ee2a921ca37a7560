"""``check``'s verdict is the run's: configs that passed ``forge-run check`` and then
failed when the run built its components now fail at ``check`` (exit 2), and
``forge-run CONFIG`` refuses them with the same errors before building anything (no run
directory, torch never imported). One subprocess runs the whole corpus through the
command line's entry point."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import make_distribution

SMALL = {"dim": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_hidden": 16, "max_seq_len": 64}
VOCAB = 300


def hf_config(**changes) -> dict:
    config = {
        "model_type": "llama",
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 16,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    return {**config, **changes}


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A real safetensors file of zeros (header: name -> dtype, shape, byte offsets)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def llama_shapes(q_rows: int = 8) -> dict[str, list[int]]:
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": [VOCAB, 8],
        "model.norm.weight": [8],
        "lm_head.weight": [VOCAB, 8],
        layer + "input_layernorm.weight": [8],
        layer + "post_attention_layernorm.weight": [8],
        layer + "self_attn.q_proj.weight": [q_rows, 8],
        layer + "self_attn.k_proj.weight": [4, 8],
        layer + "self_attn.v_proj.weight": [4, 8],
        layer + "self_attn.o_proj.weight": [8, 8],
        layer + "mlp.gate_proj.weight": [16, 8],
        layer + "mlp.up_proj.weight": [16, 8],
        layer + "mlp.down_proj.weight": [8, 16],
    }


def hf_folder(root: Path, name: str, config: dict | None, shapes: dict | None) -> str:
    folder = root / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if shapes is not None:
        write_safetensors(folder / "model.safetensors", shapes)
    return str(folder)


def corpus(root: Path) -> dict[str, tuple[dict, str]]:
    """name -> (config, a phrase of the expected error). Every one of these passed
    `check` before and failed only once the run built the component."""
    (root / "empty-tok").mkdir()
    (root / "half-shard").mkdir()
    (root / "a-file").write_text("x")
    model = lambda path: {"model": {"options": {**SMALL, "init_from_hf": path}}}  # noqa: E731
    return {
        "lr-nan": ({"train": {"lr": float("nan")}}, "$.train.lr: expected a finite number, got nan"),
        "steps-zero": ({"train": {"steps": 0}}, "$.train.steps: must be at least 1, got 0"),
        "adamw-beta1": (
            {"train": {"optimizer_options": {"beta1": 1.5}}},
            "$.train.optimizer_options.beta1: must be in [0, 1), got 1.5",
        ),
        "sgd-nesterov": (
            {"train": {"optimizer": "sgd", "optimizer_options": {"momentum": 0.0, "nesterov": True}}},
            "[sgd.nesterov-momentum]",
        ),
        "stdlib-negative": (
            {"data": {"source_options": {"max_files": -1}}},
            "$.data.source_options.max_files: must be at least 0, got -1",
        ),
        "stdlib-nothing": ({"data": {"source_options": {"max_bytes": 1}}}, "no file selected"),
        "shards-missing": (
            {"data": {"source": "shards", "source_options": {"path": str(root / "nope")}}},
            "no such shard directory",
        ),
        "shards-no-index": (
            {"data": {"source": "shards", "source_options": {"path": str(root / "half-shard")}}},
            "index.json: missing",
        ),
        "text-no-match": (
            {"data": {"source": "text", "source_options": {"paths": [str(root / "*.nothing")]}}},
            "matches no file",
        ),
        "hf-tokenizer-empty": (
            {"data": {"tokenizer": "hf", "tokenizer_options": {"path": str(root / "empty-tok")}}},
            "holds no tokenizer files (found: nothing)",
        ),
        "init-missing": (model(str(root / "no-such-hf")), "the folder does not exist"),
        "init-no-config": (model(hf_folder(root, "no-config", None, llama_shapes())), "no config.json there"),
        "init-mismatch": (
            model(hf_folder(root, "mismatch", hf_config(hidden_size=16, num_hidden_layers=2), None)),
            "model.options.dim=8 but config.json hidden_size=16: remove dim from model.options",
        ),
        "init-no-weights": (model(hf_folder(root, "no-weights", hf_config(), None)), "no model.safetensors"),
        "init-bad-shape": (
            model(hf_folder(root, "bad-shape", hf_config(), llama_shapes(q_rows=6))),
            "model.layers.0.self_attn.q_proj.weight has shape [6, 8], the options need [8, 8]",
        ),
        "out-dir-empty": ({"run": {"out_dir": ""}}, "$.run.out_dir: must be a non-empty string"),
        "out-dir-file": ({"run": {"out_dir": str(root / "a-file")}}, "exists and is not a directory"),
        "jsonl-outside": (
            {"logging": {"options": {"jsonl": {"filename": "../metrics.jsonl"}}}},
            "$.logging.options.jsonl.filename: must be a relative path inside the run directory",
        ),
    }


def report(text: str) -> list[str]:
    """The error lines of a report (config errors, or each violation's header and why)."""
    return [
        line.strip() for line in text.splitlines() if line.startswith("error:") or line.startswith("  why:")
    ]


with tempfile.TemporaryDirectory() as _scratch:
    NAMES = sorted(corpus(Path(_scratch)))


def test_the_corpus_builds_a_model_folder_that_fits(tmp_path):
    # Negative control for the init_from_hf cases: the same folder with the right shape passes.
    from forge_plugins.models.hf_config import hf_folder_problems
    from forge_plugins.models.options import LlamaOptions

    good = hf_folder(tmp_path, "good", hf_config(), llama_shapes())
    assert hf_folder_problems(LlamaOptions(**SMALL), good) == []


#: Runs `forge-run check CONFIG` and `forge-run CONFIG` (train) for every config in one
#: fresh interpreter through the command line's own entry point, and reports whether
#: torch was imported: a refusal before building anything never imports it.
DRIVER = """
import contextlib, io, json, sys
from forge_core.cli import main
results = {}
for name, path in json.loads(sys.argv[1]).items():
    for command, argv in (("check", ["check", path]), ("train", [path])):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        results.setdefault(name, {})[command] = [rc, out.getvalue(), err.getvalue()]
print(json.dumps({"results": results, "torch": "torch" in sys.modules}))
"""

GHOST = """
from forge_core.api import PackerSpec, hookimpl

@hookimpl
def forge_packers():
    return [PackerSpec(name="ghost", summary="impl never shipped", impl="ghost_impl.packer:Ghost")]
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    site = make_distribution(
        root / "site", "forge-ghost", "0.3", {"ghostplug": GHOST}, {"ghost": "ghostplug"}
    )
    cases = {
        **corpus(root),
        "missing-impl": ({"data": {"packer": "ghost"}}, "[component.implementation-found]"),
    }
    paths, expected = {}, {}
    for name, (config, phrase) in cases.items():
        path = root / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump({"train": {"steps": 2}, **config} if "train" not in config else config)
        )
        paths[name], expected[name] = str(path), phrase
    work = root / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(paths)],
        capture_output=True,
        text=True,
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result, expected, work


@pytest.mark.parametrize("name", [*NAMES, "missing-impl"])
def test_check_refuses_and_train_refuses_identically_before_building(outcomes, name):
    result, expected, work = outcomes
    (check_rc, check_out, check_err), (train_rc, train_out, train_err) = (
        result["results"][name]["check"],
        result["results"][name]["train"],
    )
    assert check_rc == 2, check_out + check_err
    assert expected[name] in check_out + check_err
    assert train_rc == 2, train_out + train_err
    assert "Traceback" not in train_err
    assert report(train_err) == report(check_out + check_err) != []
    # Nothing was built: no run directory or file, and torch never imported.
    assert list(work.iterdir()) == [] and result["torch"] is False


def test_the_missing_implementation_report_names_plugin_distribution_and_fix(outcomes):
    result, _, _ = outcomes
    out = result["results"]["missing-impl"]["check"][1]
    for needle in (
        "[component.implementation-found] (plugin 'ghost')",
        "packer 'ghost'",
        "forge-ghost 0.3",
        "'ghost_impl.packer:Ghost'",
        "module 'ghost_impl.packer' cannot be found",
        "Reinstall forge-ghost",
    ):
        assert needle in out, out
