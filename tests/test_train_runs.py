"""Runs driven from outside: a third-party plugin package that only observes steps,
``forge-run sample`` and ``export-hf`` from the run directory alone, and ``--nproc 2``
data parallelism matching one process."""

from __future__ import annotations

import json
import os

import pytest

from conftest import make_distribution, run_cli
from train_helpers import Recorder, read_metrics, tiny_config, write_config, write_corpus


OBSERVER = """
import json, os
from forge_core.hookspecs import hookimpl

@hookimpl
def forge_step_end(run, step, metrics):
    with open(os.path.join(run.out_dir, "observed.jsonl"), "a") as f:
        f.write(json.dumps({"step": step, "loss": metrics["loss"], "rank": run.rank}) + "\\n")
"""


def test_third_party_observer_then_sample_and_export(tmp_path):
    """A plugin package that implements only forge_step_end sees every step; the run
    directory alone then serves sample and export-hf (loaded by transformers, same logits)."""
    site = make_distribution(tmp_path / "site", "forge-observer", "0.1", {"observer": OBSERVER},
                             {"observer": "observer"})
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cfg = tiny_config(tmp_path, "obs", train={"steps": 4}, logging={"loggers": ["jsonl"]})
    path = write_config(tmp_path / "obs.yaml", cfg)
    result = run_cli(path, env=env)
    assert result.returncode == 0, result.stderr
    observed = (tmp_path / "obs/observed.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in observed] == [1, 2, 3, 4]
    assert [json.loads(line)["loss"] for line in observed] == [r["loss"] for r in read_metrics(tmp_path / "obs")]

    sample = run_cli("sample", str(tmp_path / "obs"), "--prompt", "the quick", "--max-new-tokens", "12")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("the quick") and len(sample.stdout.rstrip("\n")) > len("the quick")

    hf_dir = tmp_path / "hf"
    export = run_cli("export-hf", str(tmp_path / "obs"), str(hf_dir))
    assert export.returncode == 0, export.stderr
    import torch
    from transformers import LlamaForCausalLM

    from forge_core.train.sample import load_for_inference

    model, tokenizer, _, _ = load_for_inference(tmp_path / "obs")
    hf = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    ids = torch.tensor([tokenizer.encode("the lazy dog")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.distributed
def test_two_processes_match_one(tmp_path):
    """--nproc 2 with data parallelism gives the single-process losses (the loss is
    normalised by the global token count; gradients are summed over ranks)."""
    from forge_core.train.launch import train

    write_corpus(tmp_path / "corpus", docs=80, short=True)
    cfg = tiny_config(tmp_path, "ddp", train={"steps": 3, "batch_size": 4}, logging={"loggers": ["jsonl"]})
    result = run_cli("--nproc", "2", write_config(tmp_path / "ddp.yaml", cfg), "parallel.dp_replicate=2",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    rec = Recorder()
    train(write_config(tmp_path / "one.yaml", tiny_config(tmp_path, "one", train={"steps": 3, "batch_size": 4})),
          extra_plugins=(("rec", rec),))
    records = read_metrics(tmp_path / "ddp")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["tokens"] == rec.metrics[r["step"]]["tokens"]
        assert r["loss"] == pytest.approx(rec.metrics[r["step"]]["loss"], rel=1e-5)
