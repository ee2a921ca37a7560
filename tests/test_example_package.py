"""The example third-party package (examples/forge-plugin-example) installed for real.

``pip install --no-deps --no-build-isolation --no-index --target <tmp>`` builds a wheel
from a copy of the package's source (so no build/ or egg-info lands in the working
tree) and installs it into a temporary directory; the commands below run in process
with that directory on the import path, so Forge finds the package only through its installed
``forge`` entry point, as it would any third-party distribution. Nothing is installed
into the test environment itself, so there is nothing to uninstall.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, only_plugins

from forge_core.testing import forge_run

EXAMPLE = REPO / "examples" / "forge-plugin-example"
IGNORED = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache")
#: The built-ins and the example only: the same whether or not the environment has the
#: example (or any other plugin) installed too, as the plugin guide tells a reader to do.
ONLY_EXAMPLE = only_plugins("example")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Install the example into a temporary target; returns the source copy, the target
    and the environment that makes the installation visible."""
    root = tmp_path_factory.mktemp("example")
    source, site = root / "src", root / "site"
    shutil.copytree(EXAMPLE, source, ignore=IGNORED)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"source": source, "site": site, "env": {"PYTHONPATH": path, **ONLY_EXAMPLE}}


def _config(tmp_path: Path, **data_overrides) -> str:
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    words = "packing keeps documents apart while a sliding window limits what each token sees".split()
    for i in range(24):
        text = " ".join(words[(i + j) % len(words)] for j in range(5 + (i * 7) % 30))
        (corpus / f"doc{i:02d}.txt").write_text(text)
    config = {
        "run": {"name": "example", "out_dir": str(tmp_path / "run"), "seed": 0, "device": "cpu"},
        "model": {
            "name": "llama",
            "options": {
                "dim": 32,
                "n_layers": 2,
                "n_heads": 4,
                "n_kv_heads": 2,
                "max_seq_len": 64,
                "multiple_of": 16,
            },
        },
        "attention": {"backend": "window", "options": {"window": 8}},
        "data": {
            "source": "text",
            "source_options": {"paths": [str(corpus / "*.txt")]},
            "tokenizer": "byte",
            "packer": "greedy",
            "seq_len": 32,
            **data_overrides,
        },
        "train": {"steps": 3, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "peak_tflops": 1.0},
        "checkpoint": {"every": 0, "keep": 1},
        "logging": {"loggers": ["csv", "jsonl"]},
    }
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def test_plugins_lists_the_installed_distribution_and_its_components(installed):
    result = forge_run(["plugins", "--json"], paths=[installed["site"]], env=ONLY_EXAMPLE)
    assert result.code == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    example = plugins["example"]
    assert (example["distribution"], example["version"], example["builtin"]) == (
        "forge-plugin-example",
        "0.1.0",
        False,
    )
    assert example["module"] == "forge_plugin_example.plugin"
    components = {(c["kind"], c["name"]) for c in example["components"]}
    assert components == {("attention", "window"), ("packer", "greedy"), ("logger", "csv")}
    assert example["rules"] == ["example.window-covers-row"]
    # Without the installation on the path, the plugin is simply not there.
    alone = forge_run(["plugins", "--json"], env=only_plugins())
    assert "example" not in {p["name"] for p in json.loads(alone.stdout)}


def test_check_judges_a_config_using_the_example_components(installed, tmp_path):
    config = _config(tmp_path)
    ok = forge_run(["check", config, "--json"], paths=[installed["site"]], env=ONLY_EXAMPLE)
    assert ok.code == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout) == {"valid": True, "world_size": None, "violations": []}

    # The example's own rule: a window as long as the row is a warning, not an error.
    wide = forge_run(
        ["check", config, "attention.options.window=32", "--json"],
        paths=[installed["site"]],
        env=ONLY_EXAMPLE,
    )
    assert wide.code == 0, wide.stderr
    (warning,) = json.loads(wide.stdout)["violations"]
    assert (warning["rule"], warning["severity"], warning["plugin"]) == (
        "example.window-covers-row",
        "warning",
        "example",
    )
    assert warning["fields"] == {"attention.options.window": 32, "data.seq_len": 32}

    # Its options class validates: window >= 1.
    bad = forge_run(
        ["check", config, "attention.options.window=0"], paths=[installed["site"]], env=ONLY_EXAMPLE
    )
    assert bad.code == 2 and "$.attention.options" in bad.stderr and "window" in bad.stderr, bad.stderr

    # Its declared capabilities feed the kernel's rules: greedy emits doc_ids, which the
    # pipeline carries to every stage, so the founding rule lets them pass.
    pp = forge_run(
        ["check", config, "parallel.pp=2", "--world-size", "2", "--json"],
        paths=[installed["site"]],
        env=ONLY_EXAMPLE,
    )
    rules = {v["rule"]: v for v in json.loads(pp.stdout)["violations"]}
    assert "parallel.metadata-reaches-layers" not in rules, rules


@pytest.mark.slow
def test_trains_a_few_steps_with_the_example_components(installed, tmp_path):
    config = _config(tmp_path)
    result = forge_run([config], paths=[installed["site"]], env=ONLY_EXAMPLE)
    assert result.code == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert all(math.isfinite(float(r["loss"])) for r in rows)
    assert (tmp_path / "run" / "metrics.jsonl").is_file()  # the built-in logger ran beside it
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (
        resolved["attention"]["backend"],
        resolved["attention"]["options"],
        resolved["data"]["packer"],
    ) == ("window", {"window": 8}, "greedy")


@pytest.mark.slow
def test_the_example_test_suite_passes_through_the_forge_pytest_plugin(installed, tmp_path):
    """The example's tests use the conformance kit only through the pytest plugin's
    fixtures, on components found through the entry point."""
    tests = installed["source"] / "tests"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tests),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(installed["source"]),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **installed["env"]},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary
