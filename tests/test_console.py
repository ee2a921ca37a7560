"""What the console logger shows: the bar's figures are those of the step its counter
shows, its remaining time comes from step times (not from start-up), and perplexity
has one spelling wherever it is printed."""

from __future__ import annotations

import io
import re
import sys
from types import SimpleNamespace

import pytest

from forge_core.api import RunContext
from forge_core.api.unstable import format_perplexity
from forge_plugins.loggers.console import ConsoleLogger, StepTimes
from forge_plugins.loggers.options import ConsoleOptions

TOTAL = 200


class Terminal(io.StringIO):
    """stderr as a terminal: tqdm draws frames separated by carriage returns."""

    def isatty(self) -> bool:
        return True

    def frames(self) -> list[str]:
        return [f for f in re.split(r"[\r\n]", self.getvalue()) if "/200" in f]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_run(start_step: int = 0) -> RunContext:
    config = SimpleNamespace(
        run=SimpleNamespace(name="bar"),
        logging=SimpleNamespace(every=1),
        eval=SimpleNamespace(due=lambda step, total: False),
        train=SimpleNamespace(objective="lm"),
    )
    return RunContext(config=config, out_dir="out", start_step=start_step, total_steps=TOTAL)


def metrics(loss: float, step_time: float = 1.0) -> dict[str, float]:
    return {"loss": loss, "lr": 1e-3, "tokens": 64, "tokens_per_s": 64.0, "mfu": 0.1, "step_time": step_time}


def start(monkeypatch):
    """A console logger with a bar on a terminal, started; called in the test itself
    (pytest puts its own stderr back between a fixture and the test)."""
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    logger = ConsoleLogger(ConsoleOptions(bar=True))
    logger.clock = clock = FakeClock()
    run = fake_run()
    logger.forge_train_start(run)
    logger.bar.mininterval = 0  # draw on every update, as a terminal does at 5 steps/s
    return logger, run, terminal, clock


def test_the_bar_shows_the_loss_of_the_step_its_counter_shows(monkeypatch):
    logger, run, terminal, clock = start(monkeypatch)
    for step, loss in ((1, 5.5), (2, 4.25), (3, 3.125)):
        clock.now += 1.0
        logger.forge_step_end(run, step, metrics(loss))
        last = terminal.frames()[-1]
        # Before: "1/200" with no loss, "2/200" with step 1's 5.5000.
        assert f" {step}/200 " in last and f"loss={loss:.4f}" in last, last


def test_the_remaining_time_comes_from_the_steps_not_from_start_up(monkeypatch):
    logger, run, terminal, clock = start(monkeypatch)
    clock.now = 1000.0  # 1000 s of start-up (trackers logging in) before the first step ends
    logger.forge_step_end(run, 1, metrics(5.0, step_time=2.5))
    # One step seen: its own step time, 199 steps x 2.5 s = 497.5 s.
    assert "<08:17," in terminal.frames()[-1] and "2.50s/step" in terminal.frames()[-1]
    for step in (2, 3):
        clock.now += 2.0  # every later step, evaluation and logging included, takes 2 s
        logger.forge_step_end(run, step, metrics(5.0, step_time=1.5))
    # From the ends of steps 1 to 3: 2 s a step, 197 steps left = 394 s.
    assert "<06:34," in terminal.frames()[-1] and "2.00s/step" in terminal.frames()[-1]


def test_step_times_before_and_after_a_second_step():
    clock = FakeClock()
    times = StepTimes(clock)
    assert times.seconds_per_step() is None
    clock.now = 50.0
    times.step_end(0.0)  # a step too fast to time gives no estimate rather than a division by zero
    assert times.seconds_per_step() is None
    clock.now = 53.0
    times.step_end(0.5)
    clock.now = 60.0  # the third step evaluated: 7 s
    times.step_end(0.5)
    assert times.seconds_per_step() == pytest.approx(5.0)


def test_perplexity_has_one_format_everywhere_it_is_printed(monkeypatch):
    """The bar's evaluation line, the summary and ``forge-run eval``'s report print the
    same text for the same value: two decimals, a round 20 included (``:.4g`` printed
    ``20`` beside ``14.59``)."""
    assert [format_perplexity(v) for v in (20.0, 14.5912, 6.1244, 50257.3)] == [
        "20.00",
        "14.59",
        "6.12",
        "50257.30",
    ]
    assert format_perplexity(float("inf")) == "inf"
    logger, run, terminal, clock = start(monkeypatch)
    for step, ppl in ((1, 20.0), (2, 14.5912)):
        m = {**metrics(3.0), "eval/loss": 3.0, "eval/perplexity": ppl, "eval/tokens": 640}
        logger.forge_step_end(run, step, m)
    logger.forge_train_end(run, 2, "completed")
    out = terminal.getvalue()
    assert "eval/perplexity 20.00  " in out and "eval/perplexity 14.59  " in out
    assert "(perplexity 14.59) at step 2" in out


def test_a_capped_mfu_is_shown_as_capped_not_as_a_true_100_percent(monkeypatch):
    logger, run, terminal, clock = start(monkeypatch)
    clock.now += 1.0
    logger.forge_step_end(run, 1, {**metrics(5.0), "mfu": 1.0, "mfu_capped": True})
    assert "mfu=100% (capped)" in terminal.frames()[-1]
    clock.now += 1.0
    logger.forge_step_end(run, 2, {**metrics(4.0), "mfu": 0.25, "mfu_capped": False})
    assert "mfu=25.0%" in terminal.frames()[-1] and "capped" not in terminal.frames()[-1]


def test_routing_statistics_show_the_aux_loss_and_the_worst_layers_load_and_drops(monkeypatch):
    routed = {"moe/aux_loss": 0.012345, "moe/max/load_cv": 0.314, "moe/max/dropped_frac": 0.015}
    logger, run, terminal, clock = start(monkeypatch)
    clock.now += 1.0
    logger.forge_step_end(run, 1, {**metrics(5.0), **routed})
    assert "mfu=10.0% moe aux=0.01235 cv=0.31 drop=1.5%]" in terminal.frames()[-1]
    clock.now += 1.0
    logger.forge_step_end(run, 2, metrics(4.0))  # a dense model: nothing about routing
    assert "moe" not in terminal.frames()[-1] and "aux" not in terminal.frames()[-1]
    monkeypatch.setattr("sys.stderr", io.StringIO())
    plain = ConsoleLogger(ConsoleOptions(bar=False))
    plain.forge_train_start(run)
    plain.forge_step_end(run, 1, {**metrics(5.0), **routed})
    assert "mfu 10.0%  moe aux 0.01235 cv 0.31 drop 1.5%" in sys.stderr.getvalue()
