"""The parallelism strategies' specs and rules, judged without torch: each rule fires on
the config it describes and stays silent on its neighbours."""

from __future__ import annotations

import pytest

from forge_core.cli.report import render
from forge_core.config.errors import ConfigError
from forge_core.judge import judge
from forge_core.parallel_dims import active_strategies
from forge_plugins.parallel import rules as R
from forge_plugins.parallel.split import SCHEDULES, rank_of_stage, stage_layer_ranges, stages_of_rank

MODEL = {"name": "llama", "options": {"dim": 64, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4}}


def interleaved(microbatches: int) -> dict:
    """parallel.* for interleaved 1F1B with two stages per rank."""
    return {
        "options": {"pp": {"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": microbatches}}
    }


def violations(cfg, parallel=None, world_size=None, **sections):
    # Explicit degrees (dp_shard 1 unless given): these rules judge a layout, not a launch.
    # (a copy of MODEL: a test passing model=... must not change it for the tests after)
    data = {
        "model": dict(MODEL),
        "data": {"packer": "none", "seq_len": 64},
        "parallel": {"dp_shard": 1, **(parallel or {})},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    result = judge(cfg(data), [], world_size)
    found: dict[str, list] = {}
    for v in result.violations:
        found.setdefault(v.rule_id, []).append(v)
    return found, result


def messages(found, rule_id):
    return [v.message for v in found.get(rule_id, [])]


# --- specs ---------------------------------------------------------------------------


def test_specs_declare_mesh_dims_orders_and_capabilities():
    from forge_plugins.parallel.plugin import forge_parallelisms

    specs = {s.name: s for s in forge_parallelisms()}
    assert {n: (s.mesh_dim, s.order) for n, s in specs.items()} == {
        "pp": ("pp", 100),
        "tp": ("tp", 200),
        "act_ckpt": (None, 250),
        "compile": (None, 300),
        "fsdp": ("dp_shard", 400),
        "ddp": ("dp_replicate", 400),
    }
    assert specs["act_ckpt"].requires == {"blocks"}
    # The pipeline hands every stage its microbatch's metadata: it declares so, and drops nothing.
    assert specs["pp"].forwards == {"doc_ids", "positions"} and not specs["pp"].drops_metadata_because
    assert all(specs[n].forwards is None for n in ("tp", "act_ckpt", "compile", "fsdp", "ddp"))
    assert specs["compile"].enabled_by == "train.compile"  # and by name in parallel.wrappers
    assert specs["ddp"].yields_to == ("fsdp",)


def test_active_strategies_in_application_order_and_hsdp_takes_over_ddp():
    from forge_core.registry import load_registries

    registry = load_registries()["parallelism"]
    everything = {"pp": 2, "dp_replicate": 2, "dp_shard": 2, "tp": 2}
    assert [s.name for s in active_strategies(registry, everything, [])] == ["pp", "tp", "fsdp"]
    replicas = {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1}
    assert [s.name for s in active_strategies(registry, replicas, [])] == ["ddp"]


# --- layer split -------------------------------------------------------------------------


def test_layers_split_evenly_with_the_remainder_on_the_first_stages():
    assert [len(r) for r in stage_layer_ranges(10, 4)] == [3, 3, 2, 2]
    assert [list(r) for r in stage_layer_ranges(4, 2)] == [[0, 1], [2, 3]]
    ranges = stage_layer_ranges(7, 7)
    assert [list(r) for r in ranges] == [[i] for i in range(7)]
    with pytest.raises(ValueError, match="at least one layer"):
        stage_layer_ranges(3, 4)


def test_interleaved_stages_loop_over_ranks():
    assert stages_of_rank(0, 2, 2) == [0, 2]
    assert stages_of_rank(1, 2, 2) == [1, 3]
    assert stages_of_rank(3, 4, 1) == [3]


def test_v_schedules_put_the_first_and_the_last_stage_on_rank_0():
    for schedule in ("zbv_zero_bubble", "dualpipev"):
        assert [stages_of_rank(r, 4, 2, schedule) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
        assert rank_of_stage(7, 4, schedule) == 0 and rank_of_stage(4, 4, schedule) == 3
    assert rank_of_stage(7, 4, "interleaved_1f1b") == 3


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_rank_of_stage_inverts_stages_of_rank(schedule):
    virtual = 1 if schedule in ("gpipe", "1f1b") else 2
    for pp in (2, 3, 4):
        held = {s: r for r in range(pp) for s in stages_of_rank(r, pp, virtual, schedule)}
        assert sorted(held) == list(range(pp * virtual))
        assert all(rank_of_stage(s, pp, schedule) == r for s, r in held.items())


# --- rules -----------------------------------------------------------------------------


def test_tp_must_divide_heads_and_kv_heads(forge_config):
    found, _ = violations(forge_config, {"tp": 8, "dp_shard": 1})
    (message,) = messages(found, R.TP_HEADS)
    assert "model 'llama' has 4 key/value heads, not divisible by parallel.tp = 8" in message
    found, _ = violations(forge_config, {"tp": 3})
    assert len(messages(found, R.TP_HEADS)) == 2
    found, _ = violations(forge_config, {"tp": 4})
    assert R.TP_HEADS not in found


def test_pp_stages_not_above_layers(forge_config):
    found, _ = violations(forge_config, {"pp": 4, **interleaved(microbatches=4)}, train={"batch_size": 8})
    assert "model 'llama' has 4 layers, fewer than the 8 pipeline stages" in messages(found, R.PP_LAYERS)[0]
    found, _ = violations(forge_config, {"pp": 2, **interleaved(microbatches=4)}, train={"batch_size": 8})
    assert R.PP_LAYERS not in found and R.PP_SCHEDULE not in found and R.PP_MICROBATCHES not in found


def test_batch_splits_into_pipeline_microbatches(forge_config):
    found, _ = violations(
        forge_config, {"pp": 2, "options": {"pp": {"microbatches": 3}}}, train={"batch_size": 8}
    )
    assert "= 8 rows, which do not split into 3 equal microbatches" in messages(found, R.PP_MICROBATCHES)[0]
    # With data parallelism and accumulation the pipeline sees 16 / (2 * 2) = 4 rows.
    found, _ = violations(
        forge_config,
        {"pp": 2, "dp_shard": 2, "options": {"pp": {"microbatches": 8}}},
        train={"batch_size": 16, "grad_accum": 2},
    )
    assert "= 4 rows" in messages(found, R.PP_MICROBATCHES)[0]
    found, _ = violations(
        forge_config,
        {"pp": 2, "dp_shard": 2, "options": {"pp": {"microbatches": 4}}},
        train={"batch_size": 16, "grad_accum": 2},
    )
    assert R.PP_MICROBATCHES not in found
    # 0 means one microbatch per stage.
    found, _ = violations(forge_config, {"pp": 2}, train={"batch_size": 6})
    assert R.PP_MICROBATCHES not in found


def test_schedules_microbatch_constraints(forge_config):
    found, _ = violations(
        forge_config,
        {"pp": 4, "options": {"pp": {"schedule": "1f1b", "microbatches": 2}}},
        train={"batch_size": 8},
    )
    assert "at least one microbatch per stage" in messages(found, R.PP_MICROBATCHES)[0]
    found, _ = violations(
        forge_config,
        {"pp": 4, "options": {"pp": {"schedule": "gpipe", "microbatches": 2}}},
        train={"batch_size": 8},
    )
    assert R.PP_MICROBATCHES not in found
    found, _ = violations(forge_config, {"pp": 2, **interleaved(microbatches=5)}, train={"batch_size": 10})
    assert "do not split into 2 equal rounds" in messages(found, R.PP_MICROBATCHES)[0]
    zero_bubble = {"schedule": "interleaved_zero_bubble", "virtual_stages": 2, "microbatches": 5}
    found, _ = violations(forge_config, {"pp": 2, "options": {"pp": zero_bubble}}, train={"batch_size": 10})
    assert "interleaved_zero_bubble runs microbatches in rounds" in messages(found, R.PP_MICROBATCHES)[0]
    # dualpipev: one microbatch per stage at least (2 x pp); zbv, looped_bfs: any count
    for schedule, count, refused in (
        ("dualpipev", 3, True),
        ("dualpipev", 4, False),
        ("zbv_zero_bubble", 1, False),
        ("looped_bfs", 1, False),
    ):
        options = {"schedule": schedule, "virtual_stages": 2, "microbatches": count}
        found, _ = violations(forge_config, {"pp": 2, "options": {"pp": options}}, train={"batch_size": 12})
        assert (R.PP_MICROBATCHES in found) == refused, (schedule, count)
    found, _ = violations(
        forge_config,
        {"pp": 2, "options": {"pp": {"schedule": "dualpipev", "virtual_stages": 2, "microbatches": 3}}},
        train={"batch_size": 12},
    )
    assert (
        "dualpipev schedule needs at least one microbatch per stage: 3 microbatches for its 4 stages"
        in messages(found, R.PP_MICROBATCHES)[0]
    )
    # A negative count is refused by the schema itself, at its field.
    with pytest.raises(
        ConfigError, match=r"\$\.parallel\.options\.pp\.microbatches: must be at least 0, got -1"
    ):
        violations(forge_config, {"pp": 2, "options": {"pp": {"microbatches": -1}}})


def test_tied_embeddings_refused_under_pp(forge_config):
    tied = {"model": {"options": {**MODEL["options"], "tie_embeddings": True}}}
    found, _ = violations(forge_config, {"pp": 2}, **tied)
    assert "shared matrix" in messages(found, R.PP_TIED)[0]
    found, _ = violations(forge_config, {"pp": 1}, **tied)
    assert R.PP_TIED not in found


@pytest.mark.parametrize(
    ("schedule", "virtual", "refused"),
    [
        ("gpipe", 1, False),
        ("1f1b", 2, True),
        ("interleaved_1f1b", 1, True),
        ("interleaved_1f1b", 3, False),
        ("looped_bfs", 1, True),
        ("interleaved_zero_bubble", 2, False),
        ("zbv_zero_bubble", 2, False),
        ("zbv_zero_bubble", 3, True),
        ("dualpipev", 1, True),
    ],
)
def test_each_schedule_runs_its_stages_per_rank(forge_config, schedule, virtual, refused):
    options = {"schedule": schedule, "virtual_stages": virtual, "microbatches": 12}
    found, _ = violations(
        forge_config,
        {"pp": 2, "options": {"pp": options}},
        train={"batch_size": 12},
        model={"options": {**MODEL["options"], "n_layers": 6}},
    )
    assert (R.PP_SCHEDULE in found) == refused
    if refused:
        assert (
            f"schedule = {schedule!r} with parallel.options.pp.virtual_stages = {virtual}"
            in messages(found, R.PP_SCHEDULE)[0]
        )


def test_virtual_stages_rules_need_a_pipeline(forge_config):
    with pytest.raises(
        ConfigError, match=r"\$\.parallel\.options\.pp\.virtual_stages: must be at least 1, got 0"
    ):
        violations(forge_config, {"options": {"pp": {"virtual_stages": 0}}})
    found, _ = violations(forge_config, {"pp": 1, "options": {"pp": {"schedule": "interleaved_1f1b"}}})
    assert R.PP_SCHEDULE not in found  # no pipeline: the schedule is unused


@pytest.mark.parametrize("schedule", ["interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev"])
def test_split_backward_schedules_refuse_compile_and_fsdp_resharding(forge_config, schedule):
    pp = {"schedule": schedule, "virtual_stages": 2, "microbatches": 4}
    found, _ = violations(
        forge_config, {"pp": 2, "options": {"pp": pp}}, train={"batch_size": 8, "compile": True}
    )
    assert "donated buffers" in messages(found, R.PP_SPLIT_BACKWARD_COMPILE)[0]
    found, _ = violations(
        forge_config, {"pp": 2, "dp_shard": 2, "options": {"pp": pp}}, train={"batch_size": 16}
    )
    assert "reshard_after_forward: true" in messages(found, R.PP_SPLIT_BACKWARD_RESHARD)[0]
    found, _ = violations(
        forge_config,
        {"pp": 2, "dp_shard": 2, "options": {"pp": pp, "fsdp": {"reshard_after_forward": False}}},
        train={"batch_size": 16},
    )
    assert R.PP_SPLIT_BACKWARD_RESHARD not in found and R.PP_SPLIT_BACKWARD_COMPILE not in found


def test_schedules_without_split_backward_take_compile_and_resharding(forge_config):
    found, _ = violations(
        forge_config,
        {"pp": 2, "dp_shard": 2, "options": {"pp": {"schedule": "1f1b"}}},
        train={"batch_size": 16, "compile": True},
    )
    assert not ({R.PP_SPLIT_BACKWARD_RESHARD, R.PP_SPLIT_BACKWARD_COMPILE} & set(found))


def test_sequence_parallel_rules(forge_config):
    found, result = violations(forge_config, {"options": {"tp": {"sequence_parallel": True}}})
    assert [v.severity for v in found[R.TP_SEQUENCE_PARALLEL_NO_TP]] == ["warning"] and not result.errors
    found, _ = violations(
        forge_config, {"tp": 2, "options": {"tp": {"sequence_parallel": True}}}, data={"seq_len": 63}
    )
    assert "seq_len = 63 is not divisible by parallel.tp = 2" in messages(found, R.TP_SEQUENCE_PARALLEL)[0]
    found, _ = violations(forge_config, {"tp": 2, "options": {"tp": {"sequence_parallel": True}}})
    assert not ({R.TP_SEQUENCE_PARALLEL, R.TP_SEQUENCE_PARALLEL_NO_TP, R.PP_SEQUENCE_PARALLEL} & set(found))
    found, _ = violations(forge_config, {"tp": 2, "pp": 2, "options": {"tp": {"sequence_parallel": True}}})
    assert R.PP_SEQUENCE_PARALLEL in found


def test_ddp_is_not_combined_with_tp_but_fsdp_is(forge_config):
    found, _ = violations(forge_config, {"dp_replicate": 2, "tp": 2})
    assert "DistributedDataParallel" in messages(found, R.DDP_WITH_TP)[0]
    found, _ = violations(forge_config, {"dp_replicate": 2, "dp_shard": 2, "tp": 2})
    assert R.DDP_WITH_TP not in found


def test_pipeline_passes_the_founding_rule_with_packed_documents(forge_config):
    found, _ = violations(forge_config, {"pp": 2}, data={"packer": "concat"})
    assert "parallel.metadata-reaches-layers" not in found


def test_reports_name_the_parallel_plugin(forge_config):
    _, result = violations(forge_config, {"tp": 3, "pp": 8})
    report = render(result.errors)
    assert "[tp.heads-divisible] (plugin 'parallel')" in report
    assert "[pp.layers] (plugin 'parallel')" in report
    assert "$.parallel.tp = 3" in report


@pytest.mark.parametrize("config, world", [("configs/pipeline.yaml", 2), ("configs/fsdp-tp.yaml", 4)])
def test_shipped_parallel_configs_are_valid(config, world):
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / config
    result = judge(str(path), [], world)
    assert not result.errors, render(result.errors)


# --- composition with activation checkpointing and compile -------------------------------


def test_tensor_parallelism_with_compiled_blocks_is_refused(forge_config):
    from forge_plugins.parallel.composition_rules import TP_COMPILE

    found, _ = violations(forge_config, {"tp": 2}, train={"compile": True})
    assert len(messages(found, TP_COMPILE)) == 1 and "_local_tensor" in messages(found, TP_COMPILE)[0]
    # compile named as a wrapper is the same switch: the rule reads the plan, not one key.
    found, _ = violations(forge_config, {"tp": 2, "wrappers": ["compile"]})
    assert len(messages(found, TP_COMPILE)) == 1
    for parallel, train in (
        ({"tp": 2}, {}),
        ({"dp_shard": 2}, {"compile": True}),
        ({"tp": 2, "wrappers": ["act_ckpt"]}, {}),
    ):
        found, _ = violations(forge_config, parallel, train=train)
        assert TP_COMPILE not in found, (parallel, train)


@pytest.mark.parametrize(
    ("parallel", "every", "warned"),
    [
        ({}, 4, False),
        ({}, 5, True),  # 4 blocks in one part
        ({"pp": 2}, 2, False),
        ({"pp": 2}, 3, True),  # 2 blocks a stage
        ({"pp": 2, **interleaved(2)}, 2, True),  # 1 block a stage
    ],
)
def test_checkpointing_every_k_th_block_warns_when_no_part_has_k_blocks(
    forge_config, parallel, every, warned
):
    from forge_plugins.parallel.composition_rules import ACT_CKPT_EVERY

    options = {**parallel.get("options", {}), "act_ckpt": {"every": every}}
    found, result = violations(
        forge_config, {**parallel, "wrappers": ["act_ckpt"], "options": options}, train={"batch_size": 8}
    )
    assert (ACT_CKPT_EVERY in found) is warned, render(result.violations)
    if warned:
        assert f"every = {every}" in messages(found, ACT_CKPT_EVERY)[0]
    found, _ = violations(forge_config, {**parallel, "options": options}, train={"batch_size": 8})
    assert ACT_CKPT_EVERY not in found  # the wrapper is off: its options mean nothing
