"""The ``profiler`` logger: ``torch.profiler`` over a configured range of steps.

Steps ``start_step`` .. ``start_step + steps - 1`` are recorded, after ``warmup`` steps
run under the profiler and left out (its start-up cost lands there). Each step is a
``ProfilerStep#N`` range in the trace, ``N`` the step number of the metrics. What
each profiling process (``ranks``) writes, under ``<run>/<log_dir>``:

- ``trace-rank<R>-steps<A>-<B>.json``: a Chrome trace (open it in Perfetto or
  ``chrome://tracing``), CUDA kernels included on CUDA;
- with ``memory: true`` on CUDA, ``memory-rank<R>-steps<A>-<B>.pickle``: a CUDA memory
  snapshot of the recorded steps (every allocation with its stack, over time; drag it
  into https://pytorch.org/memory_viz).

The start and every file written are announced in the log. A run that ends inside the
range (a signal, fewer ``train.steps``) writes what was recorded; a resumed run that
starts past the range records nothing and says so. Failing to write a trace (a full
disk) is a warning: the run goes on.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from forge_core.api import hookimpl

#: Entries kept by the CUDA memory history (the recorder's ring buffer).
MEMORY_HISTORY_ENTRIES = 100_000


def _say(message: str) -> None:
    print(f"forge: profiler: {message}", file=sys.stderr, flush=True)


def _warn(message: str) -> None:
    print(f"warning: profiler: {message}", file=sys.stderr, flush=True)


def _uses_cuda(run: Any) -> bool:
    import torch

    return run.config.run.device != "cpu" and torch.cuda.is_available()


class CudaMemoryHistory:
    """Records every CUDA allocation while active and dumps a snapshot."""

    def start(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)

    def stop(self, path: Path | None) -> None:
        import torch

        try:
            if path is not None:
                torch.cuda.memory._dump_snapshot(str(path))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)


class ProfilerLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.prof = None
        self.step_range = None  # the open ProfilerStep#N range
        self.memory: CudaMemoryHistory | None = None
        self.first = self.last = self.begin = 0
        self.rank = 0
        self.out_dir = Path()

    # -- the hooks -------------------------------------------------------------------

    @hookimpl
    def forge_train_start(self, run):
        ranks = self.options.ranks
        if ranks and run.rank not in ranks:
            return
        o = self.options
        self.rank = run.rank
        self.out_dir = Path(run.out_dir) / o.log_dir
        self.first = max(o.start_step, run.start_step + 1)
        self.last = min(o.start_step + o.steps - 1, run.total_steps)
        if self.first > self.last:
            if run.rank == (min(ranks) if ranks else 0):  # said once
                why = (
                    f"the run starts at step {run.start_step + 1}"
                    if o.start_step <= run.start_step
                    else f"train.steps is {run.total_steps}"
                )
                _warn(
                    f"steps {o.start_step}-{o.start_step + o.steps - 1} are not in this run ({why}); "
                    f"nothing is profiled"
                )
            self.first = self.last = 0
            return
        self.begin = max(self.first - o.warmup, run.start_step + 1)  # the first step under the profiler
        if self.begin == run.start_step + 1:
            self._start(run)

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if not self.last:
            return
        if self.prof is None:
            if step == self.begin - 1:
                self._start(run)
            return
        self._close_step()
        if step >= self.last:
            self._finish(step)
        else:
            self.prof.step()
            self._open_step(step + 1)

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.prof is not None:
            self._close_step()
            self._finish(step)

    # -- the profiler ----------------------------------------------------------------

    def _start(self, run: Any) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        o = self.options
        cuda = _uses_cuda(run)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        warmup = self.first - self.begin
        with warnings.catch_warnings():  # no warmup: said in our own words below
            warnings.filterwarnings("ignore", message=".*won't be using warmup")
            steps = schedule(wait=0, warmup=warmup, active=self.last - self.first + 1, repeat=1)
        self.prof = profile(
            activities=activities,
            schedule=steps,
            record_shapes=o.record_shapes,
            profile_memory=o.memory,
            with_stack=o.with_stack,
        )
        # Label steps with the run's step numbers (ProfilerStep#N, as torch spells them),
        # not with the profiler's own count from 0.
        self.prof.record_steps = False
        self.memory = CudaMemoryHistory() if cuda and o.memory else None
        if self.memory is not None:
            self.memory.start()
        self.prof.start()
        self._open_step(self.begin)
        what = f"steps {self.first}-{self.last}" + (
            f" after {warmup} warmup step{'s' * (warmup > 1)}"
            if warmup
            else " (no warmup step: the first includes the profiler's start-up cost)"
        )
        _say(f"recording {what} on rank {self.rank}{' (CPU and CUDA)' if cuda else ''}")

    def _open_step(self, step: int) -> None:
        from torch.profiler import record_function

        self.step_range = record_function(f"ProfilerStep#{step}")
        self.step_range.__enter__()

    def _close_step(self) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None

    def _finish(self, step: int) -> None:
        """Stop the profiler after ``step`` and write what it recorded."""
        prof, self.prof = self.prof, None
        prof.stop()
        recorded_to = min(step, self.last)
        self.last = 0  # done: later steps are not looked at
        if recorded_to < self.first:
            if self.memory is not None:
                self.memory.stop(None)
            _warn(f"the run ended at step {step}, before step {self.first}; nothing was recorded")
            return
        name = f"rank{self.rank}-steps{self.first}-{recorded_to}"
        trace = self.out_dir / f"trace-{name}.json"
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))
            _say(
                f"trace of steps {self.first}-{recorded_to} written to {trace} "
                f"({trace.stat().st_size / 1e6:,.1f} MB; open it in Perfetto or chrome://tracing)"
            )
        except OSError as exc:
            _warn(f"cannot write {trace} ({exc.strerror or exc}); no trace this time")
        if self.memory is not None:
            snapshot = self.out_dir / f"memory-{name}.pickle"
            try:
                self.memory.stop(snapshot)
                _say(
                    f"CUDA memory snapshot written to {snapshot} (view it at https://pytorch.org/memory_viz)"
                )
            except OSError as exc:
                _warn(f"cannot write {snapshot} ({exc.strerror or exc})")
            self.memory = None
