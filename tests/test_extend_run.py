"""Changing the length of a run on resume: the learning-rate schedule keeps the span the
run started with (no jump back up; its final value past the end) unless
``train.schedule_steps`` re-plans it, and the resumed run says what happens with both
learning rates. The changed-config warning names only settings that change results."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import Recorder, SignalAt, tiny_config, write_config

from forge_core.testing import train_in_process
from forge_core.train import rundir

LR = 3e-3


def run(tmp_path: Path, name: str, steps: int, *plugins, overrides=(), **sections) -> Recorder:
    rec = Recorder()
    cfg = tiny_config(tmp_path, name, train={"steps": steps, "lr": LR, "warmup_steps": 1}, **sections)
    path = write_config(tmp_path / f"{name}.yaml", cfg)
    extra = (("rec", rec), *((f"p{i}", p) for i, p in enumerate(plugins)))
    train_in_process(path, list(overrides), extra_plugins=extra)
    return rec


def lrs(rec: Recorder) -> dict[int, float]:
    return {step: m["lr"] for step, m in rec.metrics.items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Recorder:
    """An uninterrupted 6-step run: what the resumed runs are compared with (trained once;
    a run's losses and learning rates do not depend on its directory)."""
    return run(tmp_path_factory.mktemp("straight"), "straight", 6)


@pytest.fixture(scope="module")
def ten(tmp_path_factory) -> Recorder:
    """An uninterrupted 10-step run: the schedule planned over 10 steps from the start."""
    return run(tmp_path_factory.mktemp("ten"), "ten", 10)


def test_raising_steps_keeps_the_schedule_and_holds_its_final_value(tmp_path, capsys, straight, ten):
    run(tmp_path, "ext", 6)
    capsys.readouterr()
    extended = run(tmp_path, "ext", 10, overrides=["train.steps=10"])
    final = straight.metrics[6]["lr"]
    assert final == pytest.approx(0.1 * LR)  # cosine ends at min_lr_ratio 0.1
    assert lrs(extended) == {7: final, 8: final, 9: final, 10: final}  # no jump back up
    err = capsys.readouterr().err
    assert (
        f"train.steps is 10, the learning-rate schedule spans the 6 steps the run started with "
        f"(train.schedule_steps: 0): steps 7-10 continue at its final learning rate {final:.2e}. To stretch "
        f"the schedule over 10 steps instead, set train.schedule_steps=10 (the learning rate at step 7 goes "
        f"from {final:.2e} to {ten.metrics[7]['lr']:.2e})." in " ".join(err.split())
    )
    assert "different config" not in err  # train.steps is reported above, not as a changed setting


def test_raising_steps_mid_run_finishes_the_schedule_first(tmp_path, straight):
    first = run(tmp_path, "mid", 6, SignalAt(3))
    assert sorted(first.metrics) == [1, 2, 3]
    second = run(tmp_path, "mid", 9, overrides=["train.steps=9"])
    want = lrs(straight)
    assert lrs(second) == {4: want[4], 5: want[5], 6: want[6], 7: want[6], 8: want[6], 9: want[6]}
    assert [second.metrics[s]["loss"] for s in (4, 5, 6)] == [straight.metrics[s]["loss"] for s in (4, 5, 6)]


def test_schedule_steps_re_plans_and_says_from_what_to_what(tmp_path, capsys, straight, ten):
    run(tmp_path, "replan", 6, SignalAt(3))
    capsys.readouterr()
    before = straight.metrics[4]["lr"]
    replanned = run(tmp_path, "replan", 10, overrides=["train.steps=10", "train.schedule_steps=10"])
    assert lrs(replanned) == {s: ten.metrics[s]["lr"] for s in range(4, 11)}
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"the learning-rate schedule now spans 10 steps (train.schedule_steps), not the 6 it spanned when "
        f"this checkpoint was saved: the learning rate at step 4 goes from {before:.2e} to "
        f"{ten.metrics[4]['lr']:.2e}"
    ) in err
    # The re-planned span is what the next checkpoint carries: no notice on the next resume.
    capsys.readouterr()
    run(tmp_path, "replan", 10, overrides=["train.steps=10", "train.schedule_steps=10"])
    assert "learning-rate schedule" not in capsys.readouterr().err


def test_lowering_steps_stops_early_on_the_same_schedule(tmp_path, capsys, straight):
    run(tmp_path, "low", 6, SignalAt(2))
    capsys.readouterr()
    lowered = run(tmp_path, "low", 4, overrides=["train.steps=4"])
    assert lrs(lowered) == {3: straight.metrics[3]["lr"], 4: straight.metrics[4]["lr"]}
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"train.steps is 4, below the 6 steps the learning-rate schedule spans (those the run started "
        f"with): the run stops at step 4 with the learning rate at {straight.metrics[4]['lr']:.2e}, before "
        f"the schedule's final {straight.metrics[6]['lr']:.2e}. To end the schedule at step 4, set "
        f"train.schedule_steps=4"
    ) in err


ASKED: list[tuple[int, int]] = []


def recording_schedule(step, total_steps, warmup_steps, options):
    ASKED.append((step, total_steps))
    return 1.0 - step / total_steps


class RecordingSchedule:
    from forge_core.api import hookimpl

    @hookimpl
    def forge_schedules(self):
        from forge_core.api import ScheduleSpec

        return [
            ScheduleSpec(
                name="recording", summary="records its calls", impl="test_extend_run:recording_schedule"
            )
        ]


def test_a_third_party_schedule_is_never_asked_past_its_span():
    from forge_core import components
    from forge_core.config.blocks import resolve_components
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import structure
    from forge_core.judge import judge_config
    from forge_core.registry import load_registries

    registries = load_registries(extra=(("recording", RecordingSchedule()),))
    cfg, issues = structure({"train": {"schedule": "recording"}}, ForgeConfig)
    cfg, issues = resolve_components(cfg, registries)
    assert not issues
    ASKED.clear()
    schedule = components.schedule(judge_config(cfg, registries, 1).plan, registries, 5)
    values = [schedule(s) for s in range(8)]
    assert ASKED == [(0, 5), (1, 5), (2, 5), (3, 5), (4, 5), (4, 5), (4, 5), (4, 5)]
    assert values[4:] == [pytest.approx(0.2)] * 4  # the final value, held


@pytest.mark.parametrize(
    "path, matters",
    [
        ("train.lr", True),
        ("model.options.dim", True),
        ("data.seq_len", True),
        ("run.seed", True),
        ("attention.backend", True),
        ("train.nonfinite.policy", True),
        ("logging.every", False),
        ("logging.loggers", False),
        ("logging.options.wandb.project", False),
        ("checkpoint.every", False),
        ("checkpoint.keep", False),
        ("run.name", False),
        ("run.out_dir", False),
        ("data.num_workers", False),
        ("train.peak_tflops", False),
        ("train.steps", False),
        ("train.schedule_steps", False),
        ("parallel.dp_shard", False),
        ("train.compile", False),
        ("run.seedling", False),
    ],
)
def test_which_settings_change_results(path, matters):
    assert rundir.affects_results(path) is matters


def test_changed_config_warning_ignores_logging_only_keys(tmp_path, capsys):
    run(tmp_path, "cfg", 4, checkpoint={"every": 2})
    shutil_cut(tmp_path / "cfg", 2)
    capsys.readouterr()
    run(
        tmp_path,
        "cfg",
        4,
        overrides=[
            "logging.every=2",
            "checkpoint.every=1",
            "checkpoint.keep=5",
            "run.name=renamed",
            "logging.loggers=[jsonl]",
            "data.num_workers=1",
        ],
    )
    assert "different config" not in capsys.readouterr().err
    shutil_cut(tmp_path / "cfg", 2)
    run(tmp_path, "cfg", 4, overrides=["train.lr=1e-3", "logging.every=3"])
    err = capsys.readouterr().err
    assert "was written with a different config (train.lr); resuming anyway" in err


def shutil_cut(run_dir: Path, step: int) -> None:
    """Make the run resume from ``step``: drop later checkpoints, point ``latest`` there."""
    import shutil

    for ckpt in (run_dir / "checkpoints").glob("step-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    (run_dir / "checkpoints/latest").write_text(f"step-{step:06d}\n")
