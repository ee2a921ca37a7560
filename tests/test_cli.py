"""forge-run's inspection commands: exit codes, no traceback on bad input (property
test), no torch import, the resolved config, and every shipped config passes check."""

from __future__ import annotations

import contextlib
import io
import math
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from forge_core.cli import main, normalize_argv
from forge_core.config.schema import ForgeConfig


def test_check_show_plugins_rules_and_refusals_do_not_import_torch(cfg):
    path = cfg({"data": {"packer": "concat"}})
    invalid = cfg({"data": {"packer": "concat"}, "parallel": {"pp": 2}})
    code = (
        "import sys; from forge_core.cli import main\n"
        f"for argv in (['check', {path!r}], ['show', {path!r}], ['plugins'], ['rules'], [{invalid!r}]):\n"
        "    main(argv)\n"
        "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout
    assert "HEAVY ['numpy']" in out or "HEAVY []" in out, out
    assert "'torch'" not in out.split("HEAVY")[1]


def test_show_prints_the_resolved_config(cfg):
    result = run_cli("show", cfg({"train": {"lr": 0.01}}), "model.options.dim=64")
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["train"]["lr"] == 0.01 and shown["model"]["options"]["dim"] == 64
    assert shown["model"]["options"]["n_layers"] == 4  # defaults of the options class filled in


def test_bare_config_path_means_train_and_no_command_prints_help():
    assert normalize_argv(["c.yaml", "train.lr=1"]) == ["train", "c.yaml", "train.lr=1"]
    assert normalize_argv(["--nproc", "2", "c.yaml"]) == ["train", "--nproc", "2", "c.yaml"]
    assert normalize_argv(["check", "c.yaml"]) == ["check", "c.yaml"]
    result = run_cli()
    assert result.returncode == 2 and "usage: forge-run" in result.stdout
    assert run_cli("check", "does-not-exist.yaml").returncode == 2
    result = run_cli("does-not-exist.yaml")  # train judges first: the same refusal
    assert result.returncode == 2 and "'does-not-exist.yaml' does not exist" in result.stderr


def test_check_warns_but_passes(cfg):
    # sdpa with document isolation warns at or above dense_mask_warn_seq_len (seq_len 256).
    result = run_cli("check", cfg({"attention": {"backend": "sdpa", "options": {"dense_mask_warn_seq_len": 128}}}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning: [sdpa.dense-mask-long-seq]" in result.stdout
    assert ": valid: 0 error(s), 1 warning(s)" in result.stdout


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_loads_and_passes_check(config):
    data = yaml.safe_load((REPO / "configs" / config).read_text()) or {}
    parallel = data.get("parallel", {})
    world = math.prod(max(1, parallel.get(k, 1)) for k in ("pp", "dp_replicate", "dp_shard", "tp"))
    result = run_cli("check", f"configs/{config}", "--world-size", str(world))
    assert result.returncode == 0, result.stdout + result.stderr


# --- property test: malformed input always gives exit 2, a message, no traceback -----

SCHEMA_FIELDS = {
    f"{section.name}.{f.name}": f.type
    for section in attrs.fields(ForgeConfig)
    for f in attrs.fields(section.type)
    if f.type in (int, float, bool, str)
}

_junk = st.one_of(
    st.text(max_size=8), st.floats(allow_nan=True), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
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
        assume(key not in {f.split(".")[1] for f in SCHEMA_FIELDS if f.startswith(section + ".")} | {"options", "source_options", "tokenizer_options", "packer_options", "optimizer_options", "schedule_options", "nonfinite", "wrappers", "loggers"})
        return f"{section}:\n  {key}: 1\n"
    text = draw(st.text(alphabet=st.sampled_from(list("{}[]:-,'\"\n\t &*!|>%@`#abc123")), min_size=1, max_size=40))
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    assume(parsed not in (None, {}))
    if isinstance(parsed, dict):
        assume(not set(map(str, parsed)) <= {"run", "model", "attention", "data", "parallel", "train", "checkpoint", "logging", "plugins"})
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
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
