"""A plugin adds metrics of its own (``forge_step_metrics``): they reach ``metrics.jsonl``,
the trackers and every logger like built-in ones, an evaluator's number lands on its
evaluation step, and a name that is taken or a value that is not a number is refused
naming the plugin."""

from __future__ import annotations

import numpy as np
import pytest

from forge_core.api import ForgeError, RunContext, hookimpl
from forge_core.plugins import new_plugin_manager, register
from forge_core.train.plugin_metrics import collect


class Throughput:
    """The hook's own example: a number derived from the step's, and one an evaluator
    measured in ``forge_eval_end`` reported on the same step."""

    def __init__(self) -> None:
        self.measured = None

    @hookimpl
    def forge_eval_end(self, step, metrics):
        self.measured = 1.0 / metrics["eval/perplexity"]

    @hookimpl
    def forge_step_metrics(self, run, step, metrics):
        added = {"throughput/tokens_per_s_per_process": metrics["tokens_per_s"] / run.world_size}
        added["throughput/step_squared"] = np.int64(step) ** 2  # a NumPy scalar is taken as a float
        if self.measured is not None:
            added["eval/inverse_perplexity"], self.measured = self.measured, None
        return added


def test_a_plugin_metric_reaches_metrics_jsonl_and_the_trackers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from train_helpers import read_metrics, tiny_config, write_config

    from forge_core.cli.train import train

    cfg = tiny_config(
        tmp_path,
        name="m",
        train={"steps": 4},
        data={"heldout": {"fraction": 0.2}},
        eval={"enabled": True, "every": 2, "max_batches": 1},
        logging={"loggers": ["jsonl", "tensorboard"]},
    )
    assert train(
        write_config(tmp_path / "m.yaml", cfg), [], extra_plugins=(("throughput", Throughput()),)
    ) == ("completed")
    records = {r["step"]: r for r in read_metrics(tmp_path / "m")}
    assert sorted(records) == [1, 2, 3, 4]
    for step, r in records.items():
        assert r["throughput/tokens_per_s_per_process"] == pytest.approx(r["tokens_per_s"])
        assert r["throughput/step_squared"] == step**2
    evaluated = {
        s: r["eval/inverse_perplexity"] for s, r in records.items() if "eval/inverse_perplexity" in r
    }
    assert evaluated == pytest.approx(
        {2: 1 / records[2]["eval/perplexity"], 4: 1 / records[4]["eval/perplexity"]}
    )
    acc = EventAccumulator(str(tmp_path / "m/tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {e.step: e.value for e in acc.Scalars("throughput/tokens_per_s_per_process")}
    assert got == pytest.approx({s: r["tokens_per_s"] for s, r in records.items()}, rel=1e-6)
    assert {e.step for e in acc.Scalars("eval/inverse_perplexity")} == {2, 4}


class Returns:
    def __init__(self, value) -> None:
        self.value = value

    @hookimpl
    def forge_step_metrics(self):
        return self.value


def _collect(*plugins, metrics=None):
    pm = new_plugin_manager()
    for name, plugin in plugins:
        register(pm, plugin, name)
    run = RunContext(config=None, out_dir="out", start_step=0, total_steps=4)
    return collect(pm, run, 1, dict(metrics or {"loss": 2.0}))


def test_what_plugins_return_is_merged_and_nothing_is_nothing():
    assert _collect(("a", Returns({"a/x": 1})), ("b", Returns(None)), ("c", Returns({"c/y": 0.5}))) == {
        "a/x": 1,
        "c/y": 0.5,
    }
    assert _collect() == {}


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        (
            [("acc", Returns({"loss": 1.0}))],
            "plugin 'acc': forge_step_metrics() returned 'loss', a metric Forge already reports. "
            "Give it a name of its own, prefixed with the plugin's: 'acc/loss'.",
        ),
        (
            [("a", Returns({"x": 1.0})), ("b", Returns({"x": 2.0}))],
            "both return the metric 'x' from forge_step_metrics()",
        ),
        ([("acc", Returns({"acc/x": "high"}))], "returned 'acc/x' = 'high' (str); a metric is an int"),
        ([("acc", Returns([1.0]))], "must return a dict of metric name to number, or None; it returned list"),
        ([("acc", Returns({3: 1.0}))], "returned a metric named 3; use a str"),
    ],
)
def test_a_taken_name_or_a_value_that_is_not_a_number_is_refused_naming_the_plugin(plugins, message):
    with pytest.raises(ForgeError) as caught:
        _collect(*plugins)
    assert message in str(caught.value)


def test_a_tensor_gets_the_item_hint():
    torch = pytest.importorskip("torch")
    with pytest.raises(ForgeError, match=r"\(a tensor: return value.item\(\)\)"):
        _collect(("acc", Returns({"acc/x": torch.tensor(1.0)})))


def test_the_step_metrics_a_plugin_sees_are_read_only():
    class Writes:
        @hookimpl
        def forge_step_metrics(self, metrics):
            metrics["loss"] = 0.0

    with pytest.raises(TypeError):
        _collect(("w", Writes()))
