"""Config loading: YAML, overrides, strict scalars, unknown keys, option blocks; every
problem reported at once with its path."""

from __future__ import annotations

import attrs
import pytest

from forge_core.config.loader import ConfigError, apply_overrides, load_config, structure
from forge_core.config.schema import ForgeConfig
from forge_core.hookspecs import hookimpl
from forge_core.judge import judge
from forge_core.specs import AttentionBackendSpec


def issues_of(path, overrides=()):
    with pytest.raises(ConfigError) as info:
        judge(path, list(overrides))
    return dict(info.value.issues), str(info.value)


def test_sci_notation_without_a_dot_is_a_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 3e-4\n  warmup_steps: 2\n")
    assert judge(str(path)).config.train.lr == 3e-4


def test_override_values_are_parsed_as_yaml(cfg):
    config = judge(cfg({}), ["train.lr=3e-4", "parallel.dp_shard=1", "logging.loggers=[jsonl]", "run.name=abc"]).config
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
def test_strict_scalars_name_path_and_value(cfg, path, value, expected):
    section, key = path.split(".")
    issues, _ = issues_of(cfg({section: {key: value}}))
    assert expected in issues[f"$.{path}"]


def test_unknown_keys_get_did_you_mean_with_path(cfg):
    issues, _ = issues_of(cfg({"train": {"lrr": 0.1}, "trian": {}}))
    assert "unknown key 'lrr'. Did you mean 'lr'?" in issues["$.train"]
    assert "unknown key 'trian'. Did you mean 'train'?" in issues["$"]


def test_every_error_is_reported_at_once(cfg):
    issues, text = issues_of(cfg({"train": {"steps": 1.5, "lr": "x"}, "data": {"seq_len": "long"}}))
    assert set(issues) == {"$.train.steps", "$.train.lr", "$.data.seq_len"}
    assert text.count("error: $.") == 3


def test_literal_choices_are_listed(cfg):
    issues, _ = issues_of(cfg({"train": {"precision": "bf61"}}))
    assert "expected one of 'fp32', 'bf16', got bf61" in issues["$.train.precision"]


def test_unknown_component_name_and_bad_option_block(cfg):
    issues, _ = issues_of(cfg({"attention": {"backend": "flexx"}, "model": {"options": {"dimm": 64}}}))
    assert "unknown attention backend 'flexx'. Did you mean 'flex'?" in issues["$.attention.backend"]
    assert "unknown key 'dimm'. Did you mean 'dim'?" in issues["$.model.options"]


def test_option_blocks_are_structured_against_component_options(cfg):
    config = judge(cfg({"train": {"optimizer": "sgd", "optimizer_options": {"momentum": 0.5}}})).config
    assert type(config.train.optimizer_options).__name__ == "SGDOptions"
    assert config.train.optimizer_options.momentum == 0.5


def test_overrides_errors():
    with pytest.raises(ConfigError, match="not of the form section.key=value"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match=r"\$\.train\.lr: override 'train.lr.x=1' goes inside \$\.train\.lr"):
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


class _WindowPlugin:
    @hookimpl
    def forge_attention_backends(self):
        return [
            AttentionBackendSpec(name="window", summary="s", impl="x.y:Z", options=_WindowOptions),
            AttentionBackendSpec(name="range", summary="s", impl="x.y:Z", options=_RangeOptions),
        ]


def _option_issues(cfg, backend, options):
    with pytest.raises(ConfigError) as info:
        judge(cfg({"attention": {"backend": backend, "options": options}}), extra_plugins=(("window", _WindowPlugin()),))
    return info.value.issues


def test_validator_errors_in_option_blocks_are_reported_at_their_field(cfg):
    issues = _option_issues(cfg, "window", {"window": 0})
    assert issues == [("$.attention.options.window", "'window' must be >= 1: 0")]
    # Every failing validator at once, not only the first that __init__ runs.
    issues = dict(_option_issues(cfg, "window", {"window": 0, "mode": "sideways"}))
    assert issues == {
        "$.attention.options.window": "'window' must be >= 1: 0",
        "$.attention.options.mode": "'mode' must be in ['causal', 'full'] (got 'sideways')",
    }
    config = judge(cfg({"attention": {"backend": "window", "options": {"window": 2, "mode": "full"}}}),
                   extra_plugins=(("window", _WindowPlugin()),)).config
    assert config.attention.options == _WindowOptions(window=2, mode="full")
    assert attrs.validators.get_disabled() is False


def test_errors_of_a_whole_option_block_stay_at_the_block(cfg):
    # A check across fields (__attrs_post_init__) belongs to no single field.
    assert _option_issues(cfg, "range", {"lo": 2}) == [("$.attention.options", "ValueError: hi must be above lo")]
