"""The commands that read a config or the plugins and build nothing: ``check``,
``plugins``, ``rules`` and ``show``. None imports torch or transformers, so each answers
in a fraction of a second."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from forge_core.errors import EXIT_INVALID

if TYPE_CHECKING:
    from forge_core.registry import Registries


def cmd_check(args: argparse.Namespace) -> int:
    from forge_core.cli.report import render
    from forge_core.judge import judge

    result = judge(args.config, args.overrides, args.world_size)
    if args.json:
        print(
            json.dumps(
                {
                    "valid": not result.errors,
                    "world_size": result.plan.world_size,
                    "violations": [v.to_json() for v in result.violations],
                },
                indent=2,
            )
        )
    else:
        if result.violations:
            print(render(result.violations))
        checked = len(result.registries.rules)
        verdict = "invalid" if result.errors else "valid"
        ws = result.plan.world_size
        if args.world_size is None and ws is not None and ws == result.config.run.world_size:
            ws = f"{ws} (run.world_size: the processes this config is made for)"
        if ws is None:
            ws = "unknown (pass --world-size to check it)"
            filler = next((d.name for d in result.plan.dims if result.plan.degrees.get(d.name) == -1), None)
            if filler is not None:
                ws = (
                    f"unknown: parallel.{filler} = -1 resolves at launch to what the other degrees "
                    "leave of it (pass --world-size N to check it now)"
                )
        blocked = result.registries.plugins.blocked
        print(
            f"{args.config}: {verdict}: {len(result.errors)} error(s), {len(result.warnings)} warning(s) "
            f"from {checked} rules ({result.kernel_rules} from the kernel); world size {ws}"
            + (
                f"; blocked plugins (their components and rules not loaded): {', '.join(blocked)}"
                if blocked
                else ""
            )
        )
    return EXIT_INVALID if result.errors else 0


def _components_by_plugin(registries: Registries) -> dict[str, list[tuple[str, Any, list[str]]]]:
    """``{plugin: [(kind, spec, other plugins registering the same name)]}``."""
    grouped: dict[str, list[tuple[str, Any, list[str]]]] = {}
    for registry in registries:
        for name in registry.names():
            grouped.setdefault(registry.plugin_of(name), []).append(
                (registry.kind.name, registry.get(name), [])
            )
        for clash in registry.clashes.values():
            owners = [entry.plugin for entry in clash.entries]
            for entry in clash.entries:
                others = [o for o in owners if o != entry.plugin]
                grouped.setdefault(entry.plugin, []).append((registry.kind.name, entry.spec, others))
    return grouped


def _clash_lines(registries: Registries) -> list[str]:
    """The names several plugins register: listed, and usable once a config chooses."""
    lines = [
        f"    {registry.kind.name} {name!r}: {', '.join(repr(e.plugin) for e in clash.entries)}"
        for registry in registries
        for name, clash in sorted(registry.clashes.items())
    ]
    if not lines:
        return []
    return [
        "name clashes: a config can use these names only once it says whose it means, in "
        "plugins.prefer (as {kind: {name: plugin}}); everything else stays usable:",
        *lines,
    ]


def cmd_plugins(args: argparse.Namespace) -> int:
    from forge_core.cli.report import render
    from forge_core.reference import components_markdown
    from forge_core.registry import load_registries

    registries = load_registries()
    if registries.plugins.warnings:  # on stderr: --json and --markdown stay readable
        print(render(registries.plugins.warnings), file=sys.stderr)
    if args.markdown:
        print(components_markdown(registries), end="")
        return 0
    grouped = _components_by_plugin(registries)
    rules_by_plugin: dict[str, list[str]] = {}
    for entry in registries.rules:
        rules_by_plugin.setdefault(entry.plugin, []).append(entry.rule.id)
    infos = registries.plugins.infos
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": info.name,
                        "distribution": info.distribution,
                        "version": info.version,
                        "module": info.module,
                        "builtin": info.builtin,
                        "components": [
                            {
                                "kind": k,
                                "name": s.name,
                                "summary": s.summary,
                                **({"clashes_with": o} if o else {}),
                            }
                            for k, s, o in grouped.get(info.name, [])
                        ],
                        "rules": rules_by_plugin.get(info.name, []),
                    }
                    for info in infos.values()
                ],
                indent=2,
            )
        )
        return 0
    # Columns as wide as their longest entry (at least as wide as the built-ins need), so
    # a long third-party name never runs into the summary; one width for every plugin.
    listed = [(kind, spec.name) for entries in grouped.values() for kind, spec, _ in entries]
    kind_width = max([12, *(len(kind) + 1 for kind, _ in listed)])
    name_width = max([14, *(len(name) + 1 for _, name in listed)])
    for info in infos.values():
        origin = "built-in" if info.builtin else "third-party"
        print(f"{info.name}  ({info.distribution} {info.version}, {origin}, {info.module})")
        for kind, spec, others in grouped.get(info.name, []):
            clash = f"  [also registered by {', '.join(map(repr, others))}]" if others else ""
            print(f"    {kind:<{kind_width}} {spec.name:<{name_width}} {spec.summary}{clash}")
        for rule_id in rules_by_plugin.get(info.name, []):
            print(f"    {'rule':<{kind_width}} {rule_id}")
    if registries.plugins.blocked:
        print(f"blocked: {', '.join(registries.plugins.blocked)}")
    for line in _clash_lines(registries):
        print(line)
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from forge_core.reference import rules_markdown
    from forge_core.registry import load_registries

    registries = load_registries()
    if args.markdown:
        print(rules_markdown(registries), end="")
        return 0
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": e.rule.id,
                        "severity": e.rule.severity,
                        "fields": list(e.rule.paths),
                        "summary": e.rule.summary,
                        "fix": e.rule.fix,
                        "plugin": e.plugin,
                    }
                    for e in registries.rules
                ],
                indent=2,
            )
        )
        return 0
    for e in registries.rules:
        print(f"{e.rule.id}  [{e.rule.severity}]  (plugin {e.plugin!r})")
        print(f"    fields:  {', '.join(e.rule.paths)}")
        print(f"    summary: {e.rule.summary}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from forge_core.config.loader import to_plain
    from forge_core.judge import judge

    result = judge(args.config, args.overrides)
    print(yaml.safe_dump(to_plain(result.config), sort_keys=False), end="")
    return 0
