"""The training loop.

It knows components only through the registries: the model with its attention backend,
the data path (source -> tokenizer -> packer -> stateful loader), the optimizer and
schedule, the parallelism strategies (through :mod:`forge_core.train.parallelize`) and
the loggers, which receive the lifecycle hooks like any third-party plugin.

One optimizer step:

1. take ``train.grad_accum`` micro-batches and count, over every data-parallel rank,
   the tokens whose label is not -100 (one small all-reduce);
2. for each micro-batch, :meth:`ParallelModel.forward_backward` under the chosen
   precision: every batch key but ``labels`` passed to the model as a keyword argument,
   loss *sum* divided by that global count, backward (gradient sync only on the last
   micro-batch);
3. finish the gradients (what strategies reduce once per step, after the last
   backward: tensor parallelism's partial parameters), clip to the global gradient
   norm, check the loss and norm are finite (policy:
   skip or stop), step the optimizer, advance the schedule;
4. on an evaluation step (``eval.every``, and the last with ``eval.at_end``), evaluate
   (:mod:`forge_core.train.evaluate`), call ``forge_eval_end`` and add the eval metrics
   to the step's; the cadence counts steps from the start of the run, so a resumed run
   evaluates the same steps;
5. report metrics through ``forge_step_end``; save on ``checkpoint.every``, on
   SIGTERM/SIGINT (flag set by the handler, acted on here) and at the end.

The whole run holds the run directory's lock (:mod:`forge_core.train.run_lock`), taken
by rank 0 before anything is built or written.

SIGTERM/SIGINT are handled from the start of :meth:`Trainer.run`: during the build, the
run directory's preparation and the resume they stop it at once
(:class:`~forge_core.errors.Interrupted`, nothing saved); from the first step on, at the
next step boundary, after saving.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, ForgeError, RunContext
from forge_core.plugins import register
from forge_core.train import components, flops, precision, rundir, schedule_span
from forge_core.train import train_state as ts
from forge_core.train.checkpoint import (
    CheckpointManager,
    is_disk_full,
    no_space_message,
    remove_stale_temporaries,
)
from forge_core.train.distributed import Placement, all_reduce_sum, broadcast_object
from forge_core.train.loss import build_loss
from forge_core.train.memory import MemoryMeter
from forge_core.train.parallelize import clip_grad_norm, is_meta, parallelize
from forge_core.train.run_lock import RunLock
from forge_core.train.signals import StopSignal


class NonFiniteStop(ForgeError):
    """The loss or gradient norm was not finite and the policy says stop."""


def log(placement: Placement, message: str) -> None:
    if placement.is_main:
        print(f"forge: {message}", flush=True)


def warn(placement: Placement, message: str) -> None:
    if placement.is_main:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _grad_sync(module: Any, enabled: bool) -> contextlib.AbstractContextManager:
    """Skip data-parallel gradient sync on all but the last micro-batch: DDP's
    ``no_sync()``, FSDP2's ``set_requires_gradient_sync``; nothing for a plain module."""
    if module is None:
        return contextlib.nullcontext()
    if hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if not enabled and hasattr(module, "no_sync"):
        return module.no_sync()
    return contextlib.nullcontext()


class Trainer:
    """Builds everything for one run and trains it. ``run()`` returns the final status
    (``"completed"`` or ``"interrupted"``); a failure raises after ``forge_train_end``
    was called with ``"failed"``.

    ``plan`` is the :class:`~forge_core.api.Plan` the run was judged with (at its real
    world size): the components, the strategies and the degrees are built from it, never
    recomputed from the config. ``registries`` give the loggers and the lifecycle hooks."""

    def __init__(self, plan: Any, registries: Any, placement: Placement,
                 stop: StopSignal | None = None) -> None:
        self.plan = plan
        self.config = config = plan.config
        self.registries = registries
        self.placement = placement
        self.pm = registries.plugins.pm
        self.run_dir = Path(config.run.out_dir)
        self.step = 0
        self.nonfinite_streak = 0
        self.stop = stop or StopSignal()
        self.last_saved: int | None = None

    # -- build -----------------------------------------------------------------------

    def build(self) -> None:
        cfg, plan, reg, pl = self.config, self.plan, self.registries, self.placement
        train = cfg.train
        precision.check_precision(train.precision, pl.device)
        seed_everything(cfg.run.seed)
        self.tokenizer = components.tokenizer(plan, reg)
        from forge_core.data.build import build_training_data

        # Tokens come from the cache (one process per node tokenizes, the others wait);
        # rows are read lazily from them by the loader below.
        self.data = build_training_data(plan, reg, self.tokenizer, is_main=pl.is_main)
        log(pl, self.data.summary)

        self.probe = flops.AttentionProbe(components.attention(plan, reg))
        model = components.model(plan, reg, int(self.tokenizer.vocab_size), self.probe)
        # A pretrained model may keep a larger (padded) vocabulary than the tokenizer's:
        # what the run records is what rebuilds this model (sample, export-hf).
        self.vocab_size = int(getattr(model, "vocab_size", None) or self.tokenizer.vocab_size)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_matmul = flops.matmul_params(model)
        self.attn_width = flops.measure_attention_width(model, self.probe, next(model.parameters()).device)
        if not is_meta(model):  # one on the meta device is materialised by parallelize
            model.to(pl.device)

        # Strategies (and train.compile, slotted in among them) are applied in their
        # declared order; data-parallel wrappers SUM gradients over ranks.
        # train.loss: the full logits, or the chunked loss (which takes over the model's
        # output head before the strategies shard it).
        self.pmodel = parallelize(model, plan, pl.device, loss_fn=build_loss(model, cfg))
        dp = self.pmodel.dp_size
        self.micro_batch = train.batch_size // (dp * train.grad_accum)
        if self.micro_batch < 1 or self.micro_batch * dp * train.grad_accum != train.batch_size:
            raise ForgeError(f"train.batch_size = {train.batch_size} does not split into {dp} data-parallel "
                             f"ranks x {train.grad_accum} accumulation steps")
        # Every process with the same dp_rank reads the same batch: a per-process count
        # weighted by this, summed over all processes, counts each batch once.
        self.slice_weight = dp / pl.world_size
        # Every step trains on batch_size full rows, whatever the packer put in them.
        self.step_inputs = train.batch_size * self.data.seq_len
        self.optimizers = [components.optimizer(plan, reg, part) for part in self.pmodel.parts]
        self.schedule_steps = schedule_span.span_at_start(train)
        self.schedule = components.schedule(plan, reg, self.schedule_steps)

        from forge_core.data.loader import StatefulLoader

        self.loader = StatefulLoader(self.data.rows, self.micro_batch, dp_rank=self.pmodel.dp_rank, dp_size=dp,
                                     seed=cfg.run.seed, shuffle=cfg.data.shuffle,
                                     num_workers=cfg.data.num_workers)
        self.checkpoints = CheckpointManager(self.run_dir, cfg.checkpoint.keep, pl.rank, pl.world_size)
        self.memory = MemoryMeter(pl.device)
        self.eval_data = None
        if cfg.eval.enabled:
            from forge_core.train.evaluate import build_eval_data

            self.eval_data = build_eval_data(plan, reg, self.tokenizer, is_main=pl.is_main)
            log(pl, self.eval_data.summary)

        from forge_core.train.peak import cached_peak, peak_flops

        dtype = torch.bfloat16 if train.precision == "bf16" else torch.float32
        if train.peak_tflops <= 0 and cached_peak(pl.device, dtype) is None:
            log(pl, "measuring the peak matmul rate for MFU (once; cached) ...")
        self.peak, peak_source = peak_flops(pl.device, dtype, train.peak_tflops)
        self.peak_measured = train.peak_tflops <= 0
        self.peak_raised = False
        self.peak_dtype = dtype
        log(pl, f"model: {cfg.model.name}, {self.n_params / 1e6:.2f}M parameters "
                f"({self.n_matmul / 1e6:.2f}M in matmuls), attention {cfg.attention.backend}; "
                f"device {pl.device} x {pl.world_size}; peak {self.peak / 1e12:.3g} TFLOP/s ({peak_source})")

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
                    log(pl, f"removed {len(removed)} unfinished write(s) left in {self.run_dir} by an "
                            f"earlier run ({freed / 1e6:,.1f} MB)")
                if not lock.recorded:  # the disk was full: try again now that space was freed
                    lock.record()
            except Exception as exc:  # noqa: BLE001 - the other ranks must hear of any failure
                error = exc
        verdict = error if error is None or isinstance(error, ForgeError) else ForgeError(
            f"rank 0 failed to prepare {self.run_dir}: {type(error).__name__}: {error}")
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
            raise ForgeError(f"{no_space_message(where, 'the run directory')} Free some space (or move "
                             f"run.out_dir to a larger disk) and run again.") from None

    def _write_run_files(self) -> None:
        pl = self.placement
        self.run_dir.mkdir(parents=True, exist_ok=True)
        changed = rundir.changed_settings(self.run_dir, self.config)
        if changed and (self.run_dir / "checkpoints").is_dir() and self.config.checkpoint.resume == "auto":
            warn(pl, f"{self.run_dir} was written with a different config ({', '.join(changed[:8])}"
                     f"{' ...' if len(changed) > 8 else ''}); resuming anyway")
        rundir.save_config(self.run_dir, self.config)
        tok_dir = self.run_dir / rundir.TOKENIZER
        tok_dir.mkdir(exist_ok=True)
        self.tokenizer.save(str(tok_dir))
        rundir.save_run_info(self.run_dir, {
            "vocab_size": self.vocab_size,
            "tokenizer_identity": str(self.tokenizer.identity),
            "parameters": self.n_params,
            "matmul_parameters": self.n_matmul,
            "world_size": pl.world_size,
        })

    def resume(self) -> None:
        if self.config.checkpoint.resume != "auto":
            return
        path = self.checkpoints.find_resume(lambda m: warn(self.placement, m))
        if path is None:
            return

        def same_tokenizer(state: dict[str, Any]) -> None:
            # Before the tensors: another tokenizer's vocabulary would fail there as a shape mismatch.
            if state.get("tokenizer_identity") not in (None, str(self.tokenizer.identity)):
                raise ForgeError(
                    f"checkpoint {path} was trained with tokenizer {state['tokenizer_identity']!r}, "
                    f"the config gives {self.tokenizer.identity!r}. Use the same tokenizer or a new run.out_dir."
                )

        state = self.checkpoints.load(path, self.pmodel.parts, self.optimizers, lambda m: warn(self.placement, m),
                                      check=same_tokenizer)
        self.step = int(state["step"])
        self.nonfinite_streak = int(state.get("nonfinite_streak", 0))
        self.loader.load_state_dict(state["loader"])
        ts.restore_rng(state["rng"], self.placement.device)
        self.last_saved = self.step
        log(self.placement, f"resumed from {path} at step {self.step}")
        self._resume_schedule(state.get(schedule_span.STATE_KEY))

    def _resume_schedule(self, saved: int | None) -> None:
        cfg = self.config
        self.schedule_steps = schedule_span.span_on_resume(cfg.train, saved)
        self.schedule = components.schedule(self.plan, self.registries, self.schedule_steps)

        def lr_at(span: int, step: int) -> float:
            return cfg.train.lr * components.schedule(self.plan, self.registries, span)(step)

        notice = schedule_span.resume_notice(cfg.train, saved, self.step, lr_at)
        if notice:
            warn(self.placement, notice)

    # -- checkpoints -----------------------------------------------------------------

    def save(self, run: RunContext) -> None:
        if self.last_saved == self.step:
            return
        state = {
            "step": self.step,
            "nonfinite_streak": self.nonfinite_streak,
            "loader": self.loader.state_dict(),
            "rng": ts.capture_rng(self.placement.device),
            "tokenizer_identity": str(self.tokenizer.identity),
            schedule_span.STATE_KEY: self.schedule_steps,
        }
        path = self.checkpoints.save(self.step, self.pmodel.parts, self.optimizers, state,
                                     writing=lambda tmp: self.pm.hook.forge_checkpoint_writing(
                                         run=run, step=self.step, path=str(tmp)))
        self.last_saved = self.step
        self.pm.hook.forge_checkpoint_saved(run=run, step=self.step, path=str(path))

    # -- the loop --------------------------------------------------------------------

    def _count(self, micro: list[dict[str, torch.Tensor]]) -> tuple[float, float, float]:
        """Global (labelled tokens, attended pairs, stop requested)."""
        labelled = sum(int((b[LABELS] != IGNORE_INDEX).sum()) for b in micro)
        pairs = sum(flops.attended_pairs(b.get(DOC_IDS), *b[INPUT_IDS].shape[:2]) for b in micro)
        w = self.slice_weight
        stop = 1.0 if self.stop.received is not None else 0.0
        labelled, pairs, stop = all_reduce_sum([labelled * w, pairs * w, stop], self.placement.device)
        return labelled, pairs, stop

    def train_step(self) -> dict[str, Any]:
        cfg, pl, pmodel = self.config, self.placement, self.pmodel
        train = cfg.train
        t0 = time.perf_counter()
        micro = [next(self.loader) for _ in range(train.grad_accum)]
        labelled, pairs, stop = self._count(micro)
        self.stop_requested = stop > 0
        lr = train.lr * self.schedule(self.step)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        # Data-parallel wrappers sum gradients over ranks, so dividing every loss sum by
        # the global count gives the gradient of the mean over the whole global batch.
        normalizer = max(labelled, 1.0)
        autocast = precision.autocast(train.precision, pl.device)
        loss_total = torch.zeros((), dtype=torch.float32, device=pl.device)
        for i, batch in enumerate(micro):
            batch = _to_device(batch, pl.device)
            last = i == len(micro) - 1
            with _grad_sync(pmodel.forward, last), autocast:
                loss_sum, _ = pmodel.forward_backward(batch, None, normalizer)
            loss_total += loss_sum.detach().float()
        pmodel.finish_gradients()  # what strategies reduce once per step (tp's partial parameters)
        grad_norm = float(clip_grad_norm(pmodel, train.grad_clip))
        # Every process holds its data-parallel slice's loss (pipeline ranks get it back
        # from the last stage): weight so each slice counts once.
        loss = all_reduce_sum([float(loss_total) * self.slice_weight], pl.device)[0] / normalizer
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if finite:
            for optimizer in self.optimizers:
                optimizer.step()
            self.nonfinite_streak = 0
        else:
            self.nonfinite_streak += 1
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        if pl.device.type == "cuda":
            torch.cuda.synchronize(pl.device)
        step_time = time.perf_counter() - t0
        self.step += 1
        step_flops = flops.step_flops(self.n_matmul, self.attn_width, self.step_inputs, int(pairs))
        self._check_peak(step_flops / step_time / pl.world_size)
        return {
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": int(labelled),
            "tokens_per_s": labelled / step_time,
            "mfu": step_flops / step_time / (self.peak * pl.world_size),
            "step_time": step_time,
            "skipped": not finite,
            **self.memory.measure(),
        }

    def eval_due(self) -> bool:
        ev = self.config.eval
        if self.eval_data is None:
            return False
        return bool(ev.every and self.step % ev.every == 0) or (ev.at_end and self.step == self.config.train.steps)

    def evaluate(self, run: RunContext) -> dict[str, Any]:
        """Evaluate now (every process), tell ``forge_eval_end``; the metrics to log."""
        from forge_core.train.evaluate import run_eval

        result = run_eval(self.pmodel, self.eval_data, device=self.placement.device,
                          precision=self.config.train.precision, slice_weight=self.slice_weight)
        metrics = result.metrics()
        self.pm.hook.forge_eval_end(run=run, step=self.step, metrics=dict(metrics))
        return metrics

    def view(self) -> Any:
        from forge_core.data.build import heldout_documents
        from forge_core.train.view import RunView

        return RunView(pmodel=self.pmodel, step=lambda: self.step, device=self.placement.device,
                       tokenizer=self.tokenizer, seq_len=self.data.seq_len, train_rows=self.data.rows,
                       heldout=lambda: heldout_documents(self.plan, self.registries, self.tokenizer,
                                                         is_main=self.placement.is_main))

    def _check_peak(self, achieved: float) -> None:
        """A measured peak below what a step achieves was taken on a busy machine: raise
        it (and its cache) to the achieved rate, so MFU stays a fraction."""
        if not self.peak_measured or achieved <= self.peak:
            return
        from forge_core.train.peak import store_peak

        if not self.peak_raised:
            warn(self.placement, f"this run computes {achieved / 1e9:,.1f} GFLOP/s, above the measured peak of "
                                 f"{self.peak / 1e9:,.1f} (taken while the machine was busy?); raising the "
                                 f"cached peak. Set train.peak_tflops to fix the figure.")
        self.peak_raised = True
        self.peak = achieved
        if self.placement.is_main:
            store_peak(self.placement.device, self.peak_dtype, achieved)

    def check_finite(self, metrics: dict[str, Any]) -> None:
        if not metrics["skipped"]:
            return
        policy = self.config.train.nonfinite
        what = f"step {self.step}: loss {metrics['loss']}, gradient norm {metrics['grad_norm']}"
        advice = ("Lower train.lr, raise train.warmup_steps, set train.grad_clip, or use "
                  "train.precision: fp32.")
        if policy.policy == "stop":
            raise NonFiniteStop(f"{what}: not finite; stopping (train.nonfinite.policy: stop). {advice}")
        if self.nonfinite_streak >= policy.max_consecutive:
            raise NonFiniteStop(
                f"{what}: not finite for {self.nonfinite_streak} steps in a row "
                f"(train.nonfinite.max_consecutive: {policy.max_consecutive}); stopping. {advice}")
        warn(self.placement, f"{what}: not finite; optimizer step skipped "
                             f"({self.nonfinite_streak} of at most {policy.max_consecutive} in a row)")

    def run(self) -> str:
        with self.stop, self.claim_run_dir():  # a signal during start-up raises Interrupted
            return self._run()

    def _run(self) -> str:
        self.build()
        self.prepare_run_dir()
        self.resume()
        self.stop.start_training()
        cfg, pl = self.config, self.placement
        total = cfg.train.steps
        run = RunContext(config=cfg, out_dir=str(self.run_dir), start_step=self.step, total_steps=total,
                         rank=pl.rank, world_size=pl.world_size, view=self.view())
        registered = []
        # pluggy calls the most recently registered first: register in reverse so the
        # loggers see each hook in the order logging.loggers lists them.
        for name, instance in reversed(components.loggers(self.plan, self.registries)):
            register(self.pm, instance, f"logger.{name}")
            registered.append(instance)
        status = "failed"
        self.stop_requested = False
        try:
            self.pm.hook.forge_train_start(run=run)
            if self.step >= total:
                log(pl, f"already trained to step {self.step} (train.steps: {total}); nothing to do")
            with self.stop:
                while self.step < total:
                    metrics = self.train_step()
                    if self.eval_due():
                        metrics.update(self.evaluate(run))
                    self.pm.hook.forge_step_end(run=run, step=self.step, metrics=dict(metrics))
                    if run.should_log(self.step):
                        self.memory.next_window()
                    self.check_finite(metrics)
                    # Alone, act on a signal at once; together, on the flag every
                    # process agreed on in this step's all-reduce.
                    if self.stop_requested or (pl.world_size == 1 and self.stop.received is not None):
                        name = signal.Signals(self.stop.received).name if self.stop.received else "a signal"
                        log(pl, f"{name} received: saving a checkpoint at step {self.step} and stopping")
                        self.save(run)
                        status = "interrupted"
                        break
                    every = cfg.checkpoint.every
                    if every > 0 and self.step % every == 0 and self.step < total:
                        self.save(run)
                else:
                    self.save(run)
                    status = "completed"
        finally:
            try:
                self.pm.hook.forge_train_end(run=run, step=self.step, status=status)
            finally:
                for instance in registered:
                    self.pm.unregister(instance)
                self.loader.close()
        return status

