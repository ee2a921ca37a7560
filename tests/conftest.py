"""Shared helpers: a fake third-party distribution on a temporary path, the environment
that shows Forge that distribution and the built-ins only (:func:`only_plugins`), a
config writer, ``forge-run`` in a subprocess, and a private cache for the session. The fixtures a
plugin author gets (``forge_config``, ``forge_registries``, ``forge_run``, ...) come from
Forge's pytest plugin, :mod:`forge_core.testing.pytest_plugin`."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def load_bench(file: str, name: str | None = None) -> Any:
    """The script ``bench/<file>`` as a module (``bench/`` is not a package), under
    ``name`` (default ``bench_<stem>``)."""
    spec = importlib.util.spec_from_file_location(name or f"bench_{Path(file).stem}", REPO / "bench" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Within: ``n`` intra-op torch threads; the count before, after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """One intra-op thread, as the benches run (``--threads 1``): on a loaded machine two
    threads wait on each other."""
    with torch_threads(1):
        yield


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_distribution(
    site: Path, dist: str, version: str, modules: dict[str, str], entry_points: dict[str, str]
) -> Path:
    """A minimal installed distribution: modules plus a dist-info with ``forge`` entry points,
    found by importlib.metadata when ``site`` is on sys.path."""
    site.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[forge]\n{lines}\n")
    return site


def only_plugins(*names: str) -> dict[str, str]:
    """Environment variables under which Forge loads the built-in plugins and the
    third-party plugins ``names`` (entry-point names: those the test installs) and no
    other, whatever else this environment has installed (the example package, which the
    plugin guide tells a reader to install, registers a ``window`` backend and a
    ``greedy`` packer of its own)."""
    return {"FORGE_DISABLE_PLUGIN_AUTOLOAD": "1", "FORGE_PLUGINS": ",".join(names)}


@pytest.fixture
def builtins_only(monkeypatch):
    """For a test that registers its plugins in process (``extra``): Forge loads the
    built-ins and those, nothing else installed in the environment."""
    for name, value in only_plugins().items():
        monkeypatch.setenv(name, value)


def run_cli(
    *args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``forge-run`` in a subprocess with the current interpreter: for the one smoke
    test per command (test_cli_smoke.py) and what needs a process of its own (torchrun,
    a lock held by another process). Everything else runs in process through
    ``forge_core.testing.forge_run``."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "forge_core.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        timeout=timeout,
    )


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Forge's caches (tokenized sources, the measured peak) in a directory of this test
    session, inherited by the processes tests start: no test reads what an earlier
    session, or the user, left in ~/.cache/forge."""
    previous = os.environ.get("FORGE_CACHE_DIR")
    os.environ["FORGE_CACHE_DIR"] = str(tmp_path_factory.mktemp("forge-cache"))
    yield Path(os.environ["FORGE_CACHE_DIR"])
    if previous is None:
        os.environ.pop("FORGE_CACHE_DIR", None)
    else:
        os.environ["FORGE_CACHE_DIR"] = previous


@pytest.fixture
def counted(monkeypatch):
    """How many times a source was tokenized into the cache."""
    from forge_core.data import prepare as prepare_module

    calls = []
    original = prepare_module.write_shards

    def counting(*args, **kwargs):
        calls.append(args[2])
        return original(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "write_shards", counting)
    return calls
