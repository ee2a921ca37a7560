"""``forge-run``: one argparse tree for every command.

``check``, ``plugins``, ``rules`` and ``show`` import neither torch nor transformers, so
they answer in a fraction of a second. Each command reads its options and overrides in
any order. What ends a command and its exit status (docs/cli.md lists them):

- a :class:`~forge_core.api.ForgeError` (bad input: config, files, plugins, a
  component that failed) is printed without a traceback; status 2 unless the error
  says otherwise (124: a collective timed out);
- SIGTERM/SIGINT before training starts: a one-line notice, 128 + the signal;
- the reader of stdout going away (``forge-run rules | head``): quietly, 141, like a
  program killed by SIGPIPE;
- an OSError (a file, a permission, the disk): its message, status 2;
- anything else is a bug: one line saying what and where, status 1; the traceback is
  shown with ``FORGE_TRACEBACK=1`` (which also prints it before any other error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from forge_core.errors import EXIT_INVALID, Interrupted, outcome, show_tracebacks, traceback_text

COMMANDS = ("train", "check", "plugins", "rules", "show", "prepare", "export-hf", "sample", "eval")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="path to a YAML config")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, values parsed as YAML")


def _add_world_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--world-size", type=int, default=None,
        help="number of processes to judge against (default: torchrun's WORLD_SIZE, else unchecked)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge-run",
        description="Forge: a plugin-based trainer for decoder-only language models. "
        "`forge-run CONFIG [key=value ...]` trains; the commands below inspect and prepare.",
    )
    from forge_core import __version__

    parser.add_argument("--version", action="version", version=f"forge-run {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("train", help="train a model (the default command)")
    _add_config_args(p)
    p.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int, default=1,
                   help="processes to launch on this machine through torch.distributed.run")
    p.add_argument("--nnodes", default=None, help="passed to torch.distributed.run (e.g. 2 or 1:4)")
    p.add_argument("--node-rank", type=int, default=None, help="passed to torch.distributed.run")
    p.add_argument("--rdzv-endpoint", default=None, help="host:port, passed to torch.distributed.run")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override run.device")

    p = sub.add_parser("check", help="judge a config: every error and warning, nothing built")
    _add_config_args(p)
    _add_world_size(p)
    p.add_argument("--json", action="store_true", help="machine-readable report")

    p = sub.add_parser("plugins", help="list plugins and the components they register")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="the component reference as Markdown")

    p = sub.add_parser("rules", help="list every compatibility rule")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="the rule reference as Markdown")

    p = sub.add_parser("show", help="print the fully resolved config as YAML")
    _add_config_args(p)

    p = sub.add_parser("prepare", help="tokenize a source into shards (optionally train a BPE tokenizer)")
    _add_config_args(p)
    p.add_argument("--out", required=True, help="output directory for the shards")
    p.add_argument("--train-bpe", type=int, default=0, metavar="VOCAB",
                   help="train a BPE tokenizer of this vocabulary size on the source first and use it "
                        "(needs data.tokenizer: hf)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")

    p = sub.add_parser("export-hf", help="write a checkpoint as a Hugging Face model folder")
    p.add_argument("checkpoint", help="a run directory (its latest checkpoint) or a checkpoint directory")
    p.add_argument("out_dir", help="folder to write (config.json, generation_config.json, weights, tokenizer)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="dtype of the written weights")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="largest weight file (e.g. 5GB, 500MB); a larger model is written as shards "
                        "with model.safetensors.index.json")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUT_DIR (only once the new export is complete)")

    p = sub.add_parser("sample", help="print continuations from a run's latest checkpoint")
    p.add_argument("run_dir")
    p.add_argument("--prompt", action="append", metavar="TEXT",
                   help="text to continue; repeat for several prompts (default: one empty prompt)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=40, help="0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1: off")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="end a continuation where this text appears (not printed); repeatable")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="print text as it is sampled")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("eval", help="held-out loss and perplexity of a run's checkpoint")
    p.add_argument("run_dir", help="a run directory (the run's out_dir)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides of the run's config (eval.source=..., eval.max_batches=...)")
    p.add_argument("--checkpoint", type=int, default=None, metavar="STEP",
                   help="evaluate the checkpoint of this step (default: the latest)")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    return parser


def normalize_argv(argv: list[str]) -> list[str]:
    """``forge-run CONFIG ...`` and ``forge-run --nproc 2 CONFIG ...`` mean ``train``."""
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        return ["train", *argv]
    return argv


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser, by name."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def parse_args(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Each command's own parser reads its arguments intermixed, so options may come
    before, between or after the config and its overrides
    (``check cfg.yaml --world-size 2 parallel.pp=2``)."""
    parser = build_parser()
    argv = normalize_argv(argv)
    if argv and argv[0] in COMMANDS:
        args = subcommands(parser)[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return parser, args
    return parser, parser.parse_args(argv)


# --- commands -----------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from forge_core.judge import judge
    from forge_core.rules import render

    result = judge(args.config, args.overrides, args.world_size)
    if args.json:
        print(json.dumps({
            "valid": not result.errors,
            "world_size": result.plan.world_size,
            "violations": [v.to_json() for v in result.violations],
        }, indent=2))
    else:
        if result.violations:
            print(render(result.violations))
        checked = len(result.registries.rules)
        verdict = "invalid" if result.errors else "valid"
        ws = result.plan.world_size
        if ws is None:
            ws = "unknown (pass --world-size to check it)"
            if result.plan.degrees.get("dp_shard") == -1:
                ws = ("unknown: parallel.dp_shard = -1 resolves at launch to what the other degrees "
                      "leave of it (pass --world-size N to check it now)")
        blocked = result.registries.plugins.blocked
        print(
            f"{args.config}: {verdict}: {len(result.errors)} error(s), {len(result.warnings)} warning(s) "
            f"from {checked} rules ({result.kernel_rules} from the kernel); world size {ws}"
            + (f"; blocked plugins (their components and rules not loaded): {', '.join(blocked)}" if blocked else "")
        )
    return EXIT_INVALID if result.errors else 0


def _components_by_plugin(registries: Any) -> dict[str, list[tuple[str, Any, list[str]]]]:
    """``{plugin: [(kind, spec, other plugins registering the same name)]}``."""
    grouped: dict[str, list[tuple[str, Any, list[str]]]] = {}
    for registry in registries:
        for name in registry.names():
            grouped.setdefault(registry.plugin_of(name), []).append((registry.kind.name, registry.get(name), []))
        for clash in registry.clashes.values():
            owners = [entry.plugin for entry in clash.entries]
            for entry in clash.entries:
                others = [o for o in owners if o != entry.plugin]
                grouped.setdefault(entry.plugin, []).append((registry.kind.name, entry.spec, others))
    return grouped


def _clash_lines(registries: Any) -> list[str]:
    """The names several plugins register: listed, and usable once a config chooses."""
    lines = [
        f"    {registry.kind.name} {name!r}: {', '.join(repr(e.plugin) for e in clash.entries)}"
        for registry in registries for name, clash in sorted(registry.clashes.items())
    ]
    if not lines:
        return []
    return [
        "name clashes: a config can use these names only once it says whose it means, in "
        "plugins.prefer (as {kind: {name: plugin}}); everything else stays usable:", *lines,
    ]


def cmd_plugins(args: argparse.Namespace) -> int:
    from forge_core.reference import components_markdown
    from forge_core.registry import load_registries

    registries = load_registries()
    if args.markdown:
        print(components_markdown(registries), end="")
        return 0
    grouped = _components_by_plugin(registries)
    rules_by_plugin: dict[str, list[str]] = {}
    for entry in registries.rules:
        rules_by_plugin.setdefault(entry.plugin, []).append(entry.rule.id)
    infos = registries.plugins.infos
    if args.json:
        print(json.dumps([
            {
                "name": info.name, "distribution": info.distribution, "version": info.version,
                "module": info.module, "builtin": info.builtin,
                "components": [
                    {"kind": k, "name": s.name, "summary": s.summary, **({"clashes_with": o} if o else {})}
                    for k, s, o in grouped.get(info.name, [])
                ],
                "rules": rules_by_plugin.get(info.name, []),
            }
            for info in infos.values()
        ], indent=2))
        return 0
    for info in infos.values():
        origin = "built-in" if info.builtin else "third-party"
        print(f"{info.name}  ({info.distribution} {info.version}, {origin}, {info.module})")
        for kind, spec, others in grouped.get(info.name, []):
            clash = f"  [also registered by {', '.join(map(repr, others))}]" if others else ""
            print(f"    {kind:<12} {spec.name:<14} {spec.summary}{clash}")
        for rule_id in rules_by_plugin.get(info.name, []):
            print(f"    {'rule':<12} {rule_id}")
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
        print(json.dumps([
            {"id": e.rule.id, "severity": e.rule.severity, "fields": list(e.rule.paths),
             "summary": e.rule.summary, "fix": e.rule.fix, "plugin": e.plugin}
            for e in registries.rules
        ], indent=2))
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


def _delegate(module: str, func: str, args: argparse.Namespace) -> int:
    """Commands that need torch live in their own modules, imported only when run."""
    import importlib

    return int(getattr(importlib.import_module(module), func)(args) or 0)


HANDLERS = {
    "check": cmd_check,
    "plugins": cmd_plugins,
    "rules": cmd_rules,
    "show": cmd_show,
    "train": lambda a: _delegate("forge_core.train.launch", "main", a),
    "prepare": lambda a: _delegate("forge_core.data.prepare_cli", "main", a),
    "export-hf": lambda a: _delegate("forge_core.train.export", "main", a),
    "sample": lambda a: _delegate("forge_core.train.sample", "main", a),
    "eval": lambda a: _delegate("forge_core.train.eval_cli", "main", a),
}


def _stdout_closed() -> None:
    """The reader of stdout went away (``forge-run rules | head``): stop quietly, with the
    status of a program killed by SIGPIPE. stdout now points at /dev/null so the flush at
    interpreter exit does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a file descriptor (captured in process): nothing to redirect


def run_command(handler: Any, args: argparse.Namespace) -> int:
    """Run one command and turn whatever ends it into its exit status (module docstring)."""
    try:
        code = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows up here, not at exit
        return code
    except (Exception, KeyboardInterrupt, Interrupted) as exc:
        message, code = outcome(exc)
        if isinstance(exc, BrokenPipeError):
            _stdout_closed()
        if message is not None:
            if show_tracebacks() and not isinstance(exc, Interrupted):
                print(traceback_text(exc), end="", file=sys.stderr)
            print(message, file=sys.stderr)
        return code


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return EXIT_INVALID
    return run_command(HANDLERS[args.command], args)


if __name__ == "__main__":
    sys.exit(main())
