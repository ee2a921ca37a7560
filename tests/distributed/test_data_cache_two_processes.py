"""Two processes (torchrun, gloo) start on a source that is not yet tokenized: exactly
one tokenizes it, the other reports that it waits for it, and both end up with the same
rows, bit for bit."""

from __future__ import annotations

import json

import pytest
from harness import HERE, torchrun
from train_helpers import tiny_config, write_config

pytestmark = pytest.mark.distributed


def test_one_process_tokenizes_and_both_read_the_same_rows(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg["data"]["cache"] = {"dir": str(tmp_path / "cache"), "wait_s": 120}
    config = write_config(tmp_path / "c.yaml", cfg)
    counter, out = tmp_path / "tokenized.txt", tmp_path / "seen.json"
    proc = torchrun(2, HERE / "data_cache_worker.py", [config, str(counter), str(out)])
    assert proc.returncode == 0 and out.is_file(), f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert len(counter.read_text().splitlines()) == 1  # one tokenization, by one process
    seen = json.loads(out.read_text())
    assert seen[0]["rows"] == seen[1]["rows"] > 0 and seen[0]["digest"] == seen[1]["digest"]
    notes = [" | ".join(s["notes"]) for s in seen]
    tokenized = [n for n in notes if "tokenizing text into the cache" in n]
    waited = [n for n in notes if "waiting for pid" in n]
    assert len(tokenized) == 1 and len(waited) == 1 and tokenized[0] != waited[0], notes
