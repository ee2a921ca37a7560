"""Start-up imports only what the command needs (:mod:`bench/startup.py` measures the
time): ``check`` no torch; the eager attention backends no ``torch._dynamo``
(``torch.compiler.disable`` is applied to the BlockMask builders when they are first
looked up); a training run neither ``torch.distributed.checkpoint`` nor matplotlib
before its first step ends, and both once it saves its checkpoint and draws its curve.

(A stock torch optimizer imports ``torch._dynamo`` itself when it is built, so a
training run cannot avoid it.) One fresh interpreter for every check: ``sys.modules``
of this one holds whatever the suite imported before."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from train_helpers import tiny_config, write_config

WATCHED = ("torch", "torch._dynamo", "torch.distributed.checkpoint", "matplotlib")

SCRIPT = f"""
import json, sys

from forge_core import cli
from forge_core.api import hookimpl

WATCHED = {WATCHED!r}
seen = {{}}


def loaded():
    return [m for m in WATCHED if m in sys.modules]


class FirstStep:
    @hookimpl
    def forge_step_end(self, run, step, metrics):
        seen.setdefault("first step", loaded())


config = sys.argv[1]
assert cli.main(["check", config]) == 0
seen["check"] = loaded()
from forge_plugins.attention import eager, masks, sdpa  # noqa: E402, F401

seen["eager attention"] = loaded()
from forge_core.cli.train import train  # noqa: E402

assert train(config, extra_plugins=(("first_step", FirstStep()),)) == "completed"
seen["end"] = loaded()
print(json.dumps(seen))
"""


def test_each_heavy_module_is_imported_only_once_it_is_needed(tmp_path):
    cfg = tiny_config(tmp_path, train={"steps": 1}, logging={"loggers": ["plot"]})
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, write_config(tmp_path / "c.yaml", cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["check"] == []
    assert seen["eager attention"] == ["torch"]
    assert "torch.distributed.checkpoint" not in seen["first step"]
    assert "matplotlib" not in seen["first step"]
    assert seen["end"] == list(WATCHED)  # the checkpoint saved and the curve drawn at the end
    assert (tmp_path / "run" / "loss.png").is_file()
