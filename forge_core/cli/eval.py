"""``forge-run eval RUN_DIR [--checkpoint STEP] [key=value ...] [--json]``: the held-out
loss and perplexity of a saved run.

Works from the run directory alone, like ``sample``: its ``config.yaml`` (with the
overrides applied: ``eval.source=...``, ``eval.max_batches=...``) rebuilds the model, the
tokenizer (from what the run saved) and the evaluation data; the checkpoint (the latest,
or ``--checkpoint STEP``) gives the weights, verified and read without running code
from it. The evaluation is the one training runs (:mod:`forge_core.train.evaluate`),
in this one process whatever layout trained the run (a checkpoint loads into the unsplit
model), so its numbers are the ones the run logged for that step, up to the rounding of
sums in another order. The evaluation settings are judged by the same rules as
``forge-run check``. Lifecycle plugins receive ``forge_eval_end``; loggers are not
started and nothing is written to the run directory.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import ForgeError
from forge_core.api.unstable import format_perplexity


def load_plan(run_dir: Path, overrides: list[str]) -> tuple[Any, Any]:
    """``(plan, registries)`` of the run's saved config with ``overrides``, laid out for
    one process (no parallelism, no compile) with evaluation on; eval rules judged."""
    from forge_core.cli.report import render
    from forge_core.config.loader import plugin_settings, structure_config
    from forge_core.config.overrides import migrate_moved_keys, with_overrides
    from forge_core.config.schema import ParallelSection, PluginsSection
    from forge_core.config.yaml_reader import read_config_file
    from forge_core.judge import judge_config
    from forge_core.registry import load_registries
    from forge_core.train.rundir import CONFIG

    path = run_dir / CONFIG
    if not run_dir.is_dir():
        raise ForgeError(f"no run directory {run_dir}: give the out_dir of a Forge run (run.out_dir).")
    if not path.is_file():
        raise ForgeError(f"{run_dir} has no {CONFIG}: is it the out_dir of a Forge run?")
    # The saved config is Forge's own: a key that moved since is read at its new place;
    # an override that names a moved key is refused like anywhere else.
    raw, issues = with_overrides(migrate_moved_keys(read_config_file(path)), overrides)
    plugins = plugin_settings(raw) or PluginsSection()
    registries = load_registries(block=tuple(plugins.block), prefer=plugins.prefer)
    config = structure_config(raw, lambda _: registries, issues)
    config = attrs.evolve(
        config,
        parallel=ParallelSection(),
        eval=attrs.evolve(config.eval, enabled=True),
        train=attrs.evolve(config.train, compile=False),
    )
    judged = judge_config(config, registries, world_size=1)
    errors = [v for v in judged.errors if v.rule_id.startswith("eval.") or v.rule_id.startswith("component.")]
    if errors:
        raise ForgeError(f"cannot evaluate {run_dir}:\n{render(errors)}")
    return judged.plan, registries


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The latest complete checkpoint of ``run_dir``, or the one of ``step``."""
    from forge_core.train.checkpoint import (
        complete_checkpoints,
        problem_with,
        resolve_checkpoint,
        step_name,
        step_of,
    )

    if step is None:
        return resolve_checkpoint(run_dir)[0]
    root = run_dir / "checkpoints"
    path = root / step_name(step)
    if not path.is_dir():
        have = [step_of(p) for p in complete_checkpoints(root)] if root.is_dir() else []
        listed = ", ".join(map(str, sorted(have))) if have else "none"
        raise ForgeError(
            f"{run_dir} has no checkpoint of step {step} (complete checkpoints: {listed}); "
            "give one of those to --checkpoint, or leave it out for the latest."
        )
    why = problem_with(path)
    if why:
        raise ForgeError(f"checkpoint {path} cannot be used: {why}")
    return resolve_checkpoint(path)[0]


class _Progress:
    """A line on stderr every few seconds while batches are evaluated."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every_s or done == total:
            self.last = now
            print(f"forge: eval batch {done}/{total}", file=sys.stderr, flush=True)


def main(args: Any) -> int:
    from forge_core import components
    from forge_core.api import RunContext
    from forge_core.data.build import heldout_documents
    from forge_core.distributed.parallelize import single_process
    from forge_core.distributed.placement import choose_device
    from forge_core.train import precision
    from forge_core.train.checkpoint import step_of
    from forge_core.train.evaluate import build_eval_data, run_eval
    from forge_core.train.loss import build_loss
    from forge_core.train.restore import restored_model
    from forge_core.train.rundir import TOKENIZER, read_run_info
    from forge_core.train.view import RunView

    if args.checkpoint is not None and args.checkpoint < 0:
        raise ForgeError(f"--checkpoint {args.checkpoint}: a step is 0 or more")
    run_dir = Path(args.run_dir)
    plan, registries = load_plan(run_dir, list(args.overrides))
    plan = components.without_pretrained(plan)  # the checkpoint holds every weight
    checkpoint = find_checkpoint(run_dir, args.checkpoint)
    config = plan.config
    tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    info = read_run_info(run_dir)
    if info.get("tokenizer_identity") not in (None, str(tokenizer.identity)):
        raise ForgeError(
            f"{run_dir} was trained with tokenizer {info['tokenizer_identity']!r}, the overrides give "
            f"{tokenizer.identity!r}: evaluate with the run's own tokenizer."
        )
    data = build_eval_data(plan, registries, tokenizer)
    print(f"forge: {data.summary}", file=sys.stderr, flush=True)
    vocab_size = int(info.get("vocab_size", tokenizer.vocab_size))
    model = restored_model(plan, registries, vocab_size, checkpoint)
    device = choose_device(config.run.device)
    precision.check_precision(config.train.precision, device)
    pmodel = single_process(model.to(device), loss_fn=build_loss(model, config))
    result = run_eval(pmodel, data, device=device, precision=config.train.precision, progress=_Progress())
    step = step_of(checkpoint)
    view = RunView(
        pmodel=pmodel,
        step=lambda: step,
        device=device,
        tokenizer=tokenizer,
        seq_len=config.data.seq_len,
        heldout=lambda: heldout_documents(plan, registries, tokenizer),
    )
    run = RunContext(
        config=config, out_dir=str(run_dir), start_step=step, total_steps=config.train.steps, view=view
    )
    registries.plugins.pm.hook.forge_eval_end(run=run, step=step, metrics=result.metrics())
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(run_dir),
                    "checkpoint": str(checkpoint),
                    "step": step,
                    "data": data.what,
                    **result.to_json(),
                },
                indent=2,
            )
        )
        return 0
    print(
        f"{run_dir} step {step}: eval loss {result.loss:.4f}, "
        f"perplexity {format_perplexity(result.perplexity)} over "
        f"{result.tokens:,} target tokens ({result.rows:,} rows of {data.what}, {result.seconds:.1f}s)"
    )
    if len(result.by_source) > 1:
        metrics = result.metrics()
        for label, (loss, tokens) in result.by_source.items():
            ppl = format_perplexity(metrics[f"eval/{label}/perplexity"])
            print(f"  {label}: loss {loss:.4f}, perplexity {ppl} over {tokens:,} target tokens")
    return 0
