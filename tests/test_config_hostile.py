"""Hostile configs: every one is a clean exit 2 naming its path, the value and a fix,
never exit 1 ("a bug in Forge"), and judged in bounded work with a bounded report."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge_core.config import yaml_reader
from forge_core.config.errors import MAX_REPORTED, ConfigError
from forge_core.config.schema import TrainSection
from forge_core.config.structuring import MAX_UNKNOWN_SHOWN, unknown_key
from forge_core.testing import forge_run


def _refused(result, path: str) -> str:
    """The one error line at ``path`` of an exit-2 refusal (and no traceback, no bug)."""
    assert result.code == 2, result.stdout + result.stderr
    assert "bug in Forge" not in result.stderr and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"error: {path}: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- mixture weights ---------------------------------------------------------------


@pytest.mark.parametrize(
    "weight,says",
    [
        ("-1", "must be above 0"),
        ("0", "must be above 0"),
        (".nan", "expected a finite number, got nan"),
        (".inf", "expected a finite number, got inf"),
        ('"abc"', "expected a number, got 'abc' (str)"),
        ("null", "expected a number, got None (null)"),
    ],
)
@pytest.mark.parametrize("command", ["check", "train"])
def test_a_bad_mixture_weight_is_an_error_at_its_path(forge_config, tmp_path, command, weight, says):
    out = tmp_path / "run"
    argv = [
        forge_config({"run": {"out_dir": str(out)}}),
        f"data.sources=[{{name: stdlib, weight: {weight}}}]",
    ]
    result = forge_run(["check", *argv] if command == "check" else argv)
    line = _refused(result, "$.data.sources[0].weight")
    assert says in line and "leave an entry out rather than weigh it 0" in line  # the value and the fix
    assert not out.exists()  # train refused before it made anything


def test_all_mixture_weights_zero_names_every_entry(forge_config):
    entries = "[{name: stdlib, weight: 0}, {name: stdlib, weight: 0, label: b}]"
    result = forge_run(["check", forge_config({}), f"data.sources={entries}"])
    for i in (0, 1):
        assert "must be above 0" in _refused(result, f"$.data.sources[{i}].weight")


def test_a_refused_scalar_says_what_its_field_allows(forge_config):
    result = forge_run(["check", forge_config({"train": {"steps": "many"}})])
    assert _refused(result, "$.train.steps").endswith("got 'many' (str); steps must be at least 1")


# --- characters YAML does not allow ----------------------------------------------------


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x7f", "\x9f", "\ufffe"])
def test_a_control_character_in_the_file_names_file_line_column_and_character(tmp_path, char):
    config = tmp_path / "x.yaml"
    config.write_text(f"train: {{steps: 3}}\nrun:\n  name: a{char}b\n", encoding="utf-8")
    line = _refused(forge_run(["check", config]), "$")
    assert f"(line 3, column 10 of {str(config)!r})" in line
    assert f"{char!r} (U+{ord(char):04X})" in line and "remove it" in line


def test_a_control_character_in_an_override_is_an_error_at_its_key(forge_config):
    line = _refused(forge_run(["check", forge_config({}), "run.name=a\x00b"]), "$.run.name")
    assert "(line 1, column 2): '\\x00' (U+0000) is a control character" in line


@given(st.from_regex(yaml_reader._PLAIN, fullmatch=True))
def test_the_plain_scalar_shortcut_reads_what_the_parser_reads(text):
    loader = yaml_reader._Loader(text)
    try:
        parsed = loader.get_single_data()
    except ValueError:  # an integer past Python's digit limit: the shortcut refuses it too
        with pytest.raises(ConfigError, match="invalid YAML"):
            yaml_reader.parse_yaml(text, "$")
        return
    finally:
        loader.dispose()
    value = yaml_reader.parse_yaml(text, "$")
    assert type(value) is type(parsed)
    assert value == parsed or (isinstance(value, float) and math.isnan(value) and math.isnan(parsed))


# --- size of the work and of the report ------------------------------------------------


def test_100k_unknown_keys_are_reported_in_a_few_lines(forge_config):
    keys = [f"train.key_{i}=1" for i in range(100_000)]
    result = forge_run(["check", forge_config({}), *keys])
    line = _refused(result, "$.train")
    assert len(result.stderr) < 2_000 and result.stderr.count("\n") == 1
    assert line.count("unknown key ") == MAX_UNKNOWN_SHOWN
    assert f"and {100_000 - MAX_UNKNOWN_SHOWN:,} more unknown keys (keys here: steps, " in line


def test_one_unknown_key_keeps_its_did_you_mean_and_the_keys_here(forge_config):
    line = _refused(forge_run(["check", forge_config({"train": {"lrr": 1}})]), "$.train")
    assert line.startswith("error: $.train: unknown key 'lrr'. Did you mean 'lr'? (keys here: steps, ")
    assert unknown_key("stpes", TrainSection) == "unknown key 'stpes'. Did you mean 'steps'?"


def test_a_report_of_many_problems_is_capped(forge_config):
    bad = [f"no-equals-sign-{i}" for i in range(3 * MAX_REPORTED)]
    result = forge_run(["check", forge_config({}), *bad])
    assert result.code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == MAX_REPORTED + 1
    assert lines[-1] == (
        f"error: and {2 * MAX_REPORTED:,} more problems; fix these first and run `forge-run check` again"
    )


@pytest.mark.parametrize("where", ["logging.loggers", "logging.options"])
def test_thousands_of_unknown_component_names_are_reported_in_a_few_lines(forge_config, where):
    names = [f"logger_{i}" for i in range(3_000)]
    given = f"[{', '.join(names)}]" if where == "logging.loggers" else f"{{{': {}, '.join(names)}: {{}}}}"
    result = forge_run(["check", forge_config({}), f"{where}={given}"])
    assert result.code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == MAX_UNKNOWN_SHOWN + 1 and len(result.stderr) < 3_000
    assert lines[0].startswith("error: $.logging.")
    assert "unknown logger 'logger_0'. Available: console" in lines[0]
    more = 3_000 - MAX_UNKNOWN_SHOWN
    assert lines[-1] == f"error: $.{where}: and {more:,} more logger names that are not registered"


def test_a_file_past_the_value_limit_stops_being_read_at_the_limit(tmp_path, monkeypatch):
    composed = []
    original = yaml_reader._Loader.compose_node

    def counting(self, parent, index):
        composed.append(1)
        return original(self, parent, index)

    monkeypatch.setattr(yaml_reader._Loader, "compose_node", counting)
    monkeypatch.setattr(yaml_reader, "MAX_NODES", 1_000)
    config = tmp_path / "big.yaml"
    config.write_text("train:\n" + "".join(f"  k{i}: 1\n" for i in range(20_000)))
    line = _refused(forge_run(["check", config]), "$")
    assert f"more than the 1,000 values a config may have: is {str(config)!r} the right file?" in line
    assert len(composed) <= 1_002  # not the 40,000 values the file holds


# --- names that become paths and tracker fields -------------------------------------------


@pytest.mark.parametrize(
    "config,path,says",
    [
        ({"run": {"name": "n" * 129}}, "$.run.name", "is 129 characters long, more than the 128"),
        ({"run": {"out_dir": "a/" * 3000}}, "$.run.out_dir", "is 6,000 bytes long, more than the 4,096"),
        ({"run": {"out_dir": "runs/" + "é" * 128}}, "$.run.out_dir", "has a part of 256 bytes"),
        ({"data": {"cache": {"dir": "c" * 300}}}, "$.data.cache.dir", "has a part of 300 bytes"),
        (
            {"data": {"sources": [{"name": "stdlib", "label": "l" * 129}]}},
            "$.data.sources[0].label",
            "is 129 characters long, more than the 128",
        ),
        (
            {"model": {"options": {"init_from_hf": "m" * 256}}},
            "$.model.options.init_from_hf",
            "has a part of 256 bytes",
        ),
        (
            {"data": {"tokenizer": "hf", "tokenizer_options": {"path": "t" * 256}}},
            "$.data.tokenizer_options.path",
            "has a part of 256 bytes",
        ),
        (
            {"logging": {"loggers": ["jsonl"], "options": {"jsonl": {"filename": "f" * 256}}}},
            "$.logging.options.jsonl.filename",
            "has a part of 256 bytes",
        ),
        (
            {"logging": {"options": {"wandb": {"project": "p" * 129}}}},
            "$.logging.options.wandb.project",
            "is 129 characters long, more than the 128",
        ),
        (
            {"logging": {"options": {"mlflow": {"run_name": "r" * 129}}}},
            "$.logging.options.mlflow.run_name",
            "is 129 characters long, more than the 128",
        ),
        (
            {"logging": {"options": {"wandb": {"tags": ["t" * 65]}}}},
            "$.logging.options.wandb.tags",
            "must be a list of strings of 1 to 64 characters",
        ),
        (
            {"logging": {"options": {"mlflow": {"tags": {"k": "v" * 5001}}}}},
            "$.logging.options.mlflow.tags",
            "values of at most 5,000",
        ),
    ],
)
def test_a_name_too_long_for_its_file_system_or_tracker_is_refused(forge_config, config, path, says):
    line = _refused(forge_run(["check", forge_config(config)]), path)
    assert says in line
    assert len(line) < 400  # the value itself is clipped


def test_a_5_mb_run_name_is_refused_with_its_length_and_the_limit(forge_config):
    line = _refused(forge_run(["check", forge_config({}), "run.name=" + "n" * 5_000_000]), "$.run.name")
    assert "is 5,000,000 characters long, more than the 128 it may have: shorten it" in line
    assert len(line) < 300


def test_names_at_their_limits_pass(forge_config, tmp_path):
    config = {
        "run": {"name": "n" * 128, "out_dir": str(tmp_path / ("o" * 255))},
        "data": {"sources": [{"name": "stdlib", "label": "l" * 128}], "cache": {"dir": "c" * 255}},
        "logging": {
            "loggers": ["jsonl"],
            "options": {
                "jsonl": {"filename": "f" * 255},
                "wandb": {"project": "p" * 128, "tags": ["t" * 64]},
                "mlflow": {"run_name": "r" * 128, "tags": {"k" * 250: "v" * 5000}},
            },
        },
    }
    result = forge_run(["check", forge_config(config)])
    assert result.code == 0, result.stdout + result.stderr
