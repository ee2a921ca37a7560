"""The ``profiler`` logger on CPU: a Chrome trace in the run directory that is valid
JSON and holds exactly the configured steps, announced in the log; ranges cut short or
outside the run; its rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from train_helpers import tiny_config, write_config

from forge_core.testing import train_in_process
from forge_plugins.loggers import profiler as profiler_module


def run(tmp_path: Path, name: str, steps: int, options: dict, overrides=()) -> str:
    cfg = tiny_config(
        tmp_path,
        name,
        train={"steps": steps},
        logging={"loggers": ["profiler"], "options": {"profiler": options}},
    )
    return train_in_process(write_config(tmp_path / f"{name}.yaml", cfg), list(overrides))


def profiled_steps(trace: Path) -> list[int]:
    events = json.loads(trace.read_text())["traceEvents"]
    names = {
        e["name"] for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
    }
    return sorted(int(n.split("#")[1]) for n in names)


def test_trace_covers_exactly_the_configured_steps(tmp_path, capsys):
    assert (
        run(
            tmp_path,
            "prof",
            7,
            {"start_step": 3, "steps": 2, "warmup": 1, "record_shapes": True, "memory": True},
        )
        == "completed"
    )
    traces = list((tmp_path / "prof/profiler").iterdir())
    assert [t.name for t in traces] == ["trace-rank0-steps3-4.json"]
    assert profiled_steps(traces[0]) == [3, 4]  # not the warmup step 2, not step 5
    events = json.loads(traces[0].read_text())["traceEvents"]
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert {"aten::mm", "aten::embedding"} <= ops or {"aten::addmm", "aten::embedding"} <= ops
    assert any(e.get("name") == "[memory]" for e in events)  # memory: true records allocations
    assert any("Input Dims" in e.get("args", {}) for e in events)  # record_shapes
    err = capsys.readouterr().err
    assert "profiler: recording steps 3-4 after 1 warmup step on rank 0" in err
    assert re.search(r"profiler: trace of steps 3-4 written to .*trace-rank0-steps3-4\.json", err)


def test_range_from_the_first_step_without_warmup(tmp_path):
    run(tmp_path, "first", 3, {"start_step": 1, "steps": 1, "warmup": 0})
    assert profiled_steps(tmp_path / "first/profiler/trace-rank0-steps1-1.json") == [1]


def test_range_cut_short_by_the_end_of_the_run_writes_what_was_recorded(tmp_path, capsys):
    run(tmp_path, "short", 4, {"start_step": 3, "steps": 5})
    assert profiled_steps(tmp_path / "short/profiler/trace-rank0-steps3-4.json") == [3, 4]


def test_resume_past_the_range_profiles_nothing_and_says_so(tmp_path, capsys):
    run(tmp_path, "resumed", 4, {"start_step": 2, "steps": 2})
    capsys.readouterr()
    run(tmp_path, "resumed", 6, {"start_step": 2, "steps": 2}, overrides=["train.steps=6"])
    err = capsys.readouterr().err
    assert "steps 2-3 are not in this run (the run starts at step 5); nothing is profiled" in err
    assert [p.name for p in (tmp_path / "resumed/profiler").iterdir()] == ["trace-rank0-steps2-3.json"]


def test_a_process_not_listed_does_not_profile(tmp_path):
    run(tmp_path, "other", 3, {"start_step": 1, "steps": 1, "ranks": [1]})
    assert not (tmp_path / "other/profiler").exists()


def test_cuda_memory_snapshot_is_dumped_and_recording_stopped(tmp_path, monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(
        torch.cuda.memory,
        "_record_memory_history",
        lambda enabled="all", max_entries=0: calls.append(("record", enabled, max_entries)),
    )
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: Path(path).write_bytes(b"x"))
    history = profiler_module.CudaMemoryHistory()
    history.start()
    history.stop(tmp_path / "snap.pickle")
    assert (tmp_path / "snap.pickle").read_bytes() == b"x"
    assert calls == [("record", "all", profiler_module.MEMORY_HISTORY_ENTRIES), ("record", None, 0)]


def test_check_warns_about_a_range_after_the_last_step(tmp_path, capsys):
    from forge_core import cli

    cfg = tiny_config(
        tmp_path,
        "late",
        train={"steps": 4},
        logging={"loggers": ["profiler"], "options": {"profiler": {"start_step": 9, "ranks": [0, 2]}}},
    )
    assert cli.main(["check", write_config(tmp_path / "late.yaml", cfg), "--world-size", "2"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "[loggers.profiler-range]" in text
    assert "starts at step 9" in text and "after the last step (4, train.steps)" in text
    assert "ranks lists [2], but the run has 2 processes" in text


@pytest.mark.parametrize("bad", [{"steps": 0}, {"ranks": [-1]}, {"log_dir": "../x"}])
def test_bad_options_are_refused(tmp_path, bad, capsys):
    from forge_core import cli

    cfg = tiny_config(tmp_path, "bad", logging={"loggers": ["profiler"], "options": {"profiler": bad}})
    assert cli.main(["check", write_config(tmp_path / "bad.yaml", cfg)]) == 2
    assert f"logging.options.profiler.{next(iter(bad))}" in capsys.readouterr().err
