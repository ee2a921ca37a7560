"""A DPO run end to end, in process: ``forge-run`` on a tiny preference JSONL (rendered
by a chat template, pairs packed several to a row by bfd), the reward accuracy and the
margin in metrics.jsonl rising on a learnable preference (the preferred answer depends
on the prompt), and the evaluation through the objective."""

from __future__ import annotations

import json
import math

import pytest
from train_helpers import read_metrics, tiny_config, write_config

from forge_core import cli

#: A short, prefix-stable template: the byte tokenizer has none of its own.
TEMPLATE = (
    "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
STEPS = 16


def preference_config(tmp, name, **train):
    # "yes" is preferred to a prompt that starts with "y", "no" to one that starts with
    # "n"; every prompt differs (the held-out split is by content).
    answers = ("yes", "no")
    pairs = [
        {"prompt": f"{answers[i % 2][0]}{i}", "chosen": answers[i % 2], "rejected": answers[1 - i % 2]}
        for i in range(64)
    ]
    data = tmp / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp / "short.jinja").write_text(TEMPLATE)
    config = tiny_config(
        tmp,
        name,
        train={"steps": STEPS, "lr": 1e-2, "batch_size": 8, "warmup_steps": 0, "objective": "dpo", **train},
        logging={"loggers": ["jsonl"]},
        eval={"enabled": True, "every": 8, "max_batches": 2},
    )
    config["data"].update(
        source="text",
        source_options={"paths": [str(data)]},
        packer="bfd",
        seq_len=64,
        heldout={"fraction": 0.2},
        chat={"format": "preference", "template": str(tmp / "short.jinja")},
    )
    return config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dpo")
    config = write_config(tmp / "dpo.yaml", preference_config(tmp, "dpo", objective_options={"beta": 0.5}))
    assert cli.main([config]) == 0
    return tmp


def test_the_reward_accuracy_rises_from_the_reference(run):
    metrics = read_metrics(run / "dpo")
    first, last = metrics[0], metrics[-1]
    # Policy == reference at the first step: every margin is 0, the loss log 2.
    assert first["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert first["dpo/reward_accuracy"] == 0.0 and first["dpo/reward_margin"] == 0.0
    late = metrics[-4:]
    assert min(m["dpo/reward_accuracy"] for m in late) >= 0.9
    assert min(m["dpo/reward_margin"] for m in late) > 0.2
    assert last["loss"] < 0.75 * math.log(2)
    assert last["dpo/chosen_reward"] > last["dpo/rejected_reward"]


def test_the_evaluation_goes_through_the_objective(run):
    evaluated = [m for m in read_metrics(run / "dpo") if "eval/loss" in m]
    assert [m["step"] for m in evaluated] == [8, 16]
    held_out = evaluated[0]["eval/pairs"]
    assert held_out > 0 and all(m["eval/pairs"] == held_out for m in evaluated)
    assert all("eval/perplexity" not in m and "eval/tokens" not in m for m in evaluated)
    for m in evaluated:
        assert 0 <= m["eval/dpo/reward_accuracy"] <= 1 and math.isfinite(m["eval/loss"])
        margin = m["eval/dpo/chosen_reward"] - m["eval/dpo/rejected_reward"]
        assert m["eval/dpo/reward_margin"] == pytest.approx(margin, rel=1e-6, abs=1e-9)
    # Held-out prompts the run never trained on: the preference generalises.
    assert evaluated[-1]["eval/loss"] < evaluated[0]["eval/loss"]
    assert evaluated[-1]["eval/dpo/reward_accuracy"] >= 0.9
