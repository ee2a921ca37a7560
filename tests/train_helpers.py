"""Helpers for the trainer tests (``tests/test_train_*.py``): a tiny corpus and config,
and test plugins that observe or disturb a run through the public hooks."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import attrs
import yaml

from forge_core.api import DOC_IDS, POSITIONS, ModelSpec, hookimpl

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven small cats sing about "
    "green fields and blue rivers under the quiet morning sky"
).split()


def write_corpus(directory: Path, docs: int = 40, seed: int = 0, short: bool = False) -> str:
    """Text files of random words; ``short`` gives many short documents (so EOS, and
    labels of -100, fall unevenly across rows). Returns the glob for the text source."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        n = rng.randint(2, 12) if short else rng.randint(80, 160)
        (directory / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(n)))
    return str(directory / "*.txt")


def tiny_config(tmp_path: Path, name: str = "run", **sections: Any) -> dict[str, Any]:
    """A config dict for a tiny llama on a tiny corpus; ``sections`` update sections."""
    corpus = tmp_path / "corpus"
    glob = str(corpus / "*.txt") if corpus.is_dir() else write_corpus(corpus)
    config: dict[str, Any] = {
        "run": {"name": name, "out_dir": str(tmp_path / name), "seed": 0, "device": "cpu"},
        "model": {
            "name": "llama",
            "options": {
                "dim": 32,
                "n_layers": 2,
                "n_heads": 4,
                "n_kv_heads": 2,
                "max_seq_len": 64,
                "multiple_of": 16,
            },
        },
        "attention": {"backend": "sdpa"},
        "data": {
            "source": "text",
            "source_options": {"paths": [glob]},
            "tokenizer": "byte",
            "packer": "concat",
            "seq_len": 32,
        },
        "train": {"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "peak_tflops": 1.0},
        "checkpoint": {"every": 0, "keep": 2},
        "logging": {"loggers": []},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def write_config(path: Path, config: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Recorder:
    """Records every lifecycle hook call (a stand-in for a third-party plugin)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.metrics: dict[int, dict[str, Any]] = {}
        self.saved: list[int] = []
        self.start: Any = None
        self.end: tuple[int, str] | None = None

    @hookimpl
    def forge_train_start(self, run):
        self.start = run
        self.events.append(("start", run.start_step))

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        self.metrics[step] = metrics
        self.events.append(("step", step))

    @hookimpl
    def forge_checkpoint_saved(self, run, step, path):
        self.saved.append(step)
        self.events.append(("saved", step))

    @hookimpl
    def forge_train_end(self, run, step, status):
        self.end = (step, status)
        self.events.append(("end", status))


class SignalAt:
    """Sends ``signum`` to this process at the end of step ``step`` (deterministic
    stand-in for a scheduler's SIGTERM)."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step = step
        self.signum = signum

    @hookimpl
    def forge_step_end(self, step):
        if step == self.step:
            os.kill(os.getpid(), self.signum)


# --- a model plugin that produces NaN on chosen steps ---------------------------------


@attrs.frozen
class NanOptions:
    dim: int = 16
    nan_steps: list[int] = attrs.field(factory=list)


class NanModel:
    """Embedding + linear; forward returns NaN logits during the optimizer steps listed
    in ``nan_steps`` (1-based), known from the step hooks of the same plugin object."""

    next_step = 1  # the step about to run, kept current by NanPlugin

    @staticmethod
    def build(options: NanOptions, vocab_size: int, attention: Any):
        import torch

        class _Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = torch.nn.Embedding(vocab_size, options.dim)
                self.out = torch.nn.Linear(options.dim, vocab_size)

            def forward(self, input_ids, **metadata):
                logits = self.out(self.emb(input_ids))
                if torch.is_grad_enabled() and NanModel.next_step in options.nan_steps:
                    logits = logits * float("nan")
                return logits

        return _Model()


class NanPlugin:
    """Registers the ``nanny`` model and keeps ``NanModel.next_step`` current."""

    @hookimpl
    def forge_models(self):
        return [
            ModelSpec(
                name="nanny",
                summary="Test model that emits NaN on chosen steps",
                impl="train_helpers:NanModel.build",
                options=NanOptions,
                max_seq_len_option=None,
                accepts={DOC_IDS, POSITIONS},
            )
        ]

    @hookimpl
    def forge_train_start(self, run):
        NanModel.next_step = run.start_step + 1

    @hookimpl
    def forge_step_end(self, step):
        NanModel.next_step = step + 1


PAUSE_PLUGIN = """
import time

from forge_core.api import hookimpl


@hookimpl
def forge_checkpoint_writing(run, step, path):
    if run.is_main and step == {step}:
        print("checkpoint write in progress at step {step}", flush=True)
        time.sleep(60)
"""


PAUSE_BACKGROUND_PLUGIN = """
import sys
import time

from forge_core.api import hookimpl
from forge_core.train import checkpoint

_real = checkpoint.digests


def _digests(paths):
    # The background half of the save of step {step}: its files written, the manifest not.
    if paths and paths[0].parent.name == ".tmp-step-{step:06d}":
        print("background checkpoint write in flight at step {step}", flush=True)
        time.sleep(60)
    return _real(paths)


checkpoint.digests = _digests


@hookimpl
def forge_step_end(run, step):
    print(f"step {{step}} trained", flush=True)
"""


def pause_checkpoint_env(tmp_path: Path, step: int, background: bool = False) -> dict[str, str]:
    """The environment of a ``forge-run`` subprocess whose checkpoint write of ``step``
    pauses for 60 s (files written, manifest not yet) after printing ``checkpoint write
    in progress at step N``, so a test can kill it there: a plugin implementing
    ``forge_checkpoint_writing``, installed as an entry point on ``PYTHONPATH``. With
    ``background`` (``checkpoint.async``) the pause is in the background half of the save
    instead, printing ``background checkpoint write in flight at step N`` while the
    training goes on (each step prints ``step N trained``)."""
    from conftest import make_distribution

    site = make_distribution(
        tmp_path / f"pause-site-{step}{'-background' * background}",
        "forge-pause",
        "0.1",
        {"forge_pause": (PAUSE_BACKGROUND_PLUGIN if background else PAUSE_PLUGIN).format(step=step)},
        {"pause": "forge_pause"},
    )
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
