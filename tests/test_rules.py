"""The rule engine and the kernel's rules, the founding rule above all: a strategy that
declares it does not carry per-token metadata to every layer is refused with a packer
that isolates documents, through capabilities. Pipeline parallelism carries it (every
stage gets its microbatch's doc_ids and positions), so it passes; a third-party
strategy that forwards nothing is refused."""

from __future__ import annotations

import json
import os

import attrs
import pytest
from conftest import make_distribution, only_plugins

from forge_core.api import PackerSpec, ParallelismSpec, Plan, Rule, hookimpl
from forge_core.cli.report import render
from forge_core.config.schema import ForgeConfig
from forge_core.judge import judge
from forge_core.registry import RuleEntry
from forge_core.rules import evaluate
from forge_core.testing import forge_run


def errors(path, overrides=(), world_size=None, extra=()):
    result = judge(path, list(overrides), world_size, extra_plugins=tuple(extra))
    return {v.rule_id: v for v in result.errors}, result


LOSSY_REASON = "It re-lays activations out by token order and leaves the per-token metadata behind."


class _LossyWrapper:
    """A third-party strategy without a mesh degree (switched on by parallel.wrappers)
    that declares it forwards no per-token metadata."""

    @hookimpl
    def forge_parallelisms(self):
        return [
            ParallelismSpec(
                name="lossy",
                summary="a wrapper that drops metadata",
                impl="x.y:Z",
                mesh_dim=None,
                order=350,
                forwards=frozenset(),
                drops_metadata_because=LOSSY_REASON,
            )
        ]


def test_founding_rule_refuses_a_strategy_that_drops_metadata_with_an_isolating_packer(
    forge_config, builtins_only
):
    path = forge_config({"data": {"packer": "concat"}, "parallel": {"wrappers": ["lossy"]}})
    found, result = errors(path, extra=[("lossyplug", _LossyWrapper())])
    violation = found["parallel.metadata-reaches-layers"]
    assert "strategy 'lossy' does not forward them to every layer" in violation.message
    assert LOSSY_REASON in violation.message and "-100" in violation.message
    assert "or switch off 'lossy', which drops them" in violation.fix
    fields = dict(violation.fields)
    assert fields["data.packer"] == "concat"
    report = render(result.violations)
    assert "$.data.packer = 'concat'" in report


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.pp=2", "data.packer=concat"],
        ["parallel.pp=2", "data.packer=bfd"],
        ["parallel.pp=2", "data.packer=none"],
        ["parallel.pp=1", "data.packer=concat"],
    ],
)
def test_founding_rule_lets_pipeline_parallelism_carry_packed_documents(forge_config, overrides):
    found, _ = errors(forge_config({}), overrides, world_size=int(overrides[0][-1]))
    assert "parallel.metadata-reaches-layers" not in found


@pytest.mark.parametrize(
    "packer", [["data.packer=none"], ["data.packer=concat", "data.packer_options.isolate=false"]]
)
def test_founding_rule_accepts_a_lossy_strategy_without_document_isolation(
    forge_config, packer, builtins_only
):
    path = forge_config({"parallel": {"wrappers": ["lossy"]}})
    found, _ = errors(path, packer, extra=[("lossyplug", _LossyWrapper())])
    assert "parallel.metadata-reaches-layers" not in found


class _ThirdPartyPacker:
    """A name of its own: the example package registers a ``greedy`` packer."""

    @hookimpl
    def forge_packers(self):
        return [PackerSpec(name="doc_id_packer", summary="third-party", impl="x.y:Z", emits={"doc_ids"})]


def test_third_party_packer_emitting_doc_ids_is_caught(forge_config, builtins_only):
    path = forge_config({"data": {"packer": "doc_id_packer"}, "parallel": {"wrappers": ["lossy"]}})
    found, _ = errors(path, extra=[("thirdparty", _ThirdPartyPacker()), ("lossyplug", _LossyWrapper())])
    assert "emits doc_ids" in found["parallel.metadata-reaches-layers"].message


def test_world_size_rule(forge_config):
    found, _ = errors(forge_config({"parallel": {"tp": 2, "dp_shard": 2}}), world_size=2)
    assert (
        "pp=1 * dp_replicate=1 * dp_shard=2 * ep=1 * cp=1 * tp=2 = 4 processes, but the world size is 2"
        in found["parallel.world-size"].message
    )
    found, result = errors(forge_config({"parallel": {"tp": 2, "dp_shard": -1}}), world_size=8)
    assert "parallel.world-size" not in found and result.plan.degrees["dp_shard"] == 4
    found, _ = errors(forge_config({"parallel": {"tp": 3, "dp_shard": -1}}), world_size=8)
    assert "not divisible" in found["parallel.world-size"].message


def test_world_size_fix_offers_dp_shard_minus_one_only_where_it_helps(forge_config):
    # dp_shard fixed at 2, and tp=2 divides the 2 processes: -1 would resolve to 1.
    found, _ = errors(forge_config({"parallel": {"tp": 2, "dp_shard": 2}}), world_size=2)
    fix = found["parallel.world-size"].fix
    assert "Set parallel.dp_shard: -1" in fix and "(1 here)" in fix and "launch 4 processes" in fix
    # dp_shard is -1 already: the fix must not tell the user to set it.
    found, _ = errors(forge_config({"parallel": {"tp": 3, "dp_shard": -1}}), world_size=8)
    fix = found["parallel.world-size"].fix
    assert "dp_shard: -1" not in fix and "multiple of pp*dp_replicate*ep*cp*tp = 3 processes" in fix
    # dp_shard fixed, and tp=3 does not divide 8: -1 would not resolve, so it is not offered.
    found, _ = errors(forge_config({"parallel": {"tp": 3, "dp_shard": 2}}), world_size=8)
    fix = found["parallel.world-size"].fix
    assert fix.startswith("Launch 6 processes") and "would not resolve" in fix


def test_a_rule_fix_for_the_plan_replaces_its_fix_and_its_failure_is_reported():
    plan = Plan(config=ForgeConfig(), specs={})
    tailored = Rule(
        id="t.tailored",
        severity="error",
        paths=(),
        summary="s",
        check=lambda ctx: "bad",
        fix="general",
        fix_for=lambda ctx: f"tailored to {ctx.config.train.steps} steps",
    )
    broken = attrs.evolve(tailored, id="t.broken", fix_for=lambda ctx: 1 / 0)
    quiet = attrs.evolve(tailored, id="t.quiet", check=lambda ctx: None, fix_for=lambda ctx: 1 / 0)
    found = {
        v.rule_id: v
        for v in evaluate([RuleEntry(rule=r, plugin="p") for r in (tailored, broken, quiet)], plan)
    }
    assert found["t.tailored"].fix == f"tailored to {ForgeConfig().train.steps} steps"
    assert "the rule itself failed: ZeroDivisionError" in found["t.broken"].message
    assert "t.quiet" not in found


def test_seq_len_within_model_maximum(forge_config):
    found, _ = errors(forge_config({"data": {"seq_len": 4096}, "model": {"options": {"max_seq_len": 2048}}}))
    assert "exceeds the model's maximum" in found["model.seq-len"].message


def test_engine_reports_every_violation_and_survives_a_crashing_rule():
    def boom(ctx):
        raise ZeroDivisionError("bad rule")

    rules = [
        RuleEntry(Rule("a.one", "error", ("train.lr",), "s", lambda ctx: ["m1", "m2"], "f"), "p1"),
        RuleEntry(Rule("a.two", "warning", ("train.steps",), "s", lambda ctx: "w", "f"), "p2"),
        RuleEntry(Rule("a.three", "error", (), "s", boom, "f"), "p3"),
        RuleEntry(Rule("a.four", "error", (), "s", lambda ctx: None, "f"), "p4"),
    ]
    violations = evaluate(rules, Plan(ForgeConfig(), {}))
    assert [(v.rule_id, v.severity, v.plugin) for v in violations] == [
        ("a.one", "error", "p1"),
        ("a.one", "error", "p1"),
        ("a.two", "warning", "p2"),
        ("a.three", "error", "p3"),
    ]
    assert "ZeroDivisionError: bad rule" in violations[-1].message
    assert dict(violations[0].fields) == {"train.lr": 3e-4}


LOSSY_PLUGIN = """
from forge_core.api import ParallelismSpec, hookimpl

@hookimpl
def forge_parallelisms():
    return [ParallelismSpec(name="lossy", summary="drops metadata", impl="x.y:Z", mesh_dim=None,
                            order=350, forwards=frozenset(), drops_metadata_because="It drops them.")]
"""


def test_check_cli_reports_founding_rule_with_exit_2(tmp_path, forge_config):
    site = make_distribution(
        tmp_path / "site", "forge-lossy", "1.0", {"lossyplug": LOSSY_PLUGIN}, {"lossy": "lossyplug"}
    )
    result = forge_run(
        ["check", forge_config({"data": {"packer": "concat"}}), "parallel.wrappers=[lossy]"],
        paths=[site],
        env=only_plugins("lossy"),
    )
    assert result.code == 2
    assert "[parallel.metadata-reaches-layers]" in result.stdout and "strategy 'lossy'" in result.stdout
    result = forge_run(
        [
            "check",
            forge_config({"data": {"packer": "concat"}}),
            "parallel.pp=2",
            "--world-size",
            "2",
            "--json",
        ]
    )
    assert result.code == 0, result.stdout
    assert json.loads(result.stdout)["valid"] is True


def test_world_size_comes_from_torchrun_environment(forge_config):
    result = forge_run(
        ["check", forge_config({"parallel": {"tp": 2, "dp_shard": 1}})], env={"WORLD_SIZE": "4"}
    )
    assert result.code == 2 and "world size is 4" in result.stdout


def test_third_party_rule_is_listed_and_fires(tmp_path, forge_config):
    site = make_distribution(
        tmp_path / "site",
        "forge-strict",
        "2.0",
        {
            "strictplug": """
from forge_core.api import Rule, hookimpl

def _check(ctx):
    if ctx.config.train.steps > 1000:
        return f"{ctx.config.train.steps} steps is more than this lab allows"

@hookimpl
def forge_rules():
    return [Rule(id="lab.max-steps", severity="error", paths=("train.steps",),
                 summary="At most 1000 steps", check=_check, fix="Lower train.steps")]
"""
        },
        {"strict": "strictplug"},
    )
    env = only_plugins("strict")
    listed = {r["id"]: r for r in json.loads(forge_run(["rules", "--json"], paths=[site], env=env).stdout)}
    assert listed["lab.max-steps"]["plugin"] == "strict"
    result = forge_run(["check", forge_config({"train": {"steps": 5000}})], paths=[site], env=env)
    assert result.code == 2 and "[lab.max-steps] (plugin 'strict')" in result.stdout


class _PlainModel:
    @hookimpl
    def forge_models(self):
        from forge_core.api import ModelSpec

        return [ModelSpec(name="plain", summary="takes no metadata", impl="x.y:Z", max_seq_len_option=None)]


def test_model_must_accept_what_the_packer_emits(forge_config):
    path = forge_config({"model": {"name": "plain"}, "data": {"packer": "concat"}})
    found, _ = errors(path, extra=[("plainmodel", _PlainModel())])
    assert (
        "emits doc_ids, positions, which model 'plain' does not take"
        in found["model.accepts-metadata"].message
    )
    found, _ = errors(path, ["data.packer=none"], extra=[("plainmodel", _PlainModel())])
    assert "model.accepts-metadata" not in found


# --- what check sees of the file system, as rules (the same functions the build runs) ---


def rule_errors(path, overrides=()):
    return {v.rule_id: v.message for v in judge(path, list(overrides)).errors}


def test_run_directory_must_be_creatable(forge_config, tmp_path):
    (tmp_path / "a-file").write_text("x")
    found = rule_errors(forge_config({"run": {"out_dir": str(tmp_path / "a-file")}}))
    assert "exists and is not a directory" in found["run.out-dir"]
    found = rule_errors(forge_config({"run": {"out_dir": str(tmp_path / "a-file" / "run")}}))
    assert "cannot be created" in found["run.out-dir"] and "is a file" in found["run.out-dir"]
    assert "run.out-dir" not in rule_errors(forge_config({"run": {"out_dir": str(tmp_path / "new" / "run")}}))


def test_run_directory_must_be_writable(forge_config, tmp_path, monkeypatch):
    import forge_core.api.files

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    # Root may write anywhere, so the permission answer is the operating system's, faked.
    monkeypatch.setattr(forge_core.api.files.os, "access", lambda p, mode: os.fspath(p) != str(locked))
    found = rule_errors(forge_config({"run": {"out_dir": str(locked / "run")}}))
    assert (
        "cannot be created: " in found["run.out-dir"]
        and "is not writable by this user" in found["run.out-dir"]
    )
    found = rule_errors(forge_config({"run": {"out_dir": str(locked)}}))
    assert found["run.out-dir"] == f"run.out_dir {str(locked)!r} is not writable by this user"


def test_text_and_stdlib_sources_are_checked_without_reading_documents(forge_config, tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "empty.txt").write_text("")
    text = {"data": {"source": "text", "source_options": {"paths": [str(tmp_path / "*.md")]}}}
    assert "matches no file" in rule_errors(forge_config(text))["text.files-exist"]
    text["data"]["source_options"]["paths"] = [str(tmp_path)]
    assert "is a directory" in rule_errors(forge_config(text))["text.files-exist"]
    text["data"]["source_options"]["paths"] = [str(tmp_path / "empty.txt")]
    assert "file is empty" in rule_errors(forge_config(text))["text.files-exist"]
    text["data"]["source_options"]["paths"] = []
    assert "paths is empty" in rule_errors(forge_config(text))["text.files-exist"]
    text["data"]["source_options"]["paths"] = [str(tmp_path / "a.txt")]
    assert "text.files-exist" not in rule_errors(forge_config(text))
    found = rule_errors(forge_config({"data": {"source_options": {"max_bytes": 1}}}))
    assert "no file selected" in found["stdlib.files-selected"]


def test_shard_directories_are_checked_from_their_index(forge_config, tmp_path):
    from forge_core.api.files import temporary_dir
    from forge_core.data.shards import ShardWriter

    def shards(path):
        return forge_config({"data": {"source": "shards", "source_options": {"path": str(path)}}})

    assert "path is empty" in rule_errors(shards(""))["shards.directory"]
    assert "no such shard directory" in rule_errors(shards(tmp_path / "none"))["shards.directory"]
    temporary_dir(tmp_path / "cut")
    assert "was interrupted" in rule_errors(shards(tmp_path / "cut"))["shards.directory"]
    (tmp_path / "half").mkdir()
    assert "index.json: missing" in rule_errors(shards(tmp_path / "half"))["shards.directory"]
    writer = ShardWriter(
        tmp_path / "good", {"identity": "hf:abc:eos=0:pad=0", "vocab_size": 300, "eos_id": 0, "pad_id": 0}
    )
    import numpy as np

    writer.add([np.arange(5)], np.zeros(1, np.uint64))
    writer.commit("test")
    path = shards(tmp_path / "good")
    assert (
        "tokenized with the 'hf' tokenizer, but data.tokenizer is 'byte'"
        in rule_errors(path)["shards.directory"]
    )
    (tmp_path / "good" / "tokens.bin").write_bytes(b"\0" * 3)
    assert "The shard is damaged" in rule_errors(path)["shards.directory"]


def test_an_hf_tokenizer_folder_must_hold_a_tokenizer(forge_config, tmp_path):
    def hf(path):
        return forge_config({"data": {"tokenizer": "hf", "tokenizer_options": {"path": str(path)}}})

    (tmp_path / "empty").mkdir()
    message = rule_errors(hf(tmp_path / "empty"))["hf.tokenizer-files"]
    assert "holds no tokenizer files (found: nothing)" in message
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README.md").write_text("x")
    assert "(found: README.md)" in rule_errors(hf(tmp_path / "other"))["hf.tokenizer-files"]
    assert "does not exist" in rule_errors(hf(tmp_path / "none"))["hf.tokenizer-files"]
    assert "path is empty" in rule_errors(hf(""))["hf.tokenizer-files"]
    (tmp_path / "other" / "tokenizer.json").write_text("{}")
    assert "hf.tokenizer-files" not in rule_errors(hf(tmp_path / "other"))


def test_init_from_hf_lists_every_mismatch_with_both_values(forge_config, tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 3,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "intermediate_size": 256,
                "vocab_size": 300,
                "rms_norm_eps": 1e-6,
            }
        )
    )
    # Options left unset are read from config.json; only those given explicitly can differ.
    unset = judge(forge_config({"model": {"options": {"init_from_hf": str(tmp_path)}}}))
    assert unset.config.model.options.dim == 64 and unset.config.model.options.n_layers == 3
    assert not [v for v in unset.errors if v.rule_id == "llama.init-from-hf" and "model.options" in v.message]
    path = forge_config(
        {
            "model": {
                "options": {
                    "init_from_hf": str(tmp_path),
                    "dim": 256,
                    "n_layers": 4,
                    "norm_eps": 1e-5,
                    "n_heads": 8,
                }
            }
        }
    )
    result = judge(path)
    messages = [v.message for v in result.errors if v.rule_id == "llama.init-from-hf"]
    fix = "from model.options to take the checkpoint's value"
    assert f"model.options.dim=256 but config.json hidden_size=64: remove dim {fix}" in " ".join(messages)
    assert any(m.startswith("model.options.n_layers=4 but config.json num_hidden_layers=3") for m in messages)
    assert any(
        m.startswith("model.options.norm_eps=1e-05 but config.json rms_norm_eps=1e-06") for m in messages
    )
    assert not any("n_heads" in m for m in messages)  # given, but equal to the checkpoint's
    (tmp_path / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in rule_errors(path)["llama.init-from-hf"]


def test_logger_outputs_and_sgd_nesterov_are_checked(forge_config, tmp_path):
    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)
    found = rule_errors(forge_config({"run": {"out_dir": str(tmp_path / "run")}}))
    assert "exists and is not a file" in found["loggers.output-paths"]
    found = rule_errors(
        forge_config(
            {"train": {"optimizer": "sgd", "optimizer_options": {"momentum": 0.0, "nesterov": True}}}
        )
    )
    assert "Nesterov momentum needs a momentum above 0" in found["sgd.nesterov-momentum"]
