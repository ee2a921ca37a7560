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
- an exception raised by the code of a component the command built (a method of the
  built object, wherever its class lives: a stock torch optimizer's ``step``): a
  :class:`~forge_core.errors.ComponentError` naming the component and its plugin, 2;
- anything else is a bug: one line saying what and where, status 1; the traceback is
  shown with ``FORGE_TRACEBACK=1`` (which also prints it before any other error).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from forge_core.api import ForgeError
from forge_core.errors import EXIT_INVALID, Interrupted, outcome, show_tracebacks, traceback_text


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="path to a YAML config")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, values parsed as YAML"
    )


def _count(minimum: int, what: str) -> Any:
    """An argparse type: ASCII digits, at least ``minimum`` (``int`` would take ``-3``
    or ``'٣'``)."""

    def parse(text: str) -> int:
        from forge_core.parallel_dims import count_problem

        problem = count_problem(text, minimum)
        if problem:
            raise argparse.ArgumentTypeError(f"{text!r}: {problem}; give {what}")
        return int(text.strip())

    return parse


def _add_world_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--world-size",
        type=_count(1, "the number of processes the run will have, e.g. --world-size 8"),
        default=None,
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
    p.add_argument(
        "--nproc",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc",
        type=_count(1, "the number of processes to start on this machine, e.g. --nproc 8"),
        default=1,
        help="processes to launch on this machine through torch.distributed.run",
    )
    p.add_argument("--nnodes", default=None, help="passed to torch.distributed.run (e.g. 2 or 1:4)")
    p.add_argument(
        "--node-rank",
        type=_count(0, "this machine's place among the nodes, from 0"),
        default=None,
        help="passed to torch.distributed.run",
    )
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

    p = sub.add_parser(
        "preview",
        help="print the first rows a config trains on, the tokens that take a loss marked",
        description="Build the config's data as a run does (source, chat template, token cache, "
        "packer; nothing trained, no model) and print its first rows in the trainer's order, "
        "token by token: the tokens the loss counts (labels other than -100) coloured on a "
        "terminal, else marked [[like this]], with their count.",
    )
    _add_config_args(p)
    p.add_argument("--rows", type=int, default=2, metavar="N", help="rows to show, in the trainer's order")
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable: every token's id, text and whether it is trained",
    )

    p = sub.add_parser("prepare", help="tokenize a source into shards (optionally train a BPE tokenizer)")
    _add_config_args(p)
    p.add_argument("--out", help="output directory for the shards (not with --verify)")
    p.add_argument(
        "--train-bpe",
        type=int,
        default=0,
        metavar="VOCAB",
        help="train a BPE tokenizer of this vocabulary size on the source first and use it "
        "(needs data.tokenizer: hf)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every file of the config's sources again and correct the token cache's file "
        "manifest (catches an edit that kept the size and modification time); writes no shards",
    )

    p = sub.add_parser("export-hf", help="write a checkpoint as a Hugging Face model folder")
    p.add_argument("checkpoint", help="a run directory (its latest checkpoint) or a checkpoint directory")
    p.add_argument(
        "out_dir", help="folder to write (config.json, generation_config.json, weights, tokenizer)"
    )
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="dtype of the written weights")
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="largest weight file (e.g. 5GB, 500MB); a larger model is written as shards "
        "with model.safetensors.index.json",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing OUT_DIR (only once the new export is complete)",
    )
    p.add_argument(
        "--adapter",
        action="store_true",
        help="for a run with model.transforms (LoRA): write the adapters as a PEFT folder "
        "(adapter_config.json, adapter_model.safetensors) instead of the merged model",
    )

    p = sub.add_parser("sample", help="print continuations from a run's latest checkpoint")
    p.add_argument("run_dir")
    p.add_argument(
        "--prompt",
        action="append",
        metavar="TEXT",
        help="text to continue; repeat for several prompts (default: one empty prompt)",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="more prompts, after the --prompt ones: one a line, or in a .jsonl file one JSON string "
        'or {"prompt": ...} a line',
    )
    p.add_argument("--num-samples", type=int, default=1, metavar="N", help="continuations of each prompt")
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        metavar="N",
        help="continuations sampled together (a prompt's are the same in any batch)",
    )
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=40, help="0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1: off")
    p.add_argument(
        "--stop",
        action="append",
        metavar="TEXT",
        help="end a continuation where this text appears (not printed); repeatable",
    )
    p.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=True, help="print text as it is sampled"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--chat",
        action="store_true",
        help="each prompt is a user message, rendered by the run's chat template with its generation "
        "prompt; the reply ends at the template's end of turn",
    )
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message before each prompt")
    p.add_argument(
        "--template",
        metavar="FILE",
        help="with --chat: a Jinja chat template file (default: the run's data.chat.template, else "
        "the tokenizer's own)",
    )

    p = sub.add_parser("eval", help="held-out loss and perplexity of a run's checkpoint")
    p.add_argument("run_dir", help="a run directory (the run's out_dir)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides of the run's config (eval.source=..., eval.max_batches=...)",
    )
    p.add_argument(
        "--checkpoint",
        type=int,
        default=None,
        metavar="STEP",
        help="evaluate the checkpoint of this step (default: the latest)",
    )
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
        command = subcommands(parser)[argv[0]]
        args, unknown = command.parse_known_intermixed_args(argv[1:])
        if unknown:
            command.error(unknown_arguments(command, argv[1:], unknown))
        args.command = argv[0]
        return parser, args
    return parser, parser.parse_args(argv)


def unknown_arguments(command: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> str:
    """argparse's refusal of ``unknown``, with what to write instead: another trainer's
    flag (``--max_steps 100``) or a Forge key written as one gets its override
    (``train.steps=100``) where the command takes overrides, any other option a
    did-you-mean."""
    from forge_core.api.unstable import did_you_mean
    from forge_core.config.foreign_keys import flag_hint

    actions = command._actions  # noqa: SLF001
    options = [s for a in actions for s in a.option_strings if s.startswith("--")]
    takes_overrides = any(a.dest == "overrides" for a in actions)
    hints = []
    for word in dict.fromkeys(w for w in unknown if w.startswith("-")):
        flag, eq, value = word.partition("=")
        if not eq:  # the value, if any, is the next word (argparse took it as a positional)
            at = argv.index(word) + 1
            following = argv[at] if at < len(argv) else ""
            value = following if following and not following.startswith("-") and "=" not in following else ""
        hint = flag_hint(flag, value or None) if takes_overrides else None
        hints.append(
            f"{flag}: {hint}"
            if hint
            else f"{flag} is not an option.{did_you_mean(flag, options)} Options: {', '.join(options)}"
        )
    return f"unrecognized arguments: {' '.join(unknown)}" + "".join(f"\n  {h}" for h in hints)


# Each handler imports its command's module when it runs, so ``check`` stays torch-free.


def _check(args: argparse.Namespace) -> int:
    from forge_core.cli.describe import cmd_check

    return cmd_check(args)


def _plugins(args: argparse.Namespace) -> int:
    from forge_core.cli.describe import cmd_plugins

    return cmd_plugins(args)


def _rules(args: argparse.Namespace) -> int:
    from forge_core.cli.describe import cmd_rules

    return cmd_rules(args)


def _show(args: argparse.Namespace) -> int:
    from forge_core.cli.describe import cmd_show

    return cmd_show(args)


def _preview(args: argparse.Namespace) -> int:
    from forge_core.cli.preview import main as preview

    return preview(args)


def _train(args: argparse.Namespace) -> int:
    from forge_core.cli.train import main as train

    return train(args)


def _prepare(args: argparse.Namespace) -> int:
    from forge_core.cli.prepare import main as prepare

    return prepare(args)


def _export_hf(args: argparse.Namespace) -> int:
    from forge_core.cli.export import main as export_hf

    return export_hf(args)


def _sample(args: argparse.Namespace) -> int:
    from forge_core.cli.sample import main as sample

    return sample(args)


def _eval(args: argparse.Namespace) -> int:
    from forge_core.cli.eval import main as evaluate

    return evaluate(args)


HANDLERS = {
    "train": _train,
    "check": _check,
    "plugins": _plugins,
    "rules": _rules,
    "show": _show,
    "preview": _preview,
    "prepare": _prepare,
    "export-hf": _export_hf,
    "sample": _sample,
    "eval": _eval,
}
#: The commands, in the order of ``forge-run --help``.
COMMANDS = tuple(HANDLERS)


def _stdout_closed() -> None:
    """The reader of stdout went away (``forge-run rules | head``): stop quietly, with the
    status of a program killed by SIGPIPE. stdout now points at /dev/null so the flush at
    interpreter exit does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a file descriptor (captured in process): nothing to redirect


def _blamed(exc: BaseException) -> BaseException:
    """An exception no Forge code anticipated, raised by the code of a component a
    command built (``eval``'s model, ``sample``'s tokenizer, ...), as the error naming
    that component and its plugin; any other exception as it is."""
    if not isinstance(exc, Exception) or isinstance(exc, (ForgeError, OSError)):
        return exc
    from forge_core.components import blame

    who = blame.built_culprit(exc)
    return exc if who is None else blame.failure(exc, who)


def run_command(handler: Any, args: argparse.Namespace) -> int:
    """Run one command and turn whatever ends it into its exit status (module docstring)."""
    try:
        code = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows up here, not at exit
        return code
    except (Exception, KeyboardInterrupt, Interrupted) as exc:
        message, code = outcome(_blamed(exc))
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
