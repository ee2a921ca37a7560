"""Launch ``torchrun`` with CPU processes (gloo) from pytest and read back what rank 0
wrote. Shared by the tests in this folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def torchrun(
    nproc: int, script: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc-per-node N script args``.
    One thread per process: the test machine has few cores."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(script),
        *args,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=REPO, timeout=timeout)


def run_scenarios(
    nproc: int, names: list[str], out_dir: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> dict[str, Any]:
    """Run :mod:`scenarios` once for every name; fail with the ranks' output tail."""
    out = out_dir / f"results-{nproc}.json"
    proc = torchrun(nproc, HERE / "scenarios.py", [str(out), *names], env=env, timeout=timeout)
    if proc.returncode != 0 or not out.is_file():
        pytest.fail(
            f"torchrun exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return json.loads(out.read_text())
