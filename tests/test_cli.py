"""forge-run's inspection commands, in process: exit codes, no traceback on bad input
(property test), the resolved config, every shipped config passes check, and the runner
that runs them in process."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import yaml
from conftest import REPO, make_distribution
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from forge_core.cli.main import main, normalize_argv
from forge_core.config.schema import ForgeConfig
from forge_core.testing import CliResult, forge_run


def test_show_prints_the_resolved_config(forge_config):
    result = forge_run(["show", forge_config({"train": {"lr": 0.01}}), "model.options.dim=64"])
    assert result.code == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["train"]["lr"] == 0.01 and shown["model"]["options"]["dim"] == 64
    assert shown["model"]["options"]["n_layers"] == 4  # defaults of the options class filled in


def test_bare_config_path_means_train_and_no_command_prints_help():
    assert normalize_argv(["c.yaml", "train.lr=1"]) == ["train", "c.yaml", "train.lr=1"]
    assert normalize_argv(["--nproc", "2", "c.yaml"]) == ["train", "--nproc", "2", "c.yaml"]
    assert normalize_argv(["check", "c.yaml"]) == ["check", "c.yaml"]
    result = forge_run([])
    assert result.code == 2 and "usage: forge-run" in result.stdout
    assert forge_run(["check", "does-not-exist.yaml"]).code == 2
    result = forge_run(["does-not-exist.yaml"])  # train judges first: the same refusal
    assert result.code == 2 and "'does-not-exist.yaml' does not exist" in result.stderr


def test_check_warns_but_passes(forge_config):
    # sdpa with document isolation warns at or above dense_mask_warn_seq_len (seq_len 256).
    result = forge_run(
        [
            "check",
            forge_config({"attention": {"backend": "sdpa", "options": {"dense_mask_warn_seq_len": 128}}}),
        ]
    )
    assert result.code == 0, result.stdout + result.stderr
    assert "warning: [sdpa.dense-mask-long-seq]" in result.stdout
    assert ": valid: 0 error(s), 1 warning(s)" in result.stdout


def _needs_no_hub(path) -> bool:
    # Presets by Hub id need the model in a cache and data/train.jsonl: tests/test_presets.py
    # checks each with both laid out, at the real model's shapes.
    data = yaml.safe_load(path.read_text()) or {}
    return "/" not in str(data.get("model", {}).get("options", {}).get("init_from_hf", ""))


@pytest.mark.parametrize(
    "config", sorted(p.name for p in (REPO / "configs").glob("*.yaml") if _needs_no_hub(p))
)
def test_every_shipped_config_loads_and_passes_check(config):
    data = yaml.safe_load((REPO / "configs" / config).read_text()) or {}
    parallel = data.get("parallel", {})
    world = math.prod(max(1, parallel.get(k, 1)) for k in ("pp", "dp_replicate", "dp_shard", "tp"))
    result = forge_run(["check", f"configs/{config}", "--world-size", str(world)], cwd=REPO)
    assert result.code == 0, result.stdout + result.stderr


# --- property test: malformed input always gives exit 2, a message, no traceback -----

SCHEMA_FIELDS = {
    f"{section.name}.{f.name}": f.type
    for section in attrs.fields(ForgeConfig)
    for f in attrs.fields(section.type)
    if f.type in (int, float, bool, str)
}

_junk = st.one_of(
    st.text(max_size=8),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _wrong_for(type_):
    checks = {
        int: lambda v: type(v) is not int,
        float: lambda v: type(v) not in (int, float),
        bool: lambda v: type(v) is not bool,
        str: lambda v: type(v) is not str,
    }
    return _junk.filter(checks[type_])


@st.composite
def malformed_configs(draw):
    kind = draw(st.sampled_from(["bad_value", "bad_yaml", "unknown_key"]))
    if kind == "bad_value":
        path = draw(st.sampled_from(sorted(SCHEMA_FIELDS)))
        section, key = path.split(".")
        value = draw(_wrong_for(SCHEMA_FIELDS[path]))
        return yaml.safe_dump({section: {key: value}})
    if kind == "unknown_key":
        section = draw(st.sampled_from(["train", "data", "model", "parallel", "run"]))
        key = draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10))
        assume(
            key
            not in {f.split(".")[1] for f in SCHEMA_FIELDS if f.startswith(section + ".")}
            | {
                "options",
                "source_options",
                "tokenizer_options",
                "packer_options",
                "optimizer_options",
                "schedule_options",
                "nonfinite",
                "wrappers",
                "loggers",
            }
        )
        return f"{section}:\n  {key}: 1\n"
    text = draw(
        st.text(alphabet=st.sampled_from(list("{}[]:-,'\"\n\t &*!|>%@`#abc123")), min_size=1, max_size=40)
    )
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    assume(parsed not in (None, {}))
    if isinstance(parsed, dict):
        assume(
            not set(map(str, parsed))
            <= {"run", "model", "attention", "data", "parallel", "train", "checkpoint", "logging", "plugins"}
        )
    return text


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(text=malformed_configs())
def test_malformed_input_exits_2_with_a_message_never_a_traceback(tmp_path, text):
    path = Path(tmp_path) / "fuzz.yaml"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path)])  # an unexpected exception would fail the test here
    assert code == 2, (text, out.getvalue(), err.getvalue())
    assert err.getvalue().startswith("error: "), err.getvalue()
    assert "Traceback" not in err.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(sorted(SCHEMA_FIELDS)), data=st.data())
def test_malformed_override_values_exit_2(tmp_path, path, data):
    value = data.draw(_wrong_for(SCHEMA_FIELDS[path]))
    override = f"{path}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
    config = Path(tmp_path) / "empty.yaml"
    config.write_text("{}\n")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["check", str(config), override])
    assert code == 2 and err.getvalue().startswith("error: ")


# --- the command line people type ----------------------------------------------------


def test_options_and_overrides_in_any_order(forge_config, capsys, monkeypatch):
    from forge_core.cli import train as launch
    from forge_core.cli.main import parse_args

    path = forge_config({"data": {"packer": "none"}})
    for argv in (
        ["check", path, "--world-size", "2", "parallel.pp=2"],
        ["check", "--world-size", "2", path, "parallel.pp=2"],
        ["check", path, "parallel.pp=2", "--world-size", "2", "--json"],
    ):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert ("world size 2" in out) or json.loads(out)["world_size"] == 2, argv
    launched = []
    monkeypatch.setattr(
        launch,
        "relaunch",
        lambda args, overrides, requeue=None: launched.append((args.nproc, overrides)) or 0,
    )
    for flag in ("--nproc", "--nproc-per-node", "--nproc_per_node"):
        assert main([path, flag, "2", "parallel.dp_shard=2"]) == 0
    assert launched == [(2, ["parallel.dp_shard=2"])] * 3
    args = parse_args(["prepare", path, "--out", "shards", "data.tokenizer=hf", "--train-bpe", "300"])[1]
    assert (args.config, args.out, args.overrides, args.train_bpe) == (
        path,
        "shards",
        ["data.tokenizer=hf"],
        300,
    )


def test_check_without_world_size_says_dp_shard_resolves_at_launch(forge_config, capsys):
    assert main(["check", forge_config({})]) == 0
    assert "parallel.dp_shard = -1 resolves at launch" in capsys.readouterr().out
    assert main(["check", forge_config({"train": {"batch_size": 6}}), "--world-size", "4"]) == 2  # 4 shards
    assert "cannot be split evenly over 4 data-parallel ranks" in capsys.readouterr().out


def test_refused_launch_prints_the_exact_check_command(forge_config, capsys, monkeypatch):
    """--nproc 2 with every degree 1: refused before any process starts, and the command
    it names (overrides quoted, world size included) prints the same report."""

    def no_child(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    path = forge_config({})
    assert main([path, "--nproc", "2", "parallel.dp_shard=1", "run.name=my run"]) == 2
    err = capsys.readouterr().err
    command = f"forge-run check {shlex.quote(path)} parallel.dp_shard=1 'run.name=my run' --world-size 2"
    assert f"`{command}` prints the same report" in err and "[parallel.world-size]" in err
    assert main(shlex.split(command)[1:]) == 2
    report = capsys.readouterr().out.rsplit("\n", 2)[0]
    assert report and report in err


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_ends_quietly_in_process(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["rules"]) == 141
    assert capsys.readouterr().err == ""


def test_rules_plugins_and_check_json_into_a_closed_pipe_end_quietly(tmp_path):
    """`forge-run rules | head`: the reader is gone before the output is written: no
    BrokenPipeError traceback, status 141 (what a program killed by SIGPIPE reports)."""
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    for argv in (["rules"], ["plugins"], ["check", "--json", str(config)]):
        read, write = os.pipe()
        os.close(read)
        with open(write, "w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "forge_core.cli", *argv],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                timeout=60,
            )
        assert proc.returncode == 141, (argv, proc.stderr)
        assert proc.stderr == "", (argv, proc.stderr)


# --- the in-process runner -----------------------------------------------------------

PACKER_PLUGIN = """
from forge_core.api import PackerSpec, hookimpl

@hookimpl
def forge_packers():
    return [PackerSpec(name="{name}", summary="s", impl="x:Y")]
"""


def test_the_runner_gives_what_the_process_would_and_undoes_what_the_call_set(tmp_path, monkeypatch):
    from forge_core import __version__

    monkeypatch.delenv("FORGE_BLOCK_PLUGINS", raising=False)
    assert forge_run(["--version"]) == CliResult(code=0, stdout=f"forge-run {__version__}\n", stderr="")
    refused = forge_run(["check"])  # argparse's own refusal: its status, not a SystemExit
    assert refused.code == 2 and "the following arguments are required: config" in refused.stderr
    # Two distributions with one module name: each call sees its own, none outlives its call.
    sites = [
        make_distribution(
            tmp_path / name,
            f"forge-{name}",
            "1.0",
            {"samename": PACKER_PLUGIN.format(name=name)},
            {name: "samename"},
        )
        for name in ("first", "second")
    ]
    path_before = list(sys.path)
    for site, name, other in ((sites[0], "first", "second"), (sites[1], "second", "first")):
        packers = {p["name"]: p for p in json.loads(forge_run(["plugins", "--json"], paths=[site]).stdout)}
        assert [c["name"] for c in packers[name]["components"]] == [name] and other not in packers
        assert "samename" not in sys.modules and sys.path == path_before
    blocked = forge_run(["plugins", "--json"], paths=[sites[0]], env={"FORGE_BLOCK_PLUGINS": "first"})
    assert "first" not in {p["name"] for p in json.loads(blocked.stdout)}
    assert "FORGE_BLOCK_PLUGINS" not in os.environ
    (tmp_path / "c.yaml").write_text("train: {lr: 0.5}\n")
    here = os.getcwd()
    assert "lr: 0.5" in forge_run(["show", "c.yaml"], cwd=tmp_path).stdout and os.getcwd() == here
