"""The ``console`` logger: a tqdm progress bar on stderr with step, loss, learning rate
and tokens/s (one plain line per logged step with ``bar: false``, or when tqdm is
missing). Acts on the main process only."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from forge_core.api import hookimpl


def _fmt_loss(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


class ConsoleLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.bar = None
        self.started = 0.0
        self.tokens = 0
        self.last: dict[str, Any] = {}

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        self.started = time.perf_counter()
        if self.options.bar:
            try:
                from tqdm import tqdm
            except ImportError:
                print("warning: tqdm is not installed; the console logger prints lines instead",
                      file=sys.stderr)
            else:
                self.bar = tqdm(total=run.total_steps, initial=run.start_step, desc=run.config.run.name,
                                unit="step", file=sys.stderr, dynamic_ncols=True,
                                mininterval=0.2 if sys.stderr.isatty() else 5.0)

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if not run.is_main:
            return
        self.tokens += metrics["tokens"]
        self.last = metrics
        logged = run.should_log(step)
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if logged:
                self.bar.set_postfix_str(
                    f"loss={_fmt_loss(metrics['loss'])} lr={metrics['lr']:.2e} "
                    f"tok/s={metrics['tokens_per_s']:,.0f} mfu={metrics['mfu']:.1%}",
                    refresh=False,
                )
        elif logged:
            print(f"step {step}/{run.total_steps}  loss {_fmt_loss(metrics['loss'])}  lr {metrics['lr']:.2e}  "
                  f"tok/s {metrics['tokens_per_s']:,.0f}  mfu {metrics['mfu']:.1%}", file=sys.stderr, flush=True)

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
            summary += (f"; last loss {_fmt_loss(self.last['loss'])}, "
                        f"{self.tokens / max(elapsed, 1e-9):,.0f} tokens/s overall")
        print(f"forge: {summary}; run directory {run.out_dir}", file=sys.stderr, flush=True)

    def _write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
