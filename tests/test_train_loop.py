"""The training loop, in process: exact resume, gradient accumulation, the non-finite
policy, lifecycle hooks, the built-in loggers, precision."""

from __future__ import annotations

import math
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import (
    NanPlugin,
    Recorder,
    SignalAt,
    read_metrics,
    tiny_config,
    write_config,
    write_corpus,
)

from forge_core.api import IGNORE_INDEX, LABELS
from forge_core.cli.train import InvalidConfig
from forge_core.testing import train_in_process
from forge_core.train.checkpoint import find_latest, load_model, model_state
from forge_core.train.precision import cpu_has_bf16
from forge_core.train.trainer import NonFiniteStop

METRIC_KEYS = {"loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "mfu_capped", "step_time"}


def run(tmp_path: Path, config: dict, *plugins, overrides=()) -> str:
    path = write_config(tmp_path / f"{config['run']['name']}.yaml", config)
    extra = tuple((f"test-{i}", p) for i, p in enumerate(plugins))
    return train_in_process(path, list(overrides), extra_plugins=extra)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from forge_core import components
    from forge_core.train.rundir import load_run_config

    plan, registries = load_run_config(run_dir)
    model = components.model(plan, registries, 258, components.attention(plan, registries))
    load_model(find_latest(run_dir / "checkpoints"), [model])
    return {k: v.clone() for k, v in model_state([model]).items()}


def test_exact_resume_after_sigterm_matches_a_straight_run(tmp_path):
    """2N straight vs N, stopped by SIGTERM, resumed to 2N: every loss after the resume
    and the final weights are bit-identical (CPU fp32), so the loader position, the
    RNG and optimizer states all came back. Shuffling and accumulation are on."""
    train_cfg = {"steps": 8, "grad_accum": 2}
    straight = Recorder()
    assert run(tmp_path, tiny_config(tmp_path, "straight", train=train_cfg), straight) == "completed"

    first = Recorder()
    cfg = tiny_config(tmp_path, "resumed", train=train_cfg)
    assert run(tmp_path, cfg, first, SignalAt(4)) == "interrupted"
    assert first.end == (4, "interrupted") and sorted(first.metrics) == [1, 2, 3, 4]
    assert (tmp_path / "resumed/checkpoints/latest").read_text().strip() == "step-000004"

    second = Recorder()
    assert run(tmp_path, cfg, second) == "completed"
    assert second.start.start_step == 4
    assert sorted(second.metrics) == [5, 6, 7, 8]
    for step in range(1, 9):
        got = (first.metrics if step <= 4 else second.metrics)[step]
        assert got["loss"] == straight.metrics[step]["loss"], step
        assert got["grad_norm"] == straight.metrics[step]["grad_norm"], step
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_also_saves_and_stops(tmp_path):
    rec = Recorder()
    cfg = tiny_config(tmp_path, "sigint", train={"steps": 20})
    assert run(tmp_path, cfg, rec, SignalAt(3, signal.SIGINT)) == "interrupted"
    assert rec.saved == [3] and rec.end == (3, "interrupted")
    # The handlers are restored after the run.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_hook_plugin_sees_every_step_and_checkpoint(tmp_path):
    rec = Recorder()
    cfg = tiny_config(tmp_path, "hooks", train={"steps": 5}, checkpoint={"every": 2, "keep": 5})
    assert run(tmp_path, cfg, rec) == "completed"
    assert rec.events[0] == ("start", 0) and rec.events[-1] == ("end", "completed")
    assert sorted(rec.metrics) == [1, 2, 3, 4, 5]
    assert rec.saved == [2, 4, 5]
    for step, metrics in rec.metrics.items():
        assert METRIC_KEYS <= metrics.keys(), step
        assert math.isfinite(metrics["loss"]) and metrics["tokens"] > 0 and 0 < metrics["mfu"] < 1
    # lr follows the schedule: warmup (1 step) then cosine decay.
    assert rec.metrics[1]["lr"] == pytest.approx(1.5e-3)
    assert rec.metrics[2]["lr"] == pytest.approx(3e-3)
    assert rec.metrics[5]["lr"] < rec.metrics[3]["lr"]
    names = sorted(p.name for p in (tmp_path / "hooks/checkpoints").iterdir() if p.name.startswith("step-"))
    assert names == ["step-000002", "step-000004", "step-000005"]


def test_tokens_metric_counts_only_labelled_tokens(tmp_path):
    """With short documents the concat packer sets -100 at every EOS: the token count
    of a step is its rows * seq_len minus those, exactly."""
    from forge_core.data.build import build_training_data
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved
    from forge_plugins.tokenizers.byte import ByteTokenizer

    write_corpus(tmp_path / "corpus", docs=60, short=True)
    rec = Recorder()
    cfg = tiny_config(tmp_path, "tokens", train={"steps": 2, "batch_size": 4}, data={"shuffle": False})
    run(tmp_path, cfg, rec)  # unshuffled: step s reads rows 4(s-1) to 4s-1
    config, registries = load_resolved(str(tmp_path / "tokens.yaml"))
    data = build_training_data(
        make_plan(config, registries, 1), registries, ByteTokenizer(), report=lambda m: None
    )
    labels = np.asarray(data.rows.read(np.arange(8))[LABELS]).reshape(2, 4 * 32)
    ignored = (labels == IGNORE_INDEX).sum(axis=1)
    assert ignored.min() > 0  # the rows hold EOS positions: the count has something to leave out
    assert [rec.metrics[step]["tokens"] for step in (1, 2)] == [4 * 32 - int(n) for n in ignored]


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    """Loss sums divided by the step's global token count: accumulating 4 x 1 rows gives
    the same losses and weights as 1 x 4 rows although the rows hold different numbers
    of labelled tokens (many short documents)."""
    write_corpus(tmp_path / "corpus", docs=80, short=True)
    recs = {}
    for accum in (1, 4):
        recs[accum] = Recorder()
        cfg = tiny_config(tmp_path, f"accum{accum}", train={"steps": 3, "batch_size": 4, "grad_accum": accum})
        run(tmp_path, cfg, recs[accum])
    for step in (1, 2, 3):
        assert recs[4].metrics[step]["tokens"] == recs[1].metrics[step]["tokens"]
        assert recs[4].metrics[step]["loss"] == pytest.approx(recs[1].metrics[step]["loss"], rel=1e-5)
    a, b = final_weights(tmp_path / "accum1"), final_weights(tmp_path / "accum4")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)

    # The test has power: rows hold different numbers of labelled tokens, so a mean of
    # per-micro-batch means would differ from the global mean.
    from forge_core import components
    from forge_core.data.build import build_training_data
    from forge_core.train.rundir import load_run_config

    plan, registries = load_run_config(tmp_path / "accum1")
    tok = components.tokenizer(plan, registries)
    labels = build_training_data(plan, registries, tok).rows.read(np.arange(40))[LABELS]
    assert len({int((row != IGNORE_INDEX).sum()) for row in labels}) > 1


def test_nonfinite_skip_continues(tmp_path):
    rec = Recorder()
    cfg = tiny_config(
        tmp_path,
        "skip",
        model={"name": "nanny", "options": {"nan_steps": [3]}},
        train={"steps": 5, "nonfinite": {"policy": "skip", "max_consecutive": 2}},
    )
    assert run(tmp_path, cfg, NanPlugin(), rec) == "completed"
    assert rec.metrics[3]["skipped"] is True and math.isnan(rec.metrics[3]["loss"])
    assert all(rec.metrics[s]["skipped"] is False for s in (1, 2, 4, 5))
    assert all(math.isfinite(rec.metrics[s]["loss"]) for s in (1, 2, 4, 5))


def test_nonfinite_skip_stops_after_max_consecutive(tmp_path):
    rec = Recorder()
    cfg = tiny_config(
        tmp_path,
        "skipstop",
        model={"name": "nanny", "options": {"nan_steps": [2, 3, 4, 5]}},
        train={"steps": 8, "nonfinite": {"policy": "skip", "max_consecutive": 2}},
    )
    with pytest.raises(NonFiniteStop, match=r"step 3: .*2 steps in a row .*max_consecutive: 2"):
        run(tmp_path, cfg, NanPlugin(), rec)
    assert rec.end == (3, "failed")


def test_nonfinite_stop_policy_stops_at_once(tmp_path):
    rec = Recorder()
    cfg = tiny_config(
        tmp_path,
        "stop",
        model={"name": "nanny", "options": {"nan_steps": [2]}},
        train={"steps": 8, "nonfinite": {"policy": "stop"}},
    )
    with pytest.raises(NonFiniteStop, match=r"step 2: loss nan.*policy: stop"):
        run(tmp_path, cfg, NanPlugin(), rec)
    assert rec.end == (2, "failed")
    assert not (tmp_path / "stop/checkpoints/latest").exists()


def test_nonfinite_skip_keeps_weights(tmp_path):
    """The skipped step does not change the weights: a run skipping step 3 of 3 ends
    with the weights of step 2."""
    constant = {"schedule": "constant", "warmup_steps": 0}
    cfg2 = tiny_config(
        tmp_path, "two", model={"name": "nanny", "options": {}}, train={"steps": 2, **constant}
    )
    cfg3 = tiny_config(
        tmp_path,
        "three",
        model={"name": "nanny", "options": {"nan_steps": [3]}},
        train={"steps": 3, **constant},
    )
    run(tmp_path, cfg2, NanPlugin())
    run(tmp_path, cfg3, NanPlugin())
    a, b = flat_model_state(tmp_path / "two"), flat_model_state(tmp_path / "three")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def flat_model_state(run_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run_dir / "flat.pt"
    dcp_to_torch_save(find_latest(run_dir / "checkpoints"), out)
    return torch.load(out, weights_only=True)["model"]


def test_loggers_write_metrics_and_plot(tmp_path, capsys):
    cfg = tiny_config(
        tmp_path,
        "loggers",
        train={"steps": 4},
        logging={"loggers": ["console", "jsonl", "plot", "tensorboard"], "every": 2},
    )
    run(tmp_path, cfg)
    records = read_metrics(tmp_path / "loggers")
    assert [r["step"] for r in records] == [2, 4]
    assert METRIC_KEYS <= records[0].keys()
    png = (tmp_path / "loggers/loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert "completed at step 4/4" in err
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert "tensorboard logger needs the tensorboard package" in err


def test_jsonl_drops_lost_steps_on_resume(tmp_path):
    """Steps logged after the checkpoint a run resumes from are dropped from the file."""
    cfg = tiny_config(
        tmp_path, "jsonl", train={"steps": 6}, checkpoint={"every": 2}, logging={"loggers": ["jsonl"]}
    )
    run(tmp_path, cfg)
    # Pretend the run died after step 5 with its last checkpoint at step 4.
    import shutil

    ckpts = tmp_path / "jsonl/checkpoints"
    shutil.rmtree(ckpts / "step-000006")
    (ckpts / "latest").write_text("step-000004\n")
    run(tmp_path, cfg)
    assert [r["step"] for r in read_metrics(tmp_path / "jsonl")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.skipif(
    not cpu_has_bf16(), reason="this CPU has no native bf16 (train.precision: bf16 is refused)"
)
def test_bf16_autocast_trains(tmp_path):
    rec32, rec16 = Recorder(), Recorder()
    run(tmp_path, tiny_config(tmp_path, "fp32", train={"steps": 3}), rec32)
    run(tmp_path, tiny_config(tmp_path, "bf16", train={"steps": 3, "precision": "bf16"}), rec16)
    for step in (1, 2, 3):
        assert rec16.metrics[step]["loss"] != rec32.metrics[step]["loss"]  # bf16 really used
        assert rec16.metrics[step]["loss"] == pytest.approx(rec32.metrics[step]["loss"], abs=0.05)


def test_invalid_config_is_refused_before_anything_is_built(tmp_path):
    cfg = tiny_config(tmp_path, "invalid", data={"seq_len": 128})
    with pytest.raises(InvalidConfig, match=r"error: \[model.seq-len\]") as info:
        run(tmp_path, cfg)
    assert "refusing to train" in str(info.value)
    assert not (tmp_path / "invalid").exists()


def test_a_finished_run_restarted_does_nothing(tmp_path, capsys):
    rec = Recorder()
    cfg = tiny_config(tmp_path, "done", train={"steps": 2})
    run(tmp_path, cfg)
    assert run(tmp_path, cfg, rec) == "completed"
    assert rec.metrics == {} and rec.start.start_step == 2
    assert "already trained to step 2" in capsys.readouterr().out


def test_resume_never_starts_over(tmp_path):
    cfg = tiny_config(tmp_path, "never", train={"steps": 2})
    run(tmp_path, cfg)
    rec = Recorder()
    cfg["checkpoint"]["resume"] = "never"
    run(tmp_path, cfg, rec)
    assert sorted(rec.metrics) == [1, 2]


def test_truncated_checkpoint_is_skipped_with_a_warning(tmp_path, capsys):
    cfg = tiny_config(tmp_path, "trunc", train={"steps": 4}, checkpoint={"every": 2, "keep": 3})
    run(tmp_path, cfg)
    data = next((tmp_path / "trunc/checkpoints/step-000004").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])
    capsys.readouterr()
    rec = Recorder()
    run(tmp_path, cfg, rec, overrides=["train.steps=5"])
    captured = capsys.readouterr()
    assert "warning: skipping checkpoint" in captured.err and "step-000004" in captured.err
    assert "truncated" in captured.err
    assert f"resumed from {tmp_path / 'trunc/checkpoints/step-000002'} at step 2" in captured.out
    assert sorted(rec.metrics) == [3, 4, 5]


def test_a_peak_below_what_the_run_computes_caps_mfu_and_is_said_once(tmp_path, capsys):
    """MFU never reads above 1: against a peak of 1 FLOP/s every step is capped, flagged
    in the metrics and on the console, and the log says once that the peak is too low,
    naming its source and the fix."""
    rec = Recorder()
    run(tmp_path, tiny_config(tmp_path, "lowpeak", train={"steps": 3, "peak_tflops": 1e-12}), rec)
    assert all(m["mfu"] == 1.0 and m["mfu_capped"] for m in rec.metrics.values())
    captured = capsys.readouterr()
    assert "peak 1e-12 TFLOP/s (train.peak_tflops)" in captured.out
    assert captured.err.count("the peak is underestimated") == 1
    assert "above the peak of 1e-12 TFLOP/s (train.peak_tflops)" in captured.err
    assert "Set train.peak_tflops" in captured.err


def test_a_measured_cpu_peak_is_named_in_the_log_and_not_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path / "cache"))
    rec = Recorder()
    run(tmp_path, tiny_config(tmp_path, "measured", train={"steps": 2, "peak_tflops": 0.0}), rec)
    assert all(0 < m["mfu"] <= 1 and not m["mfu_capped"] for m in rec.metrics.values())
    out = capsys.readouterr().out
    threads = torch.get_num_threads()
    source = f"measured by CPU time: best of 5 1024x1024 float32 matmuls, {threads} thread"
    assert "TFLOP/s (" + source in out
    assert not (tmp_path / "cache" / "peak_flops.json").exists()


def test_a_configured_peak_above_the_rate_gives_a_fraction_and_no_notice(tmp_path, capsys):
    rec = Recorder()
    run(tmp_path, tiny_config(tmp_path, "cfgpeak", train={"steps": 2, "peak_tflops": 1e6}), rec)
    assert all(0 < m["mfu"] < 1e-3 and not m["mfu_capped"] for m in rec.metrics.values())
    assert "above the peak" not in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_model_trains_like_eager(tmp_path):
    eager, compiled = Recorder(), Recorder()
    model = {
        "name": "llama",
        "options": {"dim": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
    }
    run(tmp_path, tiny_config(tmp_path, "eager", model=model, train={"steps": 2}), eager)
    run(
        tmp_path,
        tiny_config(tmp_path, "compiled", model=model, train={"steps": 2, "compile": True}),
        compiled,
    )
    for step in (1, 2):
        assert compiled.metrics[step]["loss"] == pytest.approx(eager.metrics[step]["loss"], rel=1e-4)
    # The checkpoint keeps the plain parameter names (compiled blocks, not a wrapper).
    assert all("_orig_mod" not in k for k in final_weights(tmp_path / "compiled"))
