"""Runs driven from outside: a third-party plugin package that only observes steps,
``forge-run sample`` and ``export-hf`` from the run directory alone, and ``--nproc 2``
data parallelism matching one process."""

from __future__ import annotations

import json

import pytest
from conftest import make_distribution, run_cli
from train_helpers import Recorder, read_metrics, tiny_config, write_config, write_corpus

from forge_core.testing import forge_run

OBSERVER = """
import json, os
from forge_core.api import hookimpl

@hookimpl
def forge_step_end(run, step, metrics):
    with open(os.path.join(run.out_dir, "observed.jsonl"), "a") as f:
        f.write(json.dumps({"step": step, "loss": metrics["loss"], "rank": run.rank}) + "\\n")
"""


def test_third_party_observer_then_sample_and_export(tmp_path):
    """A plugin package that implements only forge_step_end sees every step; the run
    directory alone then serves sample and export-hf (loaded by transformers, same logits)."""
    site = make_distribution(
        tmp_path / "site", "forge-observer", "0.1", {"observer": OBSERVER}, {"observer": "observer"}
    )
    cfg = tiny_config(tmp_path, "obs", train={"steps": 4}, logging={"loggers": ["jsonl"]})
    path = write_config(tmp_path / "obs.yaml", cfg)
    result = forge_run([path], paths=[site])
    assert result.code == 0, result.stderr
    observed = (tmp_path / "obs/observed.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in observed] == [1, 2, 3, 4]
    assert [json.loads(line)["loss"] for line in observed] == [
        r["loss"] for r in read_metrics(tmp_path / "obs")
    ]

    sample = forge_run(["sample", tmp_path / "obs", "--prompt", "the quick", "--max-new-tokens", "12"])
    assert sample.code == 0, sample.stderr
    assert sample.stdout.startswith("the quick") and len(sample.stdout.rstrip("\n")) > len("the quick")

    hf_dir = tmp_path / "hf"
    export = forge_run(["export-hf", tmp_path / "obs", hf_dir])
    assert export.code == 0, export.stderr
    import torch
    from transformers import LlamaForCausalLM

    from forge_core.generate import load_for_inference
    from forge_core.testing import assert_within_rounding, longest_sum

    model, tokenizer, _, _ = load_for_inference(tmp_path / "obs")
    hf = LlamaForCausalLM.from_pretrained(hf_dir, trust_remote_code=False).eval()
    ids = torch.tensor([tokenizer.encode("the lazy dog")])
    with torch.no_grad():
        # Two libraries, two summation orders: equal within float32 rounding of the logits.
        terms = longest_sum(model, ids.shape[1])
        assert_within_rounding(
            hf(ids).logits, model(ids), dtype=torch.float32, terms=terms, what="transformers' logits"
        )


@pytest.mark.distributed
def test_two_processes_match_one(tmp_path):
    """--nproc 2 with data parallelism gives the single-process losses (the loss is
    normalised by the global token count; gradients are summed over ranks)."""
    from forge_core.testing import train_in_process

    write_corpus(tmp_path / "corpus", docs=80, short=True)
    cfg = tiny_config(tmp_path, "ddp", train={"steps": 3, "batch_size": 4}, logging={"loggers": ["jsonl"]})
    result = run_cli(
        "--nproc", "2", write_config(tmp_path / "ddp.yaml", cfg), "parallel.dp_replicate=2", timeout=300
    )
    assert result.returncode == 0, result.stderr
    rec = Recorder()
    train_in_process(
        write_config(
            tmp_path / "one.yaml", tiny_config(tmp_path, "one", train={"steps": 3, "batch_size": 4})
        ),
        extra_plugins=(("rec", rec),),
    )
    records = read_metrics(tmp_path / "ddp")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["tokens"] == rec.metrics[r["step"]]["tokens"]
        assert r["loss"] == pytest.approx(rec.metrics[r["step"]]["loss"], rel=1e-5)


@pytest.mark.distributed
def test_the_first_multi_process_run_needs_no_degree(tmp_path):
    """`forge-run configs/quickstart.yaml --nproc-per-node 2 ...`: options after the config,
    torchrun's spelling, and parallel.dp_shard: -1 (the default) makes 2 FSDP2 shards."""
    out = tmp_path / "qs2"
    result = run_cli(
        "configs/quickstart.yaml",
        "--nproc-per-node",
        "2",
        f"run.out_dir={out}",
        "train.steps=1",
        "train.batch_size=2",
        "data.source_options.max_bytes=100000",
        "train.peak_tflops=1.0",
        "logging.loggers=[jsonl]",
        "model.options.n_layers=2",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "device cpu x 2" in result.stdout and [r["step"] for r in read_metrics(out)] == [1]
    assert len(list((out / "checkpoints/step-000001").glob("train_state-rank*.json"))) == 2


@pytest.mark.distributed
def test_sigterm_to_a_two_process_run_saves_and_resumes(tmp_path):
    """SIGTERM to `forge-run --nproc 2` reaches the workers: they agree on a step, save
    one checkpoint (a train state per rank) and exit 0, and forge-run exits 143; the next
    start resumes it."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    cfg = tiny_config(tmp_path, "ddpterm", train={"steps": 100000}, logging={"loggers": ["jsonl"]})
    path = write_config(tmp_path / "ddpterm.yaml", cfg)
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge_core.cli", "--nproc", "2", path, "parallel.dp_replicate=2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "ddpterm/metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    step = int((tmp_path / "ddpterm/checkpoints/latest").read_text().strip().removeprefix("step-"))
    ckpt = tmp_path / f"ddpterm/checkpoints/step-{step:06d}"
    assert (ckpt / "train_state-rank00000.json").is_file() and (ckpt / "train_state-rank00001.json").is_file()
    resumed = run_cli("--nproc", "2", path, "parallel.dp_replicate=2", f"train.steps={step + 2}", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {step}" in resumed.stdout.split("resumed from", 1)[1]
    assert [r["step"] for r in read_metrics(tmp_path / "ddpterm")][-3:] == [step, step + 1, step + 2]


def test_hf_tokenizer_run_is_self_contained(tmp_path):
    """A run with a Hugging Face tokenizer keeps a copy of it: sample works after the
    original tokenizer directory is gone, and export-hf ships the tokenizer files."""
    import argparse
    import shutil

    from transformers import AutoTokenizer

    from forge_core.cli import export
    from forge_core.data.bpe import train_bpe
    from forge_core.generate import generate, load_for_inference
    from forge_core.testing import train_in_process
    from forge_plugins.sources.options import TextOptions
    from forge_plugins.sources.text import TextSource

    glob = write_corpus(tmp_path / "corpus")
    tok_dir = train_bpe(TextSource(TextOptions(paths=[glob])), 300, tmp_path / "bpe", progress=False)
    cfg = tiny_config(
        tmp_path,
        "hfrun",
        train={"steps": 2},
        data={"tokenizer": "hf", "tokenizer_options": {"path": tok_dir}},
    )
    train_in_process(write_config(tmp_path / "hfrun.yaml", cfg))
    shutil.rmtree(tok_dir)

    model, tokenizer, config, _ = load_for_inference(tmp_path / "hfrun")
    ids = tokenizer.encode("the quick")
    new = generate(model, ids, 5, context=32, temperature=1.0, top_k=0, seed=0)  # no eos_id: all 5
    assert len(new) == 5 and all(0 <= t < tokenizer.vocab_size for t in new)

    out = tmp_path / "hf-out"
    export.main(argparse.Namespace(checkpoint=str(tmp_path / "hfrun"), out_dir=str(out)))
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    assert (
        AutoTokenizer.from_pretrained(out, trust_remote_code=False).encode(
            "the quick", add_special_tokens=False
        )
        == ids
    )
