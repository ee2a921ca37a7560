"""One real ``forge-run`` process per command: the console entry, argument parsing and
exit status as a user meets them. What each command does is tested in process
(``forge_core.testing.forge_run``) beside the code it exercises; the tests that need a
process of their own for another reason (signals, torchrun, a lock held by another
process) stay beside those. ``train``, ``sample``, ``export-hf`` and ``eval`` share one
short quickstart run."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import REPO, run_cli
from train_helpers import read_metrics

COMMANDS_SMOKED = (
    "train",
    "check",
    "plugins",
    "rules",
    "show",
    "preview",
    "prepare",
    "export-hf",
    "sample",
    "eval",
)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """``forge-run configs/quickstart.yaml`` for two steps; it evaluates its held-out split
    at the end. On this small corpus the quickstart's 5% can be a single document: hold out
    a fifth."""
    out = tmp_path_factory.mktemp("smoke") / "qs"
    result = run_cli(
        "configs/quickstart.yaml",
        f"run.out_dir={out}",
        "train.steps=2",
        "train.batch_size=2",
        "data.source_options.max_bytes=300000",
        "train.peak_tflops=1.0",
        "logging.loggers=[jsonl,plot]",
        "data.heldout.fraction=0.2",
        timeout=300,
    )
    return out, result


def test_every_command_has_a_smoke_test():
    from forge_core.cli.main import COMMANDS

    assert set(COMMANDS) == set(COMMANDS_SMOKED)


def test_train(quickstart):
    out, result = quickstart
    assert result.returncode == 0, result.stderr
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2] and records[0]["loss"] > 4.0
    assert "eval/perplexity" not in records[0] and records[1]["eval/perplexity"] > 1.0  # at the end
    assert (out / "loss.png").is_file() and (out / "checkpoints/latest").is_file()
    assert (out / "config.yaml").is_file() and (out / "run.json").is_file()
    assert re.search(r"packer: rows [\d,]+, tokens [\d,]+, kept \d+\.\d%, fill 100\.0%", result.stdout), (
        result.stdout
    )


def test_sample(quickstart):
    out, _ = quickstart
    sample = run_cli("sample", str(out), "--prompt", "the quick", "--max-new-tokens", "12", "--no-stream")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("the quick") and len(sample.stdout.rstrip("\n")) > len("the quick")


def test_export_hf(quickstart, tmp_path):
    out, _ = quickstart
    export = run_cli("export-hf", str(out), str(tmp_path / "hf"))
    assert export.returncode == 0, export.stderr
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and (tmp_path / "hf/model.safetensors").is_file()


def test_eval(quickstart):
    out, _ = quickstart
    result = run_cli("eval", str(out), "eval.max_batches=2", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["step"] == 2 and report["batches"] == 2 and report["tokens"] == 2 * 2 * 256
    assert 3.0 < report["loss"] < 6.0  # two steps in: near uniform over 258 byte ids (5.55)


def test_check():
    result = run_cli("check", "configs/quickstart.yaml", "parallel.dp_shard=2", "--world-size", "1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "[parallel.world-size]" in result.stdout
        and "configs/quickstart.yaml: invalid: 1 error(s)" in result.stdout
    )
    valid = run_cli("check", "configs/quickstart.yaml", "--world-size", "1")
    assert valid.returncode == 0 and "configs/quickstart.yaml: valid: 0 error(s)" in valid.stdout, (
        valid.stdout
    )


def test_plugins():
    result = run_cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    assert {"core_rules", "attention", "models", "packers"} <= {p["name"] for p in json.loads(result.stdout)}


def test_rules():
    result = run_cli("rules")
    assert result.returncode == 0, result.stderr
    assert "attention.honours-doc-ids  [error]  (plugin 'core_rules')" in result.stdout


def test_show():
    result = run_cli("show", "configs/quickstart.yaml", "train.lr=0.5")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["train"]["lr"] == 0.5


def test_preview():
    result = run_cli(
        "preview", "configs/quickstart.yaml", "data.source_options.max_bytes=300000", "--rows", "1"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("--- row 1 (layout row ") and "tokens take a loss" in result.stdout


def test_prepare(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i}" for i in range(50)))
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data:\n  source: text\n  source_options: {{paths: ['{corpus}'], separator: \"\\n\\n\"}}\n"
    )
    result = run_cli("prepare", str(config), "--out", str(tmp_path / "shards"), cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "shards/index.json").read_text())["num_documents"] == 50
