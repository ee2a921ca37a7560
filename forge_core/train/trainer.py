"""The training loop.

It knows components only through the registries: :func:`~forge_core.train.parts.build_parts`
builds the run's parts from the judged plan (the model with its attention backend, the
data path, the optimizers, the strategies), the loggers receive the lifecycle hooks like
any third-party plugin, and every step is :func:`~forge_core.train.step.optimizer_step`.

Each step of the loop:

1. take ``train.grad_accum`` micro-batches and set the scheduled learning rate;
2. train one optimizer step on them (:mod:`forge_core.train.step`), with what the
   model reports about its forwards (:mod:`forge_core.train.model_stats`);
3. on an evaluation step (``eval.every``, and the last with ``eval.at_end``), evaluate
   (:mod:`forge_core.train.evaluate`), call ``forge_eval_end`` and add the eval metrics
   to the step's; the cadence counts steps from the start of the run, so a resumed run
   evaluates the same steps;
4. add what plugins return from ``forge_step_metrics``
   (:mod:`forge_core.train.plugin_metrics`) and report metrics through
   ``forge_step_end``; act on a non-finite loss (policy: skip or stop); save on
   ``checkpoint.every``, on SIGTERM/SIGINT and at the end.

The whole run holds the run directory's lock (:mod:`forge_core.train.run_lock`), taken
by rank 0 before anything is built or written.

SIGTERM/SIGINT are handled from the start of :meth:`Trainer.run`: during the build, the
run directory's preparation and the resume they stop it at once
(:class:`~forge_core.errors.Interrupted`, nothing saved); from the first step on, at the
next step boundary, after saving. Alone, a process acts on a signal at once; in a group,
on the flag every process agreed on in the step's all-reduce, so all stop at the same
step.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from forge_core import components
from forge_core.api import ForgeError, Plan, RunContext
from forge_core.distributed.placement import Placement, all_gather_object, broadcast_object
from forge_core.plugins import register
from forge_core.train import mixture_tally, plugin_metrics, rundir, schedule_span, start_adapters
from forge_core.train import train_state as ts
from forge_core.train.base_identity import (
    SETTINGS_KEY,
    base_identity,
    check_base,
    check_settings,
    transform_settings,
)
from forge_core.train.base_identity import STATE_KEY as BASE_KEY
from forge_core.train.checkpoint import (
    is_disk_full,
    no_space_message,
    remove_stale_temporaries,
    saved_model_differences,
    train_state_name,
)
from forge_core.train.parts import RunParts, build_parts
from forge_core.train.run_lock import RunLock
from forge_core.train.signals import StopSignal, signal_number
from forge_core.train.step import StepFixed, optimizer_step

if TYPE_CHECKING:
    from forge_core.registry import Registries


class NonFiniteStop(ForgeError):
    """The loss or gradient norm was not finite and the policy says stop."""


def log(placement: Placement, message: str) -> None:
    if placement.is_main:
        print(f"forge: {message}", flush=True)


def warn(placement: Placement, message: str) -> None:
    if placement.is_main:
        print(f"warning: {message}", file=sys.stderr, flush=True)


@attrs.define
class Progress:
    """Where the run stands: what a checkpoint saves and a resume restores."""

    step: int = 0
    #: Non-finite steps in a row (``train.nonfinite.max_consecutive``).
    nonfinite_streak: int = 0
    #: The step of the last checkpoint written or resumed from.
    last_saved: int | None = None
    #: The number of steps the learning-rate schedule spans (:mod:`forge_core.train.schedule_span`).
    schedule_steps: int = 0
    #: ``factor(step)``: the multiplier on ``train.lr``.
    schedule: Callable[[int], float] = lambda step: 1.0
    #: Whether the processes agreed, in this step, to stop on a signal.
    stop_agreed: bool = False


class Trainer:
    """Builds everything for one run and trains it. ``run()`` returns the final status
    (``"completed"`` or ``"interrupted"``); a failure raises after ``forge_train_end``
    was called with ``"failed"``.

    ``plan`` is the :class:`~forge_core.api.Plan` the run was judged with (at its real
    world size): the components, the strategies and the degrees are built from it, never
    recomputed from the config. ``registries`` give the loggers and the lifecycle hooks."""

    plan: Plan
    config: Any
    registries: Registries
    placement: Placement
    run_dir: Path
    stop: StopSignal
    #: Built by :meth:`build`.
    parts: RunParts | None
    progress: Progress
    #: The realized mixture's counts, for a ``data.sources`` mixture (built by :meth:`build`).
    tally: mixture_tally.MixtureTally | None

    def __init__(
        self, plan: Plan, registries: Registries, placement: Placement, stop: StopSignal | None = None
    ) -> None:
        self.plan = plan
        self.config = plan.config
        self.registries = registries
        self.placement = placement
        self.run_dir = Path(plan.config.run.out_dir)
        self.stop = stop or StopSignal()
        if (requeue := signal_number(plan.config.run.requeue_signal)) is not None:
            self.stop.also(requeue)
        self.parts = None
        self.progress = Progress()
        self.tally = None
        self.base_identity: str | None = None
        self.step_fixed: StepFixed | None = None

    @property
    def pm(self) -> Any:
        return self.registries.plugins.pm

    def build(self) -> None:
        pl = self.placement
        self.parts = build_parts(
            self.plan, self.registries, pl, self.run_dir, lambda m: log(pl, m), lambda m: warn(pl, m)
        )
        # Hashed once, by one process: a pretrained base can be many gigabytes.
        self.base_identity = broadcast_object(base_identity(self.plan) if pl.is_main else None)
        mixture = self.parts.loader.mixture
        self.tally = (
            mixture_tally.MixtureTally(mixture.labels, mixture.schedule, self.config.train.steps)
            if mixture is not None
            else None
        )
        self.step_fixed = StepFixed.of(self.parts.pmodel)  # looked up once, not every step
        self._set_schedule(schedule_span.span_at_start(self.config.train))

    def _set_schedule(self, steps: int) -> None:
        self.progress.schedule_steps = steps
        self.progress.schedule = components.schedule(self.plan, self.registries, steps)

    @contextlib.contextmanager
    def claim_run_dir(self) -> Any:
        """Rank 0 takes the run directory's lock before anything is written, and removes
        what interrupted writes left there (so a restart frees the space they took);
        every process waits for its verdict. Released when the run ends."""
        pl = self.placement
        lock, error = None, None
        if pl.is_main:
            try:
                lock = RunLock.acquire(self.run_dir, lambda m: warn(pl, m))
                removed, freed = remove_stale_temporaries(self.run_dir)
                if removed:
                    log(
                        pl,
                        f"removed {len(removed)} unfinished write(s) left in {self.run_dir} by an "
                        f"earlier run ({freed / 1e6:,.1f} MB)",
                    )
                if not lock.recorded:  # the disk was full: try again now that space was freed
                    lock.record()
            except Exception as exc:  # noqa: BLE001 - the other ranks must hear of any failure
                error = exc
        verdict = (
            error
            if error is None or isinstance(error, ForgeError)
            else ForgeError(f"rank 0 failed to prepare {self.run_dir}: {type(error).__name__}: {error}")
        )
        verdict = broadcast_object(verdict)
        if verdict is not None:
            if lock is not None:
                lock.release()
            raise error if error is not None else verdict
        try:
            yield
        finally:
            if lock is not None:
                lock.release()

    def prepare_run_dir(self) -> None:
        pl = self.placement
        if not pl.is_main:
            return
        try:
            self._write_run_files()
        except OSError as exc:
            if not is_disk_full(exc, self.run_dir):
                raise
            where = Path(exc.filename) if exc.filename else self.run_dir
            raise ForgeError(
                f"{no_space_message(where, 'the run directory')} Free some space (or move "
                f"run.out_dir to a larger disk) and run again."
            ) from None

    def _write_run_files(self) -> None:
        pl, parts = self.placement, self.parts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        changed = rundir.changed_settings(self.run_dir, self.config)
        if changed and (self.run_dir / "checkpoints").is_dir() and self.config.checkpoint.resume == "auto":
            warn(
                pl,
                f"{self.run_dir} was written with a different config ({', '.join(changed[:8])}"
                f"{' ...' if len(changed) > 8 else ''}); resuming anyway",
            )
        rundir.save_config(self.run_dir, self.config)
        tok_dir = self.run_dir / rundir.TOKENIZER
        tok_dir.mkdir(exist_ok=True)
        parts.tokenizer.save(str(tok_dir))
        rundir.save_run_info(
            self.run_dir,
            {
                "vocab_size": parts.vocab_size,
                "tokenizer_identity": str(parts.tokenizer.identity),
                "parameters": parts.n_params,
                "matmul_parameters": parts.mfu.n_matmul,
                "active_matmul_parameters": parts.mfu.n_active,
                "world_size": pl.world_size,
            },
        )

    def find_checkpoint(self) -> Path | None:
        """The checkpoint to resume from (``checkpoint.resume: auto``), chosen before the
        run directory is written to, so a refusal (every checkpoint damaged) leaves it as
        it was."""
        if self.config.checkpoint.resume != "auto":
            return None
        return self.parts.checkpoints.find_resume(lambda m: warn(self.placement, m))

    def start_from_adapters(self, resuming: bool) -> None:
        """``model.init_adapters_from``: the adapters the run starts from, checked by rank 0
        (every process hears its verdict) before the run directory is written, loaded into
        the model unless the run resumes its own checkpoint, and into the reference when
        that is a copy (:mod:`forge_core.train.start_adapters`)."""
        parts, pl = self.parts, self.placement
        if not self.config.model.init_adapters_from or (resuming and parts.reference_copy is None):
            return
        found: Any = None
        if pl.is_main:
            try:
                found = str(start_adapters.source_checkpoint(self.plan, self.base_identity))
            except ForgeError as exc:
                found = exc
        found = broadcast_object(found)
        if isinstance(found, ForgeError):
            raise found
        if parts.reference_copy is not None:
            start_adapters.load_frozen_adapters(Path(found), parts.reference_copy)
        if not resuming:
            start_adapters.load_adapters(Path(found), parts.pmodel.parts)
            log(pl, f"adapters start from {found} (model.init_adapters_from), at step 0")

    def _check_fits(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse the checkpoint at ``path`` (train state ``state``) when it was written for
        another tokenizer, base or adapter settings: before the tensors, where another
        vocabulary or rank would fail as a shape mismatch and fewer adapters would load
        silently."""
        identity = str(self.parts.tokenizer.identity)
        if state.get("tokenizer_identity") not in (None, identity):
            raise ForgeError(
                f"checkpoint {path} was trained with tokenizer {state['tokenizer_identity']!r}, "
                f"the config gives {identity!r}. Use the same tokenizer or a new run.out_dir."
            )
        check_base(state, self.plan, path, self.base_identity)
        check_settings(state, self.plan, path)

    def check_resumable(self, path: Path | None) -> None:
        """:meth:`_check_fits` on the checkpoint to resume, before the run directory is
        written to (its config.yaml would otherwise record the config refused)."""
        if path is None:
            return
        state_file = path / train_state_name(0)
        try:
            state = ts.read(state_file)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ForgeError(f"cannot read {state_file}: {exc}") from None
        self._check_fits(path, state)
        if state.get(SETTINGS_KEY) is None and self.base_identity is not None:
            # Written before the settings were recorded: compare what the checkpoint holds.
            found = saved_model_differences(path, self.parts.pmodel.parts, all_gather_object)
            if found:
                listed = "".join(f"\n  - {line}" for line in found[:8])
                more = f"\n  (+{len(found) - 8} more)" if len(found) > 8 else ""
                raise ForgeError(
                    f"checkpoint {path} holds other adapters than the configured model has, so they would "
                    f"be dropped or fail to load:{listed}{more}\nResume with the transform settings it was "
                    "written with (the run's config.yaml), or give this config another run.out_dir "
                    "(a new run)."
                )

    def resume(self, path: Path | None) -> None:
        if path is None:
            return
        parts, progress = self.parts, self.progress
        state = parts.checkpoints.load(
            path,
            parts.pmodel.parts,
            parts.optimizers,
            lambda m: warn(self.placement, m),
            check=lambda state: self._check_fits(path, state),
        )
        progress.step = int(state["step"])
        progress.nonfinite_streak = int(state.get("nonfinite_streak", 0))
        parts.loader.load_state_dict(state["loader"])
        ts.restore_rng(state["rng"], self.placement.device)
        progress.last_saved = progress.step
        if self.tally is not None:
            self.tally.load_state_dict(state.get(mixture_tally.STATE_KEY), state.get(mixture_tally.PHASE_KEY))
        log(self.placement, f"resumed from {path} at step {progress.step}")
        self._resume_schedule(state.get(schedule_span.STATE_KEY))

    def _resume_schedule(self, saved: int | None) -> None:
        train = self.config.train
        self._set_schedule(schedule_span.span_on_resume(train, saved))

        def lr_at(span: int, step: int) -> float:
            return train.lr * components.schedule(self.plan, self.registries, span)(step)

        notice = schedule_span.resume_notice(train, saved, self.progress.step, lr_at)
        if notice:
            warn(self.placement, notice)

    # -- checkpoints -----------------------------------------------------------------

    def save(self, run: RunContext) -> None:
        parts, progress = self.parts, self.progress
        if progress.last_saved == progress.step:
            return
        state = {
            "step": progress.step,
            "nonfinite_streak": progress.nonfinite_streak,
            "loader": parts.loader.state_dict(),
            "rng": ts.capture_rng(self.placement.device),
            "tokenizer_identity": str(parts.tokenizer.identity),
            schedule_span.STATE_KEY: progress.schedule_steps,
        }
        if self.base_identity is not None:
            state[BASE_KEY] = self.base_identity
            state[SETTINGS_KEY] = transform_settings(self.plan)
        if self.tally is not None:
            state[mixture_tally.STATE_KEY] = self.tally.state_dict()
            state[mixture_tally.PHASE_KEY] = self.tally.phase_state()
        step = progress.step
        parts.checkpoints.save(
            step,
            parts.pmodel.parts,
            parts.optimizers,
            state,
            writing=lambda tmp: self.pm.hook.forge_checkpoint_writing(run=run, step=step, path=str(tmp)),
            # With checkpoint.async, once the background write is complete (a later step).
            saved=lambda path: self.pm.hook.forge_checkpoint_saved(run=run, step=step, path=str(path)),
        )
        progress.last_saved = step

    # -- the loop --------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        parts, progress, pl = self.parts, self.progress, self.placement
        train = self.config.train
        t0 = time.perf_counter()
        micro, sources = [], []
        for _ in range(train.grad_accum):
            micro.append(next(parts.loader))
            sources.append(parts.loader.last_sources)
        lr = train.lr * progress.schedule(progress.step)
        outcome = optimizer_step(
            parts.pmodel,
            parts.optimizers,
            micro,
            lr,
            precision_name=train.precision,
            device=pl.device,
            slice_weight=parts.slice_weight,
            grad_clip=train.grad_clip,
            stop=self.stop.received is not None or parts.checkpoints.save_failed,
            count_pairs=parts.count_pairs,
            counts=self.tally.local(micro, sources) if self.tally is not None else (),
            measured=parts.stats.local,
            fixed=self.step_fixed,
        )
        step_time = time.perf_counter() - t0
        progress.stop_agreed = outcome.stop_agreed
        progress.nonfinite_streak = 0 if outcome.stepped else progress.nonfinite_streak + 1
        progress.step += 1
        mfu, mfu_capped, notice = parts.mfu(parts.step_inputs, int(outcome.pairs), step_time)
        if notice:
            warn(pl, notice)
        mixture = self.tally.metrics(outcome.counts, progress.step) if self.tally is not None else {}
        phase_note = self.tally.phase_ended(progress.step) if self.tally is not None else None
        if phase_note:
            log(pl, phase_note)
        return {
            "loss": outcome.loss,
            "lr": lr,
            "grad_norm": outcome.grad_norm,
            "tokens": int(outcome.tokens),
            "tokens_per_s": outcome.tokens / step_time,
            "mfu": mfu,
            "mfu_capped": mfu_capped,
            "step_time": step_time,
            "skipped": not outcome.stepped,
            **outcome.metrics,
            **parts.memory.measure(),
            **mixture,
            **parts.stats.metrics(outcome.measured),
        }

    def eval_due(self) -> bool:
        return self.parts.eval_data is not None and self.config.eval.due(
            self.progress.step, self.config.train.steps
        )

    def evaluate(self, run: RunContext) -> dict[str, Any]:
        """Evaluate now (every process), tell ``forge_eval_end``; the metrics to log."""
        from forge_core.train.evaluate import run_eval

        parts = self.parts
        result = run_eval(
            parts.pmodel,
            parts.eval_data,
            device=self.placement.device,
            precision=self.config.train.precision,
            slice_weight=parts.slice_weight,
            objective=self.plan.specs["objective"],
        )
        metrics = result.metrics()
        self.pm.hook.forge_eval_end(run=run, step=self.progress.step, metrics=dict(metrics))
        return metrics

    def view(self) -> Any:
        from forge_core.data.build import heldout_documents
        from forge_core.train.view import RunView

        parts = self.parts
        return RunView(
            pmodel=parts.pmodel,
            step=lambda: self.progress.step,
            device=self.placement.device,
            tokenizer=parts.tokenizer,
            seq_len=parts.data.seq_len,
            train_rows=parts.data.rows,
            heldout=lambda: heldout_documents(
                self.plan, self.registries, parts.tokenizer, is_main=self.placement.is_main
            ),
        )

    def check_finite(self, metrics: dict[str, Any]) -> None:
        if not metrics["skipped"]:
            return
        policy = self.config.train.nonfinite
        what = f"step {self.progress.step}: loss {metrics['loss']}, gradient norm {metrics['grad_norm']}"
        advice = (
            "Lower train.lr, raise train.warmup_steps, set train.grad_clip, or use train.precision: fp32."
        )
        if policy.policy == "stop":
            raise NonFiniteStop(f"{what}: not finite; stopping (train.nonfinite.policy: stop). {advice}")
        if self.progress.nonfinite_streak >= policy.max_consecutive:
            raise NonFiniteStop(
                f"{what}: not finite for {self.progress.nonfinite_streak} steps in a row "
                f"(train.nonfinite.max_consecutive: {policy.max_consecutive}); stopping. {advice}"
            )
        warn(
            self.placement,
            f"{what}: not finite; optimizer step skipped "
            f"({self.progress.nonfinite_streak} of at most {policy.max_consecutive} in a row)",
        )

    def run(self) -> str:
        with self.stop, self.claim_run_dir():  # a signal during start-up raises Interrupted
            return self._run()

    def _stop_now(self) -> bool:
        """Alone, act on a signal (or a failed background save) at once; together, on the
        flag every process agreed on in this step's all-reduce."""
        if self.placement.world_size == 1:
            return self.stop.received is not None or self.parts.checkpoints.save_failed
        return self.progress.stop_agreed

    def _settle_checkpoints(self, status: str) -> None:
        """A run that fails still waits for the checkpoint its background save is writing
        (it may be the one to resume from); a failure of that save is then only warned
        about, the run's own error is the one raised."""
        if status != "failed":
            return
        try:
            self.parts.checkpoints.wait()
        except BaseException as exc:  # noqa: BLE001 - never hide the run's own error
            warn(self.placement, f"the checkpoint being written in the background failed too: {exc}")

    def _run(self) -> str:
        self.build()
        checkpoint = self.find_checkpoint()
        self.check_resumable(checkpoint)
        self.start_from_adapters(resuming=checkpoint is not None)
        self.prepare_run_dir()
        self.resume(checkpoint)
        self.stop.start_training()
        cfg, pl, progress = self.config, self.placement, self.progress
        checkpoints = self.parts.checkpoints
        total = cfg.train.steps
        run = RunContext(
            config=cfg,
            out_dir=str(self.run_dir),
            start_step=progress.step,
            total_steps=total,
            rank=pl.rank,
            world_size=pl.world_size,
            view=self.view(),
        )
        registered = []
        # pluggy calls the most recently registered first: register in reverse so the
        # loggers see each hook in the order logging.loggers lists them.
        for name, instance in reversed(components.loggers(self.plan, self.registries)):
            register(self.pm, instance, f"logger.{name}")
            registered.append(instance)
        status = "failed"
        try:
            self.pm.hook.forge_train_start(run=run)
            if progress.step >= total:
                log(pl, f"already trained to step {progress.step} (train.steps: {total}); nothing to do")
            with self.stop:
                while progress.step < total:
                    metrics = self.train_step()
                    if self.eval_due():
                        metrics.update(self.evaluate(run))
                    metrics.update(plugin_metrics.collect(self.pm, run, progress.step, metrics))
                    self.pm.hook.forge_step_end(run=run, step=progress.step, metrics=dict(metrics))
                    if run.should_log(progress.step):
                        self.parts.memory.next_window()
                    self.check_finite(metrics)
                    checkpoints.poll()
                    if self._stop_now():
                        checkpoints.wait()  # a background save that failed stops the run here, with its error
                        name = signal.Signals(self.stop.received).name if self.stop.received else "a signal"
                        log(pl, f"{name} received: saving a checkpoint at step {progress.step} and stopping")
                        self.save(run)
                        checkpoints.wait()
                        status = "interrupted"
                        break
                    every = cfg.checkpoint.every
                    if every > 0 and progress.step % every == 0 and progress.step < total:
                        self.save(run)
                else:
                    self.save(run)
                    checkpoints.wait()
                    status = "completed"
        finally:
            try:
                self._settle_checkpoints(status)
                self.pm.hook.forge_train_end(run=run, step=progress.step, status=status)
            finally:
                for instance in registered:
                    self.pm.unregister(instance)
                self.parts.loader.close()
        return status
