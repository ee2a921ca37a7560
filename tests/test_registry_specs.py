"""Every registered component of every kind, and every rule, keeps the promises a spec
makes, whatever plugin declared it: its ``impl`` (and any other import path it names)
imports, each of its options is documented and has a default, the spec is of its
kind's class, and what it names elsewhere (an option, another strategy) exists. A
plugin's own tests then need to say only what its components *do*."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from forge_core.api import NoOptions, PackerSpec, Rule
from forge_core.api.specs import import_path
from forge_core.config.schema import ForgeConfig
from forge_core.registry import KINDS, Kind

KIND = {kind.name: kind for kind in KINDS}
SECTIONS = {f.name for f in attrs.fields(ForgeConfig)}


def _option_problems(cls: type, where: str) -> list[str]:
    if not attrs.has(cls):
        return [f"{where}: options {cls!r} is not an attrs class"]
    problems = []
    for field in attrs.fields(cls):
        if not str(field.metadata.get("doc", "")).strip():
            problems.append(f"{where}: option {field.name!r} has no doc")
        if field.default is attrs.NOTHING:
            problems.append(f"{where}: option {field.name!r} has no default")
        if isinstance(field.type, type) and attrs.has(field.type):
            problems += _option_problems(field.type, f"{where}.{field.name}")
    return problems


def _imports(path: str, what: str, where: str) -> list[str]:
    try:
        obj = import_path(path)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return [f"{where}: {what} {path!r} does not import: {type(exc).__name__}: {exc}"]
    return [] if callable(obj) else [f"{where}: {what} {path!r} is not callable"]


def spec_problems(kind: Kind, spec: Any, registered: dict[str, set[str]]) -> list[str]:
    """What is wrong with ``spec`` as a component of ``kind`` (empty when nothing is)."""
    where = f"{kind.name} {getattr(spec, 'name', '?')!r}"
    if not isinstance(spec, kind.spec_cls) or spec.kind != kind.name:
        return [f"{where}: a {type(spec).__name__}, not a {kind.spec_cls.__name__}"]
    problems = (
        [] if spec.summary.strip() and "\n" not in spec.summary else [f"{where}: summary must be one line"]
    )
    problems += _imports(spec.impl, "impl", where)
    problems += _option_problems(spec.options, where)
    options = spec.options() if not problems else None
    for attribute in ("hf_export", "resolve_options"):
        path = getattr(spec, attribute, None)
        if path is not None:
            problems += _imports(path, attribute, where)
    option_names = {f.name for f in attrs.fields(spec.options)} if attrs.has(spec.options) else set()
    for attribute in ("max_seq_len_option", "pretrained_option", "emits_when"):
        named = getattr(spec, attribute, None)
        if named is not None and named not in option_names:
            problems.append(
                f"{where}: {attribute} {named!r} is not one of its options {sorted(option_names)}"
            )
    if getattr(spec, "facts", None) is not None and options is not None:
        try:
            spec.facts(options)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{where}: facts() of the default options raised {type(exc).__name__}: {exc}")
    unknown = set(getattr(spec, "yields_to", ())) - registered.get(kind.name, set())
    if unknown:
        problems.append(f"{where}: yields_to names unregistered {sorted(unknown)}")
    return problems


def rule_problems(rule: Rule) -> list[str]:
    """What is wrong with ``rule`` as a registered rule (empty when nothing is)."""
    where = f"rule {rule.id!r}"
    problems = [] if rule.summary.strip() and rule.fix.strip() else [f"{where}: needs a summary and a fix"]
    problems += [
        f"{where}: field {path!r} is outside the config"
        for path in rule.paths
        if path.split(".")[0] not in SECTIONS
    ]
    if not rule.paths:
        problems.append(f"{where}: names no config field")
    if not callable(rule.check):
        problems.append(f"{where}: check is not callable")
    return problems


def test_every_registered_component_and_rule_keeps_its_specs_promises(forge_registries):
    registered = {registry.kind.name: set(registry.names()) for registry in forge_registries}
    assert set(registered) == set(KIND), "a kind without a registry"
    assert all(registered.values()), registered  # every kind has a built-in component
    problems = [
        p
        for registry in forge_registries
        for name in registry.names()
        for p in spec_problems(registry.kind, registry.get(name), registered)
    ]
    problems += [p for entry in forge_registries.rules for p in rule_problems(entry.rule)]
    assert problems == []


@attrs.frozen
class _Undocumented:
    size: int = attrs.field(default=1, metadata={"doc": "rows"})
    depth: int = 2


@attrs.frozen
class _Required:
    size: int = attrs.field(metadata={"doc": "rows"})


def _ok(**changes: Any) -> PackerSpec:
    return PackerSpec(
        **{"name": "p", "summary": "s", "impl": "forge_plugins.packers.concat:ConcatPacker", **changes}
    )


@pytest.mark.parametrize(
    ("kind", "spec", "complaint"),
    [
        (
            "packer",
            _ok(impl="forge_plugins.packers.concat:NoSuchPacker"),
            "impl 'forge_plugins.packers.concat:NoSuchPacker' does not import",
        ),
        ("packer", _ok(impl="no_such_module_anywhere:X"), "does not import: ModuleNotFoundError"),
        ("packer", _ok(options=_Undocumented), "option 'depth' has no doc"),
        ("packer", _ok(options=_Required), "option 'size' has no default"),
        ("packer", _ok(emits_when="isolated"), "emits_when 'isolated' is not one of its options"),
        ("packer", _ok(summary="two\nlines"), "summary must be one line"),
        ("source", _ok(), "a PackerSpec, not a SourceSpec"),
    ],
)
def test_the_spec_check_catches_each_broken_promise(kind, spec, complaint):
    assert spec_problems(KIND["packer"], _ok(options=NoOptions), {}) == []
    problems = spec_problems(KIND[kind], spec, {})
    assert any(complaint in p for p in problems), problems


def test_the_rule_check_catches_a_rule_outside_the_config():
    rule = Rule(
        id="x.y", severity="error", paths=("trian.lr",), summary="s", check=lambda plan: None, fix="f"
    )
    assert rule_problems(rule) == ["rule 'x.y': field 'trian.lr' is outside the config"]
    assert rule_problems(attrs.evolve(rule, paths=("train.lr",))) == []
