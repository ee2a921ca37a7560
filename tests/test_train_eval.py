"""Evaluation in a training run and as ``forge-run eval``: the cadence and its logging,
the same numbers after a resume, the ``forge_eval_end`` hook and the run view (its
documented example executed), the command's output and its refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import Recorder, SignalAt, read_metrics, tiny_config, write_config

from forge_core import cli, hookspecs
from forge_core.api import hookimpl
from forge_core.testing import train_in_process

EVAL_KEYS = {"eval/loss", "eval/perplexity", "eval/tokens"}


class EvalRecorder(Recorder):
    """Records ``forge_eval_end`` too, and the model's mode after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.evals: dict[int, dict] = {}
        self.training: list[bool] = []

    @hookimpl
    def forge_eval_end(self, run, step, metrics):
        assert run.view.step == step
        self.evals[step] = metrics

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        super().forge_step_end(run, step, metrics)
        self.training.append(all(m.training for part in run.view.parts for m in part.modules()))


def evaluating(tmp_path: Path, name: str, **sections) -> dict:
    sections.setdefault("data", {})["heldout"] = {"fraction": 0.3}
    sections["eval"] = {"enabled": True, "every": 2, **sections.get("eval", {})}
    sections.setdefault("logging", {}).setdefault("loggers", ["jsonl"])
    return tiny_config(tmp_path, name, **sections)


def run(tmp_path: Path, config: dict, *plugins) -> str:
    path = write_config(tmp_path / f"{config['run']['name']}.yaml", config)
    return train_in_process(path, extra_plugins=tuple((f"test-{i}", p) for i, p in enumerate(plugins)))


def eval_records(run_dir: Path) -> dict[int, dict]:
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
        for r in read_metrics(run_dir)
        if "eval/loss" in r
    }


def test_a_run_evaluates_on_its_cadence_and_at_the_end_and_logs_it(tmp_path):
    """every 4 of 6 steps, and the end: steps 4 and 6, each logged although
    logging.every (5) would skip them; the hook and the step metrics agree; the model
    trains in train mode between evaluations."""
    rec = EvalRecorder()
    cfg = evaluating(tmp_path, "cadence", eval={"every": 4}, logging={"every": 5, "loggers": ["jsonl"]})
    assert run(tmp_path, cfg, rec) == "completed"
    assert sorted(rec.evals) == [4, 6]
    logged = eval_records(tmp_path / "cadence")
    assert sorted(logged) == [4, 6] and [r["step"] for r in read_metrics(tmp_path / "cadence")] == [4, 5, 6]
    for step in (4, 6):
        assert set(rec.evals[step]) == EVAL_KEYS
        assert logged[step] == pytest.approx(rec.evals[step]) == {k: rec.metrics[step][k] for k in EVAL_KEYS}
    assert rec.evals[6]["eval/perplexity"] == pytest.approx(np.exp(rec.evals[6]["eval/loss"]))
    assert rec.evals[6]["eval/loss"] < rec.evals[4]["eval/loss"]  # it learns
    assert all(rec.training) and len(rec.training) == 6


def test_a_resumed_run_logs_the_same_eval_numbers_as_an_uninterrupted_one(tmp_path):
    assert run(tmp_path, evaluating(tmp_path, "straight")) == "completed"
    assert run(tmp_path, evaluating(tmp_path, "resumed"), SignalAt(3)) == "interrupted"
    assert sorted(eval_records(tmp_path / "resumed")) == [2]
    assert run(tmp_path, evaluating(tmp_path, "resumed")) == "completed"
    straight, resumed = eval_records(tmp_path / "straight"), eval_records(tmp_path / "resumed")
    assert sorted(straight) == [2, 4, 6]
    assert resumed == straight  # bit for bit: same weights, same rows, same order


def test_the_hook_reference_example_runs_and_the_view_is_read_only(tmp_path, capsys):
    """The example in ``forge_eval_end``'s docstring, executed as written."""
    example = re.search(r"Example.*?::\n\n(.*)", hookspecs.forge_eval_end.__doc__, re.S).group(1)
    namespace = {"hookimpl": hookimpl, "torch": torch, "np": np}
    exec(compile(__import__("textwrap").dedent(example), "forge_eval_end example", "exec"), namespace)
    views = []

    class Keep:
        @hookimpl
        def forge_eval_end(self, run):
            views.append(run.view)

    assert (
        run(
            tmp_path,
            evaluating(tmp_path, "example", eval={"every": 0}),
            namespace["NextTokenAccuracy"](),
            Keep(),
        )
        == "completed"
    )
    assert re.search(r"step 6: next-token accuracy \d+\.\d%", capsys.readouterr().out)
    view = views[0]
    with pytest.raises(AttributeError, match="read-only"):
        view.step = 3
    with pytest.raises(AttributeError):
        view.model = None
    assert view.step == 6 and view.train_rows.num_rows > 0 and view.seq_len == 32


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run of 6 steps, evaluated at 4 and 6, with checkpoints at 4 and 6."""
    tmp = tmp_path_factory.mktemp("finished")
    cfg = evaluating(tmp, "done", eval={"every": 4}, checkpoint={"every": 4, "keep": 3})
    assert run(tmp, cfg) == "completed"
    return tmp / "done"


def eval_json(capsys, *argv) -> dict:
    assert cli.main(["eval", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_forge_run_eval_gives_the_numbers_the_run_logged(finished, capsys):
    logged = eval_records(finished)
    latest = eval_json(capsys, finished)
    assert latest["step"] == 6 and latest["checkpoint"].endswith("step-000006")
    assert latest["loss"] == pytest.approx(logged[6]["eval/loss"], rel=1e-9)
    assert latest["tokens"] == logged[6]["eval/tokens"] and latest["data"] == "the held-out split"
    earlier = eval_json(capsys, finished, "--checkpoint", 4)
    assert earlier["loss"] == pytest.approx(logged[4]["eval/loss"], rel=1e-9)
    limited = eval_json(capsys, finished, "eval.max_batches=2", "eval.batch_size=2")
    assert (limited["rows"], limited["batches"]) == (4, 2)
    assert cli.main(["eval", str(finished)]) == 0
    assert re.search(
        r"step 6: eval loss \d+\.\d{4}, perplexity [\d.]+ over [\d,]+ target tokens", capsys.readouterr().out
    )


def test_forge_run_eval_on_another_source(finished, capsys, tmp_path):
    from train_helpers import write_corpus

    other = write_corpus(tmp_path / "other", docs=6, seed=9)
    result = eval_json(capsys, finished, "eval.source=text", f"eval.source_options.paths=[{other}]")
    assert result["data"].startswith("source 'text'") and result["tokens"] > 0


def test_forge_run_eval_refuses_bad_inputs_with_exit_2(finished, capsys, tmp_path):
    def refused(*argv) -> str:
        assert cli.main(["eval", *map(str, argv)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err

    assert "no run directory" in refused(tmp_path / "missing")
    assert "has no config.yaml" in refused(tmp_path)
    assert "no checkpoint of step 5 (complete checkpoints: 4, 6)" in refused(finished, "--checkpoint", "5")
    assert "no document is held out" in refused(finished, "data.heldout.fraction=0")
    (tmp_path / "empty.txt").write_text("")
    assert "empty" in refused(
        finished, "eval.source=text", f"eval.source_options.paths=[{tmp_path / 'empty.txt'}]"
    )
    assert "unknown data source 'txt'" in refused(finished, "eval.source=txt")


def test_every_built_in_logger_shows_the_eval_numbers(tmp_path, capsys, monkeypatch):
    """console line, TensorBoard scalars and the second curve of loss.png (the points
    handed to the plot, also after a resume, read back from metrics.jsonl)."""
    from forge_plugins.loggers import plot

    drawn = {}
    real = plot.write_plot

    def spy(path, points, smooth, title, eval_points=None):
        drawn.update(points=dict(points), eval_points=dict(eval_points or {}))
        real(path, points, smooth, title, eval_points=eval_points)

    monkeypatch.setattr(plot, "write_plot", spy)
    loggers = {"loggers": ["console", "jsonl", "plot", "tensorboard"], "options": {"console": {"bar": False}}}
    assert run(tmp_path, evaluating(tmp_path, "loggers", logging=loggers), SignalAt(3)) == "interrupted"
    assert run(tmp_path, evaluating(tmp_path, "loggers", logging=loggers)) == "completed"
    logged = eval_records(tmp_path / "loggers")
    err = capsys.readouterr().err
    assert re.search(r"step 4/6 .* eval/loss \d\.\d{4}  eval/perplexity [\d.]+", err), err
    assert (
        f"eval/loss {logged[6]['eval/loss']:.4f} (perplexity" in err and ") at step 6;" in err
    )  # the summary
    assert drawn["eval_points"] == pytest.approx({s: r["eval/loss"] for s, r in logged.items()})
    assert sorted(drawn["eval_points"]) == [2, 4, 6] and sorted(drawn["points"]) == list(range(1, 7))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "loggers/tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for key in ("eval/loss", "eval/perplexity"):
        got = {e.step: e.value for e in acc.Scalars(key)}
        assert got == pytest.approx({s: r[key] for s, r in logged.items()}, rel=1e-6)
