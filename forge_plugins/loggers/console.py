"""The ``console`` logger: a tqdm progress bar on stderr with step, loss, learning rate,
tokens/s, MFU and peak memory (one plain line per logged step with ``bar: false``, or
when tqdm is missing). A step that evaluated adds ``eval/loss`` and ``eval/perplexity``
(on the plain line, or as a line of its own above the bar, which would overwrite it),
and the summary at the end gives the last of them. Acts on the main process only."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from forge_core.api import hookimpl


def _fmt_loss(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def _fmt_memory(metrics: dict[str, Any]) -> str:
    """``"mem 12.3/14.0 GiB"`` (CUDA allocated/reserved peaks) or ``"rss 1.52 GiB"``
    (resident memory), the largest over processes; empty without memory figures."""
    allocated = metrics.get("mem_cuda_allocated_peak_gib_max")
    reserved = metrics.get("mem_cuda_reserved_peak_gib_max")
    if allocated is not None and reserved is not None:
        return f"mem {allocated:.1f}/{reserved:.1f} GiB"
    rss = metrics.get("mem_rss_peak_gib_max")
    return f"rss {rss:.2f} GiB" if rss is not None else ""


def _fmt_eval(metrics: dict[str, Any]) -> str:
    """``"eval/loss 1.8123  eval/perplexity 6.12"``, or empty on a step that did not evaluate."""
    if "eval/loss" not in metrics:
        return ""
    return (
        f"eval/loss {_fmt_loss(metrics['eval/loss'])}  eval/perplexity {metrics['eval/perplexity']:.4g}  "
        f"({metrics.get('eval/tokens', 0):,} tokens)"
    )


class ConsoleLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.bar = None
        self.started = 0.0
        self.tokens = 0
        self.last: dict[str, Any] = {}
        self.last_eval: tuple[int, dict[str, Any]] | None = None

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        self.started = time.perf_counter()
        if self.options.bar:
            try:
                from tqdm import tqdm
            except ImportError:
                print(
                    "warning: tqdm is not installed; the console logger prints lines instead", file=sys.stderr
                )
            else:
                self.bar = tqdm(
                    total=run.total_steps,
                    initial=run.start_step,
                    desc=run.config.run.name,
                    unit="step",
                    file=sys.stderr,
                    dynamic_ncols=True,
                    mininterval=0.2 if sys.stderr.isatty() else 5.0,
                )

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if not run.is_main:
            return
        self.tokens += metrics["tokens"]
        self.last = metrics
        logged = run.should_log(step)
        evaluated = _fmt_eval(metrics)
        if evaluated:
            self.last_eval = (step, metrics)
        if self.bar is not None:
            if evaluated:
                self._write(f"step {step}/{run.total_steps}  {evaluated}")
            self.bar.update(step - self.bar.n)
            if logged:
                memory = _fmt_memory(metrics).replace(" ", "=", 1)
                self.bar.set_postfix_str(
                    f"loss={_fmt_loss(metrics['loss'])} lr={metrics['lr']:.2e} "
                    f"tok/s={metrics['tokens_per_s']:,.0f} mfu={metrics['mfu']:.1%} {memory}".rstrip(),
                    refresh=False,
                )
        elif logged:
            line = (
                f"step {step}/{run.total_steps}  loss {_fmt_loss(metrics['loss'])}  lr {metrics['lr']:.2e}  "
                f"tok/s {metrics['tokens_per_s']:,.0f}  mfu {metrics['mfu']:.1%}  {_fmt_memory(metrics)}  "
                f"{evaluated}"
            )
            print(line.rstrip(), file=sys.stderr, flush=True)

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
            summary += (
                f"; eval/loss {_fmt_loss(metrics['eval/loss'])} (perplexity "
                f"{metrics['eval/perplexity']:.4g}) at step {at}"
            )
        print(f"forge: {summary}; run directory {run.out_dir}", file=sys.stderr, flush=True)

    def _write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
