"""The ``console`` logger: a tqdm progress bar on stderr with step, loss, learning rate,
tokens/s, MFU and peak memory (one plain line per logged step with ``bar: false``, or
when tqdm is missing), and the training objective's own metrics (those named
``<train.objective>/...``: ``dpo/reward_accuracy``). A model that reports routing
statistics (:mod:`forge_core.train.model_stats`) adds, per group (``moe``), the all-layer
auxiliary loss and the worst layer's load coefficient of variation and dropped fraction:
``moe aux=0.0123 cv=0.31 drop=0.0%``. A step that evaluated adds ``eval/loss`` and
``eval/perplexity`` (under an objective that is not per token, its count and metrics
instead) on the plain line, or as a line of its own above the bar, which would overwrite
it, and the summary at the end gives the last of them. Acts on the main process only.

The bar shows the figures of the step its counter shows: they are set before the
counter moves, because moving it is what redraws the bar. Its rate and remaining time
come from the steps alone (:class:`StepTimes`), not from tqdm's clock, which starts
before the trackers log in and the first step warms up."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from forge_core.api import hookimpl
from forge_core.api.unstable import format_perplexity


def _fmt_loss(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def _fmt_mfu(metrics: dict[str, Any]) -> str:
    """``"41.0%"``; ``"100% (capped)"`` for a step that beat the run's peak (the trainer
    has said once why), so a capped step is not read as a true 100%."""
    return "100% (capped)" if metrics.get("mfu_capped") else f"{metrics['mfu']:.1%}"


def _fmt_memory(metrics: dict[str, Any]) -> str:
    """``"mem 12.3/14.0 GiB"`` (CUDA allocated/reserved peaks) or ``"rss 1.52 GiB"``
    (resident memory), the largest over processes; empty without memory figures."""
    allocated = metrics.get("mem_cuda_allocated_peak_gib_max")
    reserved = metrics.get("mem_cuda_reserved_peak_gib_max")
    if allocated is not None and reserved is not None:
        return f"mem {allocated:.1f}/{reserved:.1f} GiB"
    rss = metrics.get("mem_rss_peak_gib_max")
    return f"rss {rss:.2f} GiB" if rss is not None else ""


#: The figures of a statistics group the console shows: (metric under the group, label, format).
_ROUTING = (
    ("aux_loss", "aux", "{:.4g}"),
    ("max/load_cv", "cv", "{:.2f}"),
    ("max/dropped_frac", "drop", "{:.1%}"),
)


def _fmt_routing(metrics: dict[str, Any], sep: str) -> str:
    """``"moe aux<sep>0.0123 cv<sep>0.31 drop<sep>0.0%"`` for every group that reports the
    worst layer's load (``<group>/max/load_cv``); empty without one."""
    groups = [key.removesuffix("/max/load_cv") for key in metrics if key.endswith("/max/load_cv")]
    shown = []
    for group in groups:
        figures = [
            f"{label}{sep}{form.format(metrics[f'{group}/{key}'])}"
            for key, label, form in _ROUTING
            if f"{group}/{key}" in metrics
        ]
        shown.append(" ".join([group, *figures]))
    return "  ".join(shown)


def _fmt_number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def _fmt_objective(metrics: dict[str, Any], objective: str, sep: str) -> str:
    """The objective's own metrics (``dpo/reward_accuracy=0.75``), ``sep`` between a name
    and its value; empty for an objective that adds none."""
    prefix = f"{objective}/"
    return " ".join(f"{k}{sep}{_fmt_number(v)}" for k, v in metrics.items() if k.startswith(prefix))


def _fmt_eval(metrics: dict[str, Any], objective: str = "lm") -> str:
    """``"eval/loss 1.8123  eval/perplexity 6.12"``, or empty on a step that did not
    evaluate; without a perplexity (an objective that is not per token), the loss with
    the objective's count and metrics."""
    if "eval/loss" not in metrics:
        return ""
    if "eval/perplexity" not in metrics:
        shown = [
            f"{k} {_fmt_number(v)}"
            for k, v in metrics.items()
            if k != "eval/loss"
            and k.startswith("eval/")
            and (k.count("/") == 1 or k.startswith(f"eval/{objective}/"))
        ]
        return "  ".join([f"eval/loss {_fmt_loss(metrics['eval/loss'])}", *shown])
    perplexity = format_perplexity(metrics["eval/perplexity"])
    return (
        f"eval/loss {_fmt_loss(metrics['eval/loss'])}  eval/perplexity {perplexity}  "
        f"({metrics.get('eval/tokens', 0):,} tokens)"
    )


class StepTimes:
    """Seconds per step as the steps themselves take them: the time from the end of the
    first step this process saw to the end of the latest, over the steps in between, so
    evaluations and checkpoints on the way count and start-up does not (building,
    trackers logging in, the first step's warm-up). Until a second step ends, the first
    step's own ``step_time``. ``clock`` is a monotonic clock in seconds."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.clock = clock
        self.first_end: float | None = None
        self.first_time: float | None = None
        self.since_first = 0
        self.last_end = 0.0

    def step_end(self, step_time: float) -> None:
        self.last_end = self.clock()
        if self.first_end is None:
            self.first_end, self.first_time = self.last_end, step_time
        else:
            self.since_first += 1

    def seconds_per_step(self) -> float | None:
        if self.since_first:
            return (self.last_end - self.first_end) / self.since_first
        return self.first_time if self.first_time and self.first_time > 0 else None


def _step_timed(tqdm: type) -> type:
    """``tqdm`` whose rate (and so its remaining time) is ``steps.seconds_per_step()``."""

    class StepTimedBar(tqdm):
        steps: StepTimes | None = None

        @property
        def format_dict(self) -> dict[str, Any]:
            shown = super().format_dict
            seconds = self.steps.seconds_per_step() if self.steps is not None else None
            return {**shown, "rate": 1.0 / seconds} if seconds else shown

    return StepTimedBar


class ConsoleLogger:
    #: The clock step times are measured with (a test gives a fake one).
    clock = staticmethod(time.perf_counter)

    def __init__(self, options: Any) -> None:
        self.options = options
        self.bar = None
        self.steps = StepTimes()
        self.started = 0.0
        self.tokens = 0
        self.last: dict[str, Any] = {}
        self.last_eval: tuple[int, dict[str, Any]] | None = None

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        self.started = time.perf_counter()
        self.steps = StepTimes(self.clock)
        if self.options.bar:
            try:
                from tqdm import tqdm
            except ImportError:
                print(
                    "warning: tqdm is not installed; the console logger prints lines instead", file=sys.stderr
                )
            else:
                self.bar = _step_timed(tqdm)(
                    total=run.total_steps,
                    initial=run.start_step,
                    desc=run.config.run.name,
                    unit="step",
                    file=sys.stderr,
                    dynamic_ncols=True,
                    mininterval=0.2 if sys.stderr.isatty() else 5.0,
                )
                self.bar.steps = self.steps

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if not run.is_main:
            return
        self.tokens += metrics["tokens"]
        self.last = metrics
        self.steps.step_end(metrics["step_time"])
        logged = run.should_log(step)
        objective = run.config.train.objective
        evaluated = _fmt_eval(metrics, objective)
        if evaluated:
            self.last_eval = (step, metrics)
        if self.bar is not None:
            if evaluated:
                self._write(f"step {step}/{run.total_steps}  {evaluated}")
            if logged:  # before the counter moves: moving it redraws the bar
                figures = (
                    f"loss={_fmt_loss(metrics['loss'])} lr={metrics['lr']:.2e} "
                    f"tok/s={metrics['tokens_per_s']:,.0f} mfu={_fmt_mfu(metrics)}"
                )
                extra = (
                    _fmt_memory(metrics).replace(" ", "=", 1),
                    _fmt_routing(metrics, "="),
                    _fmt_objective(metrics, objective, "="),
                )
                self.bar.set_postfix_str(" ".join([figures, *(e for e in extra if e)]), refresh=False)
            self.bar.update(step - self.bar.n)
        elif logged:
            own = _fmt_objective(metrics, objective, " ")
            line = (
                f"step {step}/{run.total_steps}  loss {_fmt_loss(metrics['loss'])}  lr {metrics['lr']:.2e}  "
                f"tok/s {metrics['tokens_per_s']:,.0f}  mfu {_fmt_mfu(metrics)}"
            )
            extra = (_fmt_memory(metrics), _fmt_routing(metrics, " "), own, evaluated)
            print("  ".join([line, *(e for e in extra if e)]), file=sys.stderr, flush=True)

    @hookimpl
    def forge_checkpoint_saved(self, run, step, path):
        if run.is_main:
            self._write(f"checkpoint saved: {path}")

    @hookimpl
    def forge_train_end(self, run, step, status):
        if not run.is_main:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elapsed = time.perf_counter() - self.started
        summary = f"{status} at step {step}/{run.total_steps} in {elapsed:.1f}s"
        if self.last:
            summary += (
                f"; last loss {_fmt_loss(self.last['loss'])}, "
                f"{self.tokens / max(elapsed, 1e-9):,.0f} tokens/s overall"
            )
        if self.last_eval:
            at, metrics = self.last_eval
            perplexity = metrics.get("eval/perplexity")
            shown = "" if perplexity is None else f" (perplexity {format_perplexity(perplexity)})"
            summary += f"; eval/loss {_fmt_loss(metrics['eval/loss'])}{shown} at step {at}"
        print(f"forge: {summary}; run directory {run.out_dir}", file=sys.stderr, flush=True)

    def _write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
