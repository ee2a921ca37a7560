"""Hostile input to every ``forge-run`` command, generated rather than listed.

Whole config trees (every key of the schema and of every built-in component's options,
unknown keys, values of the wrong shape, ``data.sources`` lists), every command's own
arguments (read off its argparse parser, so a new option is covered the day it is
added) and run directories with a damaged, missing or replaced file. Whatever comes in,
a command ends with exit 0 or 2; on 2 its message names what was wrong (a config path,
a file, an argument); it never exits 1 ("a bug in Forge") or prints a traceback, and
``export-hf`` never takes anything away from the run it reads.

The examples are derandomized, so CI sees the same ones on every run;
``FORGE_HOSTILE_EXAMPLES=K`` multiplies their number and ``FORGE_HOSTILE_SEED=S`` draws
another set, for a longer campaign by hand.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import typing
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st
from train_helpers import tiny_config, write_config

from forge_core.api import hookimpl
from forge_core.api.unstable import INT_MAX, INT_MIN
from forge_core.cli.main import build_parser, subcommands
from forge_core.config.schema import KEYED_BLOCKS, OPTION_BLOCKS
from forge_core.docgen import builtin_registries, config_keys, option_rows
from forge_core.errors import outcome
from forge_core.testing import forge_run, train_in_process

REGISTRIES = builtin_registries()
SCALE = max(1, int(os.environ.get("FORGE_HOSTILE_EXAMPLES", "1")))
SEED = os.environ.get("FORGE_HOSTILE_SEED")


def campaign(examples: int):
    """Hypothesis settings for ``examples`` (times FORGE_HOSTILE_EXAMPLES) examples."""

    def apply(test):
        test = settings(
            max_examples=examples * SCALE,
            deadline=None,
            derandomize=SEED is None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )(test)
        return seed(int(SEED))(test) if SEED is not None else test

    return apply


# --- what may be typed ---------------------------------------------------------------


def _option_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 else tp


def config_paths() -> dict[str, tuple[Any, dict[str, str]]]:
    """``{dotted path: (type, settings that choose its component)}``: every key of the
    schema and of every built-in component's options (a list's entries as ``[]``)."""
    from forge_core.config.schema import ForgeConfig
    from forge_core.reference import resolved_fields

    def field_type(path: str) -> Any:
        cls: Any = ForgeConfig
        tp: Any = None
        for part in path.replace("[]", "").split("."):
            fields = {f.name: f for f in resolved_fields(cls)} if attrs.has(cls) else {}
            if part not in fields:
                return None
            tp = _option_type(fields[part].type)
            inner = typing.get_args(tp)
            cls = inner[0] if typing.get_origin(tp) is list and inner else tp
        return tp

    found = {path: (field_type(path), {}) for path in config_keys()}
    for block in OPTION_BLOCKS:
        for name in REGISTRIES[block.name].names():
            for path, f in option_rows(REGISTRIES[block.name].get(name).options, f"{block.options_path}."):
                found[path] = (_option_type(f.type), {block.name_path: name})
    for block in KEYED_BLOCKS:
        for name in REGISTRIES[block.name].names():
            options = REGISTRIES[block.name].get(name).options
            for path, f in option_rows(options, f"{block.options_path}.{name}."):
                found[path] = (_option_type(f.type), {})
    return found


PATHS = config_paths()

#: Values that break something somewhere: wrong types, out of every range, not finite,
#: too long, control characters, paths that leave where they should stay.
HOSTILE_SCALARS = [
    None,
    "",
    " ",
    "abc",
    "-1",
    "1e400",
    "nan",
    -1,
    0,
    1,
    2,
    7,
    INT_MAX,
    INT_MAX + 1,
    INT_MIN - 1,
    10**40,
    0.5,
    -0.5,
    1e-320,
    1e308,
    math.nan,
    math.inf,
    -math.inf,
    True,
    False,
    "x" * 5000,
    "../outside",
    "a\x00b",
    "a\x1fb",
    "\u00e9\U0001f642",
    "${HOME}",
    "*",
    "a,b",
    "1:2",
]


def _is_big(value: Any) -> bool:
    """A number large enough that using it as a size builds something huge."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > 64


def _values(scalar: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        scalar,
        st.lists(scalar, max_size=3),
        st.dictionaries(st.sampled_from(["name", "weight", "x", "options", "paths"]), scalar, max_size=2),
    )


_scalar = st.one_of(st.sampled_from(HOSTILE_SCALARS), st.text(max_size=6), st.integers(-3, 70), st.floats())
hostile = _values(_scalar)
#: Hostile values that a run may really build with: sizes stay small.
buildable = _values(
    st.one_of(
        st.sampled_from([v for v in HOSTILE_SCALARS if not _is_big(v)]),
        st.text(max_size=6),
        st.integers(-3, 64),
        st.floats(-64, 64),
    )
)


def _put(raw: dict, path: str, value: Any) -> None:
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.endswith("[]"):
            entries = raw.setdefault(part[:-2], [{"name": "stdlib", "weight": 1.0}])
            if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
                return
            raw = entries[0]
            continue
        child = raw.get(part)
        if not isinstance(child, dict):
            child = raw[part] = {}
        raw = child
    raw[parts[-1]] = value


@st.composite
def config_trees(draw, base: dict, values=hostile, paths=None, fewest: int = 1) -> dict:
    """``base`` with ``fewest`` to four keys set to hostile values (and sometimes an
    unknown key, or a whole section replaced by a scalar)."""
    raw = yaml.safe_load(yaml.safe_dump(base))
    candidates = sorted(paths or PATHS)
    for _ in range(draw(st.integers(fewest, 4))):
        kind = draw(st.sampled_from(["field", "field", "field", "unknown", "section"]))
        if kind == "field":
            path = draw(st.sampled_from(candidates))
            for key, name in PATHS.get(path, (None, {}))[1].items():
                _put(raw, key, name)
            _put(raw, path, draw(values))
        elif kind == "unknown":
            section = draw(st.sampled_from(["", *sorted({p.split(".")[0] for p in candidates})]))
            key = draw(st.sampled_from(["learning_rate", "stpes", "x", "per_device_train_batch_size"]))
            _put(raw, f"{section}.{key}" if section else key, draw(values))
        else:
            section = draw(st.sampled_from(sorted({p.split(".")[0] for p in candidates})))
            raw[section] = draw(_scalar)
    return raw


def names_what_was_wrong(message: str, argv: list[str]) -> bool:
    """A refusal names a config path, an argument or a file the user gave."""
    if re.search(r"\$[.:\[]", message) or "--" in message or "usage:" in message or "argument" in message:
        return True
    return any(len(str(a)) > 2 and str(a) in message for a in argv)


def assert_clean(code: int, stdout: str, stderr: str, argv: list[str]) -> None:
    event(f"{argv[0] if argv and not argv[0].startswith('/') else 'train'}: exit {code}")
    shown = f"argv={argv!r}\nexit {code}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-4000:]}"
    assert code in (0, 2), shown
    assert "Traceback" not in stderr + stdout, shown
    assert "bug in Forge" not in stderr, shown
    if code == 2:  # check reports the rules' verdicts on stdout, every refusal on stderr
        said = stderr if stderr.strip() else stdout
        assert said.strip(), shown
        assert names_what_was_wrong(said, argv), shown


def run_clean(argv: list[Any], **kwargs: Any):
    argv = [os.fspath(a) for a in argv]
    result = forge_run(argv, **kwargs)
    assert_clean(result.code, result.stdout, result.stderr, argv)
    return result


# --- check and show: any config tree --------------------------------------------------

QUICKSTART = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml").read_text())


def test_the_paths_cover_the_schema_and_every_component():
    for path in (
        "train.lr",
        "data.sources[].weight",
        "model.options.init_from_hf",
        "attention.options.block_size",
        "parallel.options.ddp.bucket_cap_mb",
        "logging.options.mlflow.tracking_uri",
        "run.name",
        "plugins.block",
    ):
        assert path in PATHS, path
    assert len(PATHS) > 150


@campaign(150)
@given(raw=config_trees(QUICKSTART))
def test_check_and_show_end_cleanly_on_any_config_tree(tmp_path_factory, raw):
    directory = tmp_path_factory.mktemp("tree")
    path = directory / "c.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    checked = run_clean(["check", path], cwd=directory)
    shown = run_clean(["show", path], cwd=directory)
    # show resolves without judging the rules: what it refuses, check refuses too.
    assert checked.code == 2 or shown.code == 0, (checked.stdout, shown.stderr)


@campaign(60)
@given(path=st.sampled_from(sorted(p for p in PATHS if "[]" not in p)), value=hostile)
def test_check_ends_cleanly_on_any_override(tmp_path_factory, path, value):
    directory = tmp_path_factory.mktemp("override")
    config = write_config(directory / "c.yaml", QUICKSTART)
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
    run_clean(["check", config, f"{path}={text.removesuffix('...').strip()}"], cwd=directory)


# --- train, up to the first step ------------------------------------------------------


class _Built(Exception):
    """Raised by the stopper at the first lifecycle hook: everything was built."""


class Stopper:
    @hookimpl
    def forge_train_start(self, run):
        raise _Built


#: Keys a built run may take hostile values in: not those that name where it writes or
#: that reach a network (check and show judge those above).
TRAIN_PATHS = sorted(
    p
    for p in PATHS
    if not p.startswith(("logging.", "run.out_dir", "data.cache", "plugins."))
    and not p.endswith(("dir", "_uri", "path", "paths", "init_from_hf"))
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    return tiny_config(tmp_path_factory.mktemp("tiny"), "run", train={"steps": 2, "batch_size": 4})


@campaign(20)
@given(data=st.data())
def test_train_builds_or_refuses_cleanly(tmp_path_factory, tiny, data):
    directory = tmp_path_factory.mktemp("train")
    raw = data.draw(config_trees(tiny, values=buildable, paths=TRAIN_PATHS, fewest=0))
    raw.setdefault("run", {})
    if isinstance(raw["run"], dict):
        raw["run"]["out_dir"] = str(directory / "run")
    config = write_config(directory / "c.yaml", raw)
    try:
        train_in_process(config, [], extra_plugins=(("stopper", Stopper()),))
    except BaseException as exc:  # noqa: BLE001 - judged exactly as forge-run judges it
        if isinstance(exc, _Built) or isinstance(exc.__cause__, _Built):  # the hook's error, named
            event("train: built, stopped at the first step")
            return
        message, code = outcome(exc)
        assert_clean(code, "", message or "", [config])
        return
    # A config can also train to completion before the stopper runs (no steps left).


# --- eval, sample, export-hf: any arguments, any damage to the run --------------------


@pytest.fixture(scope="module")
def pristine_run(tmp_path_factory) -> Path:
    """A finished tiny run with a held-out split and its checkpoint."""
    directory = tmp_path_factory.mktemp("pristine")
    cfg = tiny_config(
        directory,
        "run",
        train={"steps": 2, "batch_size": 4},
        data={**tiny_config(directory)["data"], "heldout": {"fraction": 0.2}},
    )
    assert train_in_process(write_config(directory / "c.yaml", cfg)) == "completed"
    return directory / "run"


DAMAGE = ("delete", "truncate", "flip", "junk", "empty", "directory", "self-link")


@st.composite
def run_dirs(draw, pristine: Path, where: Path) -> Path:
    """A run directory as a command may be handed one: a copy of ``pristine``, maybe
    with one file damaged; or something else where a run should be."""
    kind = draw(st.sampled_from(["run", "run", "run", "missing", "file", "empty"]))
    target = where / "given"
    if kind == "missing":
        return target
    if kind == "file":
        target.write_text("not a run\n")
        return target
    if kind == "empty":
        target.mkdir()
        return target
    shutil.copytree(pristine, target, symlinks=True)
    if draw(st.booleans()):
        files = sorted(p for p in target.rglob("*") if p.is_file() and not p.is_symlink())
        victim = files[draw(st.integers(0, len(files) - 1))]
        how = draw(st.sampled_from(DAMAGE))
        data = victim.read_bytes()
        if how == "delete":
            victim.unlink()
        elif how == "truncate":
            victim.write_bytes(data[: len(data) // 2])
        elif how == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            victim.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
        elif how == "junk":
            victim.write_bytes(b"\x00\xff{[not what it should be" * 3)
        elif how == "empty":
            victim.write_bytes(b"")
        elif how == "directory":
            victim.unlink()
            victim.mkdir()
        elif how == "self-link":
            victim.unlink()
            victim.symlink_to(victim.name)
    return target


def _value_for(action: argparse.Action, draw) -> list[str]:
    """Hostile command-line words for one option of a command."""
    flag = action.option_strings[-1]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [draw(st.sampled_from(action.option_strings))]
    if action.nargs == 0:
        return [flag]
    if action.choices:
        word = draw(st.one_of(st.sampled_from(sorted(action.choices)), st.sampled_from(["", "fp8", "x"])))
    elif action.type is int:
        word = str(draw(st.one_of(st.integers(-3, 8), st.sampled_from([10**18, -(10**18), 2**70]))))
        word = draw(st.sampled_from([word, word, "abc", "1.5", ""]))
    elif action.type is float:
        word = draw(st.sampled_from(["0", "-1", "0.5", "1", "nan", "inf", "-inf", "1e308", "abc", ""]))
    else:
        word = draw(
            st.one_of(
                st.sampled_from(
                    ["", "def ", "x" * 3000, "\x00", "0", "-1GB", "1B", "5GB", "abcGB", "1e30GB"]
                ),
                st.text(max_size=8),
            )
        )
    return [flag, word]


@st.composite
def options_of(draw, command: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Some of ``command``'s optional arguments, each with a hostile value."""
    parser = subcommands(build_parser())[command]
    actions = [
        a
        for a in parser._actions
        if a.option_strings and a.dest not in ("help", *skip)  # noqa: SLF001
    ]
    words: list[str] = []
    for action in draw(st.lists(st.sampled_from(actions), max_size=4, unique_by=lambda a: a.dest)):
        words += _value_for(action, draw)
    return words


def _snapshot(directory: Path) -> dict[str, bytes]:
    if not directory.is_dir():
        return {}
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


#: eval re-judges the run's config with its overrides: sizes stay small there too.
EVAL_PATHS = sorted(p for p in TRAIN_PATHS if p.startswith(("eval.", "data.", "train.")))


@campaign(25)
@given(data=st.data())
def test_eval_ends_cleanly(tmp_path_factory, pristine_run, data):
    where = tmp_path_factory.mktemp("eval")
    run = data.draw(run_dirs(pristine_run, where))
    overrides = []
    for path in data.draw(st.lists(st.sampled_from(EVAL_PATHS), max_size=2)):
        text = yaml.safe_dump(data.draw(buildable), default_flow_style=True, allow_unicode=True)
        overrides.append(f"{path}={text.strip().removesuffix('...').strip()}")
    run_clean(["eval", run, *overrides, *data.draw(options_of("eval"))], cwd=where)


@campaign(25)
@given(data=st.data())
def test_sample_ends_cleanly(tmp_path_factory, pristine_run, data):
    where = tmp_path_factory.mktemp("sample")
    run = data.draw(run_dirs(pristine_run, where))
    run_clean(["sample", run, *data.draw(options_of("sample"))], cwd=where)


@st.composite
def out_dirs(draw, run: Path, where: Path) -> Path:
    """Where an export may be told to write: fresh, existing, the run, inside it, a link."""
    kind = draw(st.sampled_from(["fresh", "existing", "file", "run", "inside", "parent", "link", "nested"]))
    if kind == "fresh":
        return where / "out"
    if kind == "existing":
        (where / "out").mkdir(exist_ok=True)
        (where / "out" / "keep.txt").write_text("mine\n")
        return where / "out"
    if kind == "file":
        (where / "out").write_text("a file\n")
        return where / "out"
    if kind == "run":
        return run
    if kind == "inside":
        return run / "export"
    if kind == "parent":
        return run.parent
    if kind == "link":
        (where / "real").mkdir(exist_ok=True)
        (where / "out").symlink_to(where / draw(st.sampled_from(["real", str(run.name)])))
        return where / "out"
    return where / "a" / "b" / "c"


@campaign(25)
@given(data=st.data())
def test_export_hf_ends_cleanly_and_takes_nothing_from_the_run(tmp_path_factory, pristine_run, data):
    where = tmp_path_factory.mktemp("export")
    run = data.draw(run_dirs(pristine_run, where))
    out = data.draw(out_dirs(run, where))
    before = _snapshot(run)
    run_clean(["export-hf", run, out, *data.draw(options_of("export-hf"))], cwd=where)
    after = _snapshot(run)
    assert {k: v for k, v in after.items() if k in before} == before, "export-hf changed the run it read"
    assert set(before) <= set(after), sorted(set(before) - set(after))


# --- prepare: any config tree, any output ---------------------------------------------

PREPARE_PATHS = sorted(p for p in TRAIN_PATHS if p.startswith("data."))


@campaign(12)
@given(data=st.data())
def test_prepare_ends_cleanly(tmp_path_factory, tiny, pristine_run, data):
    where = tmp_path_factory.mktemp("prepare")
    raw = data.draw(config_trees(tiny, values=buildable, paths=PREPARE_PATHS, fewest=0))
    config = write_config(where / "c.yaml", raw)
    out = data.draw(out_dirs(data.draw(run_dirs(pristine_run, where)), where))
    before = _snapshot(where / "given")
    bpe = data.draw(
        st.sampled_from([[], [], ["--train-bpe", "-1"], ["--train-bpe", "0"], ["--train-bpe", "x"]])
    )
    run_clean(
        ["prepare", config, "--out", out, *bpe, *data.draw(options_of("prepare", ("out", "train_bpe")))],
        cwd=where,
    )
    if out != where / "given":  # prepare may replace only what it was told to write
        after = _snapshot(where / "given")
        assert {k: v for k, v in after.items() if k in before} == before
