"""Mesh dimensions are declared by strategies: a third-party dimension gets its degree
key, validation, world-size arithmetic and activation exactly like the built-ins', and a
declaration that cannot hold is refused naming its plugin."""

from __future__ import annotations

import types

import pytest
import yaml

from forge_core.api import ForgeError, MeshDim, NoOptions, ParallelismSpec, hookimpl
from forge_core.config.errors import ConfigError
from forge_core.config.loader import to_plain
from forge_core.judge import judge
from forge_core.registry import load_registries

BASE = {
    "model": {"name": "llama", "options": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}},
    "data": {"packer": "none", "seq_len": 32},
}


def plugin(*specs: ParallelismSpec) -> tuple[str, object]:
    module = types.SimpleNamespace(forge_parallelisms=hookimpl(lambda: list(specs)))
    return ("third_party_dims", module)


def expert(**dim) -> ParallelismSpec:
    """A third-party dimension ``zp`` (the built-in ``ep`` is declared the same way)."""
    dim = {"name": "zp", "place": 450, "summary": "A third-party degree.", **dim}
    return ParallelismSpec(
        name="zp",
        summary="something over parallel.zp ranks",
        impl="forge_core.api:NoOptions",
        options=NoOptions,
        mesh_dim=dim["name"],
        dim=MeshDim(**dim),
    )


def attrs_evolve_mesh_dim(name: str) -> ParallelismSpec:
    import attrs

    return attrs.evolve(expert(), mesh_dim=name)


def judged(tmp_path, parallel, world_size=None, extra=()):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "parallel": parallel}))
    return judge(str(path), [], world_size=world_size, extra_plugins=tuple(extra))


def test_a_third_party_dimension_is_a_degree_key_in_mesh_order(tmp_path):
    result = judged(tmp_path, {"zp": 2}, world_size=8, extra=[plugin(expert())])
    plan = result.plan
    assert list(plan.degrees) == ["pp", "dp_replicate", "dp_shard", "ep", "cp", "zp", "tp"]
    assert plan.degrees["zp"] == 2 and plan.degrees["dp_shard"] == 4  # -1 took what zp left
    assert plan.is_active("zp") and plan.config.parallel.zp == 2
    assert not result.errors


def test_without_the_plugin_its_degree_key_is_unknown_with_the_keys_that_exist(tmp_path):
    with pytest.raises(ConfigError) as info:
        judged(tmp_path, {"zp": 2})
    (path, message), *_ = info.value.issues
    assert path == "$.parallel.zp"
    assert "unknown key 'zp'" in message and "pp, dp_replicate, dp_shard, ep, cp, tp" in message


def test_a_misspelt_degree_gets_a_did_you_mean(tmp_path):
    with pytest.raises(ConfigError) as info:
        judged(tmp_path, {"dp_shrad": 2})
    assert "Did you mean 'dp_shard'?" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, "must be at least 1, got 0"), (-1, "must be at least 1, got -1"), (True, "expected an integer")],
)
def test_degrees_are_validated_from_their_declaration(tmp_path, value, expected):
    with pytest.raises(ConfigError) as info:
        judged(tmp_path, {"cp": value})
    assert dict(info.value.issues)["$.parallel.cp"].startswith(expected)


def test_the_world_size_rule_reads_every_declared_degree(tmp_path):
    result = judged(tmp_path, {"zp": 3, "dp_shard": 1}, world_size=4, extra=[plugin(expert())])
    (error,) = [v for v in result.errors if v.rule_id == "parallel.world-size"]
    assert "zp=3" in error.message and "= 3 processes, but the world size is 4" in error.message
    assert "$.parallel.zp = 3" in str([f"$.{p} = {v}" for p, v in error.fields])


def test_a_dimension_that_shards_with_dp_shard_switches_fsdp_on(tmp_path):
    plan = judged(tmp_path, {"cp": 2}, world_size=2).plan
    assert [s.name for s in plan.strategies] == ["cp", "fsdp"]
    assert plan.data_parallel_size == 1 and plan.token_split == 2


def test_the_saved_config_writes_degrees_where_a_config_does(tmp_path):
    plain = to_plain(judged(tmp_path, {"cp": 2, "tp": 1}).plan.config)
    assert plain["parallel"]["cp"] == 2 and "degrees" not in plain["parallel"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (expert(name="tp"), "has the name of 'tp'"),
        (expert(place=500), "has the place 500 of"),
        (expert(fills_world=True), "more than one mesh dimension fills the world size"),
        (expert(shards_with="dq"), "shards with 'dq', which no strategy declares"),
        (expert(name="options"), "cannot be a degree key"),
        (attrs_evolve_mesh_dim("tp"), "declares the mesh dimension 'zp' but is switched on by 'tp'"),
    ],
)
def test_a_declaration_that_cannot_hold_is_refused_naming_the_plugin(spec, says):
    from forge_core.parallel_dims import mesh_dims

    registry = load_registries(extra=(plugin(spec),))["parallelism"]
    with pytest.raises(ForgeError, match=says):
        mesh_dims(registry)


@pytest.mark.parametrize(
    ("key", "hint"),
    [("tq", "Did you mean 'tp'?"), ("dpshard", "Did you mean 'dp_shard'?"), ("xp", None)],
)
def test_a_short_degree_one_letter_off_gets_a_did_you_mean_when_only_one_is(tmp_path, key, hint):
    # One letter of two is too far for a similarity ratio; "xp" is one edit from pp, cp
    # and tp alike, so nothing is offered for it.
    with pytest.raises(ConfigError) as info:
        judged(tmp_path, {key: 2})
    message = dict(info.value.issues)[f"$.parallel.{key}"]
    assert (hint in message) if hint else "Did you mean" not in message
