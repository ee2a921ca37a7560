"""Every numeric field of the config, kernel sections and every built-in component's
options alike, found by introspecting the attrs classes (not a hand-written list), fed
non-finite, out-of-range and huge values: ``check`` accepts the value or reports a clean
error at that field's path, never a traceback."""

from __future__ import annotations

import math
import typing

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge_core.api.unstable import INT_MAX, INT_MIN
from forge_core.config.errors import ConfigError
from forge_core.config.loader import structure_config
from forge_core.config.schema import KEYED_BLOCKS, OPTION_BLOCKS, ForgeConfig
from forge_core.config.yaml_reader import parse_yaml
from forge_core.docgen import builtin_registries, option_rows
from forge_core.judge import judge_config
from forge_core.parallel_dims import mesh_dims
from forge_core.reference import resolved_fields

REGISTRIES = builtin_registries()


def _set(raw: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        raw = raw.setdefault(part, {})
    raw[last] = value


def _numeric(tp) -> type | None:
    """``int`` or ``float`` for a field of that type, optional (``int | None``) or not."""
    for candidate in (tp, *typing.get_args(tp)):
        if candidate in (int, float):
            return candidate
    return None


def numeric_fields() -> dict[str, tuple[type, dict]]:
    """``{config path: (int or float, settings that choose the component)}`` for every
    numeric field of the schema and of every built-in component's options class (nested
    option sections included)."""
    found: dict[str, tuple[type, dict]] = {}

    def visit(cls: type, prefix: str) -> None:
        for f in resolved_fields(cls):
            if f.type in (int, float):
                found[prefix + f.name] = (f.type, {})
            elif isinstance(f.type, type) and attrs.has(f.type):
                visit(f.type, f"{prefix}{f.name}.")

    visit(ForgeConfig, "")
    for dim in mesh_dims(REGISTRIES["parallelism"]):  # the degrees the strategies declare
        found[f"parallel.{dim.name}"] = (int, {})
    for block in OPTION_BLOCKS:
        for name in REGISTRIES[block.name].names():
            for path, f in option_rows(REGISTRIES[block.name].get(name).options, f"{block.options_path}."):
                if _numeric(f.type):
                    found[path] = (_numeric(f.type), {block.name_path: name})
    for block in KEYED_BLOCKS:
        for name in REGISTRIES[block.name].names():
            for path, f in option_rows(
                REGISTRIES[block.name].get(name).options, f"{block.options_path}.{name}."
            ):
                if _numeric(f.type):
                    found[path] = (_numeric(f.type), {})
    return found


FIELDS = numeric_fields()


def test_the_introspection_finds_kernel_and_component_fields():
    # A negative control for the generator: fields of each origin are there.
    for path in (
        "train.lr",
        "train.steps",
        "train.nonfinite.max_consecutive",
        "parallel.dp_shard",
        "train.optimizer_options.beta1",
        "model.options.norm_eps",
        "model.options.rope_scaling.factor",
        "attention.options.block_size",
        "data.source_options.max_bytes",
        "parallel.options.ddp.bucket_cap_mb",
        "logging.options.plot.smooth",
        "train.schedule_options.decay_fraction",
    ):
        assert path in FIELDS, path
    assert len(FIELDS) >= 40


def judged(path: str, value, world_size=None):
    """Write ``value`` at ``path`` into a config that chooses the field's component, go
    through YAML text as a user's file would, and judge it."""
    _, choose = FIELDS[path]
    raw: dict = {}
    for key, name in choose.items():
        _set(raw, key, name)
    _set(raw, path, value)
    text = yaml.safe_dump(raw)
    config = structure_config(parse_yaml(text, "$"), lambda block: REGISTRIES)
    return judge_config(config, REGISTRIES, world_size)


#: Values no numeric field accepts: not finite, or (for an int) beyond 64 bits, (for a
#: float) beyond the float range.
NEVER_VALID = {
    int: [math.nan, math.inf, -math.inf, 10**40, -(10**40), INT_MAX + 1, INT_MIN - 1],
    float: [math.nan, math.inf, -math.inf, 10**400, -(10**400)],
}


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_non_finite_and_overflowing_values_are_refused_at_their_path(path):
    type_, _ = FIELDS[path]
    for value in NEVER_VALID[type_]:
        with pytest.raises(ConfigError) as info:
            judged(path, value)
        assert [where for where, _ in info.value.issues] == [f"$.{path}"], (value, info.value.issues)


_values = st.one_of(
    st.sampled_from(
        [
            0,
            1,
            -1,
            2,
            0.5,
            -0.5,
            1.0,
            1e-320,
            1e308,
            -1e308,
            INT_MAX,
            INT_MIN,
            2**53 + 1,
            *NEVER_VALID[int],
            *NEVER_VALID[float],
        ]
    ),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(sorted(FIELDS)), value=_values, world_size=st.sampled_from([None, 1, 8]))
def test_any_number_in_any_numeric_field_is_accepted_or_refused_at_its_path(path, value, world_size):
    type_, _ = FIELDS[path]
    try:
        result = judged(path, value, world_size)  # any other exception fails the test
    except ConfigError as exc:
        assert {where for where, _ in exc.issues} == {f"$.{path}"}, exc.issues
        return
    # Accepted: the value is what the field's type promises.
    assert isinstance(value, (int, float)) and math.isfinite(value)
    if type_ is int:
        assert type(value) is int and INT_MIN <= value <= INT_MAX
    assert all(v.severity in ("error", "warning") for v in result.violations)
