"""``bench/gpu_validation.py --reduced``: the GPU command's every section runs on the CPU at
tiny shapes and writes its report (so the command cannot rot before a GPU runs it), and
its equivalence section catches a backend that attends across documents."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_bench

bench = load_bench("gpu_validation.py")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_reduced_run_writes_every_section_and_passes(tmp_path):
    from forge_plugins.attention import flex_kernel

    kernel = flex_kernel.compiled
    out = tmp_path / "report.json"
    assert bench.main(["--reduced", "--out", str(out)]) == 0
    assert flex_kernel.compiled is kernel  # the unfused kernel was the run's only
    report = json.loads(out.read_text())
    assert report["reduced"] and report["dtype"] == "fp32" and report["flex_kernel"].startswith("unfused")
    assert [row["seq_len"] for row in report["attention"]] == [64, 128]
    for row in report["attention"]:
        assert row["flex"]["tokens_s"] > 0 and row["sdpa"]["tokens_s"] > 0 and row["flex_speedup_cpu"] > 0
    llama = report["llama_1b"]
    assert (
        llama["batch"] == [2, 32] and 0 < llama["mfu"] and llama["peak_source"].startswith("measured by CPU")
    )
    assert llama["tokens_s"] == pytest.approx(64 / llama["step_s"])
    checks = report["equivalence"]
    # Two backends: 4 attention tensors and the logits, per document of each row.
    assert len(checks) > 10 and all(c["passed"] for c in checks) and report["equivalence_passed"]
    assert {c["what"].split(",")[0] for c in checks} == {
        "attention flex",
        "attention sdpa",
        "llama flex",
        "llama sdpa",
    }
    assert set(report["seconds"]) == {"equivalence", "attention", "llama_1b", "total"}


def test_a_backend_that_attends_across_documents_fails_the_equivalence(monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    from forge_plugins.attention import flex_kernel
    from forge_plugins.attention.flex import FlexAttention

    monkeypatch.setattr(flex_kernel, "compiled", flex_attention)
    prepare = FlexAttention.prepare
    monkeypatch.setattr(
        FlexAttention, "prepare", lambda self, doc_ids, n, device: prepare(self, None, n, device)
    )
    checks = bench.section_equivalence(bench.REDUCED, torch.device("cpu"))
    failed = {c["what"].split(",")[0] for c in checks if not c["passed"]}
    assert failed == {"attention flex", "llama flex"}
    message = next(c["message"] for c in checks if not c["passed"])
    assert "exceeds the rounding tolerance of float32" in message
    # The first document sees nothing before it: it passes even with the leak.
    assert next(c for c in checks if c["what"].startswith("attention flex, document 0"))["passed"]
