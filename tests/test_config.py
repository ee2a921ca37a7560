"""Config loading: YAML, overrides, strict scalars, unknown keys, option blocks; every
problem reported at once with its path."""

from __future__ import annotations

import attrs
import pytest

from forge_core.api import AttentionBackendSpec, hookimpl
from forge_core.config import overrides, yaml_reader
from forge_core.config.errors import ConfigError
from forge_core.config.loader import load_config
from forge_core.config.overrides import apply_overrides
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.judge import judge


def issues_of(path, overrides=()):
    with pytest.raises(ConfigError) as info:
        judge(path, list(overrides))
    return dict(info.value.issues), str(info.value)


def test_sci_notation_without_a_dot_is_a_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 3e-4\n  warmup_steps: 2\n")
    assert judge(str(path)).config.train.lr == 3e-4


def test_override_values_are_parsed_as_yaml(forge_config):
    config = judge(
        forge_config({}), ["train.lr=3e-4", "parallel.dp_shard=1", "logging.loggers=[jsonl]", "run.name=abc"]
    ).config
    assert (config.train.lr, config.logging.loggers, config.run.name) == (3e-4, ["jsonl"], "abc")


@pytest.mark.parametrize(
    "path,value,expected",
    [
        ("train.steps", 2.7, "expected an integer, got 2.7"),
        ("train.steps", "3", "expected an integer, got '3' (str)"),
        ("train.steps", True, "expected an integer, got True (bool)"),
        ("train.lr", "3", "expected a number, got '3' (str)"),
        ("data.shuffle", 1, "expected true or false, got 1 (int)"),
        ("run.name", 7, "expected a string, got 7 (int)"),
        ("logging.loggers", "jsonl", "expected a list"),
    ],
)
def test_strict_scalars_name_path_and_value(forge_config, path, value, expected):
    section, key = path.split(".")
    issues, _ = issues_of(forge_config({section: {key: value}}))
    assert expected in issues[f"$.{path}"]


def test_unknown_keys_get_did_you_mean_with_path(forge_config):
    issues, _ = issues_of(forge_config({"train": {"lrr": 0.1}, "trian": {}}))
    assert "unknown key 'lrr'. Did you mean 'lr'?" in issues["$.train"]
    assert "unknown key 'trian'. Did you mean 'train'?" in issues["$"]


def test_every_error_is_reported_at_once(forge_config):
    issues, text = issues_of(forge_config({"train": {"steps": 1.5, "lr": "x"}, "data": {"seq_len": "long"}}))
    assert set(issues) == {"$.train.steps", "$.train.lr", "$.data.seq_len"}
    assert text.count("error: $.") == 3


def test_literal_choices_are_listed(forge_config):
    issues, _ = issues_of(forge_config({"train": {"precision": "bf61"}}))
    assert "expected one of 'fp32', 'bf16', got bf61" in issues["$.train.precision"]


def test_unknown_component_name_and_bad_option_block(forge_config):
    issues, _ = issues_of(
        forge_config({"attention": {"backend": "flexx"}, "model": {"options": {"dimm": 64}}})
    )
    assert "unknown attention backend 'flexx'. Did you mean 'flex'?" in issues["$.attention.backend"]
    assert "unknown key 'dimm'. Did you mean 'dim'?" in issues["$.model.options"]


def test_option_blocks_are_structured_against_component_options(forge_config):
    config = judge(
        forge_config({"train": {"optimizer": "sgd", "optimizer_options": {"momentum": 0.5}}})
    ).config
    assert type(config.train.optimizer_options).__name__ == "SGDOptions"
    assert config.train.optimizer_options.momentum == 0.5


def test_overrides_errors():
    with pytest.raises(ConfigError, match="not of the form section.key=value"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(
        ConfigError, match=r"\$\.train\.lr: override 'train.lr.x=1' goes inside \$\.train\.lr"
    ):
        apply_overrides({"train": {"lr": 1.0}}, ["train.lr.x=1"])


def test_yaml_errors_and_non_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match=r"invalid YAML \(line"):
        load_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping of sections, got list"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_section_that_is_not_a_mapping():
    _, issues = structure({"train": 5}, ForgeConfig)
    assert issues and issues[0][0] == "$.train"


@attrs.frozen
class _WindowOptions:
    window: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    mode: str = attrs.field(default="causal", validator=attrs.validators.in_(["causal", "full"]))


@attrs.frozen
class _RangeOptions:
    lo: int = 0
    hi: int = 1

    def __attrs_post_init__(self):
        if self.hi <= self.lo:
            raise ValueError("hi must be above lo")


class _BandedPlugin:
    """Names of its own (the example package registers a ``window`` backend)."""

    @hookimpl
    def forge_attention_backends(self):
        return [
            AttentionBackendSpec(name="banded", summary="s", impl="x.y:Z", options=_WindowOptions),
            AttentionBackendSpec(name="range", summary="s", impl="x.y:Z", options=_RangeOptions),
        ]


def _option_issues(cfg, backend, options):
    with pytest.raises(ConfigError) as info:
        judge(
            cfg({"attention": {"backend": backend, "options": options}}),
            extra_plugins=(("banded_plugin", _BandedPlugin()),),
        )
    return info.value.issues


def test_validator_errors_in_option_blocks_are_reported_at_their_field(forge_config, builtins_only):
    issues = _option_issues(forge_config, "banded", {"window": 0})
    assert issues == [("$.attention.options.window", "'window' must be >= 1: 0")]
    # Every failing validator at once, not only the first that __init__ runs.
    issues = dict(_option_issues(forge_config, "banded", {"window": 0, "mode": "sideways"}))
    assert issues == {
        "$.attention.options.window": "'window' must be >= 1: 0",
        "$.attention.options.mode": "'mode' must be in ['causal', 'full'] (got 'sideways')",
    }
    config = judge(
        forge_config({"attention": {"backend": "banded", "options": {"window": 2, "mode": "full"}}}),
        extra_plugins=(("banded_plugin", _BandedPlugin()),),
    ).config
    assert config.attention.options == _WindowOptions(window=2, mode="full")
    assert attrs.validators.get_disabled() is False


def test_errors_of_a_whole_option_block_stay_at_the_block(forge_config, builtins_only):
    # A check across fields (__attrs_post_init__) belongs to no single field.
    assert _option_issues(forge_config, "range", {"lo": 2}) == [
        ("$.attention.options", "ValueError: hi must be above lo")
    ]


# --- values no config may hold ---------------------------------------------------------


@pytest.mark.parametrize(
    "text,path,expected",
    [
        ("train:\n  lr: .nan\n", "$.train.lr", "expected a finite number, got nan; lr must be above 0"),
        ("train:\n  lr: .inf\n", "$.train.lr", "expected a finite number, got inf; lr must be above 0"),
        ("train:\n  lr: -.inf\n", "$.train.lr", "expected a finite number, got -inf; lr must be above 0"),
        ("train:\n  lr: 1e999\n", "$.train.lr", "expected a finite number, got inf; lr must be above 0"),
        ("train:\n  steps: -5\n", "$.train.steps", "must be at least 1, got -5"),
        ("train:\n  steps: 0\n", "$.train.steps", "must be at least 1, got 0"),
        (
            f"train:\n  steps: {10**40}\n",
            "$.train.steps",
            f"expected an integer from -2**63 to 2**63-1, got {10**40}; steps must be at least 1",
        ),
        (
            "train:\n  optimizer_options: {beta1: 1.5}\n",
            "$.train.optimizer_options.beta1",
            "must be in [0, 1), got 1.5",
        ),
        ("run:\n  out_dir: ''\n", "$.run.out_dir", "must be a non-empty string, got ''"),
        ("parallel:\n  dp_shard: 0\n", "$.parallel.dp_shard", "must be at least 1, or -1, got 0"),
        (
            "data:\n  source_options: {max_files: -1}\n",
            "$.data.source_options.max_files",
            "must be at least 0, got -1",
        ),
    ],
)
def test_values_outside_their_meaning_are_refused_at_their_path(tmp_path, text, path, expected):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    issues, _ = issues_of(config)
    assert issues == {path: expected}


def test_huge_values_are_cut_in_messages(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"train:\n  lr: '{'x' * 100_000}'\n  steps: [{', '.join(['1'] * 5000)}]\n")
    issues, text = issues_of(config)
    assert len(issues["$.train.lr"]) < 150 and "..." in issues["$.train.lr"]
    assert len(issues["$.train.steps"]) < 150
    assert len(text) < 500


def test_schema_errors_and_option_block_errors_come_in_one_report(forge_config):
    # Both at once: a bad kernel value does not hide the option block's problems.
    issues, _ = issues_of(forge_config({}), ["train.lr=abc", "model.options.dimm=3"])
    assert set(issues) == {"$.train.lr", "$.model.options"}
    assert "unknown key 'dimm'. Did you mean 'dim'?" in issues["$.model.options"]
    # Also with the section itself broken elsewhere, and an override that is not YAML.
    issues, _ = issues_of(
        forge_config({"train": {"steps": 0}}),
        ["train.lr=[1", "attention.options.block_size=0", "attention.backend=flex"],
    )
    assert set(issues) == {"$.train.lr", "$.train.steps", "$.attention.options.block_size"}
    # An unknown component name is reported with the schema's errors too.
    issues, _ = issues_of(forge_config({"train": {"lr": "x"}, "data": {"packer": "bfdd"}}))
    assert set(issues) == {"$.train.lr", "$.data.packer"}


# --- YAML that a config never needs and an attacker could use --------------------------

#: 448 bytes that expand to 9**9 (387 million) strings, over 900 million values with the lists.
ALIAS_BOMB = "\n".join(
    [f"a: &a [{', '.join(['lol-lol'] * 9)}]"]
    + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    + ["train: {lr: *i}", ""]
)


class _Counting:
    """Counts what the YAML loader composes and constructs: the bound on work a
    malicious config can cause, asserted without a clock."""

    def __init__(self, monkeypatch):
        self.composed = self.constructed = 0
        original_compose, original_construct = (
            yaml_reader._Loader.compose_node,
            yaml_reader._Loader.construct_object,
        )

        def compose(this, parent, index):
            self.composed += 1
            return original_compose(this, parent, index)

        def construct(this, node, deep=False):
            self.constructed += 1
            return original_construct(this, node, deep)

        monkeypatch.setattr(yaml_reader._Loader, "compose_node", compose)
        monkeypatch.setattr(yaml_reader._Loader, "construct_object", construct)


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path, monkeypatch):
    assert 440 <= len(ALIAS_BOMB.encode()) <= 460
    config = tmp_path / "bomb.yaml"
    config.write_text(ALIAS_BOMB)
    count = _Counting(monkeypatch)
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.issues == [
        (
            "$",
            (
                "the YAML expands to 926,177,117 values, more than the 100,000 a config may have (anchors "
                "and aliases, &name and *name, repeat what they name): write the values out"
            ),
        )
    ]
    assert count.constructed == 0 and count.composed < 200  # the document's own nodes only


def test_an_alias_bomb_as_an_override_is_refused_too(tmp_path, monkeypatch):
    flow = "[" + ", ".join(ALIAS_BOMB.splitlines()[:-1][i].split(": ", 1)[1] for i in range(9)) + "]"
    count = _Counting(monkeypatch)
    with pytest.raises(
        ConfigError, match=r"\$\.train\.lr: the YAML expands to [\d,]+ values, more than the 100,000"
    ):
        apply_overrides({}, [f"train.lr={flow}"])
    assert count.constructed == 0


def test_aliases_within_bounds_work_and_an_override_changes_one_place_only(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "logging:\n  options:\n    jsonl: &f {filename: m.jsonl}\n    plot: {<<: *f, filename: p.png}\n"
        "parallel:\n  options: {ddp: &d {bucket_cap_mb: 5.0}, fsdp: {}}\n"
    )
    raw = yaml_reader.read_config_file(config)
    assert raw["logging"]["options"]["plot"] == {"filename": "p.png"}
    shared = apply_overrides({"a": (inner := {"x": 1}), "b": inner}, ["a.x=2"])
    assert shared == {"a": {"x": 2}, "b": {"x": 1}}
    with pytest.raises(ConfigError, match="refers to a value that contains it"):
        yaml_reader.parse_yaml("a: &a [1, *a]\n", "$")


@pytest.mark.parametrize("depth", [5_000, 100_000])
@pytest.mark.parametrize("shape", ["list", "mapping"])
def test_deep_nesting_is_a_clean_error_in_files_and_overrides(tmp_path, monkeypatch, depth, shape):
    value = "[" * depth + "]" * depth if shape == "list" else "{a: " * depth + "1" + "}" * depth
    config = tmp_path / "deep.yaml"
    config.write_text(f"train: {value}\n")
    count = _Counting(monkeypatch)
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.issues[0][0] == "$" and "nested more than 64 levels deep" in info.value.issues[0][1]
    assert (
        count.composed <= 2 * yaml_reader.MAX_DEPTH + 2
    )  # stopped at the limit (keys count too), whatever the depth
    with pytest.raises(
        ConfigError, match=r"\$\.train\.x: invalid YAML \(line 1, column \d+\): nested more than 64"
    ):
        apply_overrides({}, [f"train.x={value}"])
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        apply_overrides({}, [".".join(["a"] * depth) + "=1"])


def test_keys_that_are_not_strings_are_refused_in_files_and_overrides(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("1: a\ntrain:\n  lr: 0.1\n  2.5: x\n  yes: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.issues == [
        (
            "$",
            'key 1 (line 1) is an integer, not a string: config keys are names; quote it ("1") if it is one',
        ),
        (
            "$.train",
            "key 2.5 (line 4) is a number, not a string: config keys are names; "
            'quote it ("2.5") if it is one',
        ),
        (
            "$.train",
            "key yes (line 5) is a boolean, not a string: config keys are names; "
            'quote it ("yes") if it is one',
        ),
    ]
    with pytest.raises(ConfigError, match=r"\$\.train: key 1 \(line 1\) is an integer"):
        apply_overrides({}, ["train={1: a, lr: 2}"])


def test_duplicate_keys_and_sections_are_refused_with_both_lines(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  lr: 1.0\n  lr: 2.0\nmodel: {}\ntrain:\n  steps: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.issues == [
        (
            "$",
            "key 'train' is given twice (lines 1 and 5): the second would silently replace the first; "
            "merge them into one",
        ),
        (
            "$.train",
            "key 'lr' is given twice (lines 2 and 3): the second would silently replace the first; "
            "merge them into one",
        ),
    ]


def test_an_empty_file_is_refused_and_braces_mean_every_default(tmp_path):
    config = tmp_path / "c.yaml"
    for text in ("", "# only a comment\n", "~\n"):
        config.write_text(text)
        with pytest.raises(ConfigError, match=r"is empty: write `\{\}` to train with every default"):
            load_config(config)
    config.write_text("{}\n")
    assert load_config(config) == ForgeConfig()


def test_a_directory_given_as_the_config_is_called_a_directory(tmp_path):
    (tmp_path / "quickstart.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"is a directory, not a YAML file; it holds quickstart\.yaml"):
        load_config(tmp_path)


# --- keys that moved ----------------------------------------------------------------


def test_a_moved_key_in_a_file_is_an_error_naming_its_new_path_with_every_other_error(forge_config):
    issues, text = issues_of(
        forge_config(
            {
                "parallel": {"pp_schedule": "gpipe", "sequence_parallel": True, "tp": 0},
                "train": {"steps": "x"},
            }
        )
    )
    assert issues["$.parallel.pp_schedule"] == (
        "moved to parallel.options.pp.schedule: set parallel.options.pp.schedule = 'gpipe' instead "
        "(override: parallel.options.pp.schedule='gpipe')"
    )
    assert issues["$.parallel.sequence_parallel"].startswith("moved to parallel.options.tp.sequence_parallel")
    assert "$.parallel.tp" in issues and "$.train.steps" in issues  # reported together
    assert "unknown key" not in text  # a moved key is not also an unknown one


def test_a_moved_key_in_an_override_is_an_error_naming_its_new_path(forge_config):
    issues, _ = issues_of(forge_config({}), ["parallel.pp_microbatches=4", "parallel.pp_virtual_stages=2"])
    assert issues["$.parallel.pp_microbatches"].startswith("moved to parallel.options.pp.microbatches: ")
    assert issues["$.parallel.pp_virtual_stages"].startswith("moved to parallel.options.pp.virtual_stages: ")


def test_moved_keys_work_at_their_new_paths_in_files_and_overrides(forge_config):
    path = forge_config({"parallel": {"options": {"pp": {"schedule": "gpipe"}}}})
    plan = judge(
        path, ["parallel.options.pp.microbatches=4", "parallel.options.tp.sequence_parallel=true"]
    ).plan
    assert (plan.options_of("pp").schedule, plan.options_of("pp").microbatches) == ("gpipe", 4)
    assert plan.options_of("tp").sequence_parallel is True
    # Defaults for a strategy the config does not mention, active or not.
    assert judge(forge_config({})).plan.options_of("pp").virtual_stages == 1


def test_forge_run_check_reports_a_moved_key(forge_config, capsys):
    from forge_core import cli

    assert cli.main(["check", forge_config({"parallel": {"pp_schedule": "gpipe"}})]) == 2
    assert "error: $.parallel.pp_schedule: moved to parallel.options.pp.schedule" in capsys.readouterr().err


def test_a_run_directory_written_before_the_move_still_loads():
    """Forge's own config.yaml of an earlier run: its moved keys are put at their new
    paths (a user's config gets the error instead)."""
    saved = {
        "parallel": {
            "pp": 2,
            "pp_schedule": "gpipe",
            "pp_microbatches": 0,
            "sequence_parallel": False,
            "options": {"pp": {"virtual_stages": 1}},
        }
    }
    migrated = overrides.migrate_moved_keys(saved)
    assert migrated["parallel"] == {
        "pp": 2,
        "options": {
            "pp": {"virtual_stages": 1, "schedule": "gpipe", "microbatches": 0},
            "tp": {"sequence_parallel": False},
        },
    }
    assert saved["parallel"]["pp_schedule"] == "gpipe"  # the input is left alone
