"""``forge-run prepare CONFIG [key=value ...] --out DIR [--train-bpe VOCAB]``, and
``forge-run prepare CONFIG --verify``.

Builds the config's ``data.source`` and ``data.tokenizer`` through the registries and
writes shards with :func:`forge_core.data.prepare.prepare`. With ``--train-bpe VOCAB``
it first trains a byte-level BPE tokenizer on the source
(:func:`forge_core.data.bpe.train_bpe`) and uses it in place of the configured one's
files: the configured tokenizer must load from a directory (its options have a
``path``, like the built-in ``hf``), and is built with ``path`` set to the trained
files. The shards then carry that tokenizer in ``DIR/tokenizer``. The last lines
printed are the config settings that train on the result.

One prepare at a time per output: it holds ``DIR.lock`` (beside ``DIR``, as ``DIR`` only
appears when complete), the lock a run takes on its run directory
(:meth:`~forge_core.train.run_lock.RunLock.take`); a second prepare on the same ``--out``
is refused at once, naming the one that holds it, before it touches anything.

``--verify`` writes no shards: for every source of the config (``data.source`` or each
of ``data.sources``) that names its files, it hashes every file again under the token
cache's file manifest (:func:`forge_core.data.manifest.fingerprint` with ``verify``),
which a start checks by stat alone. Files whose bytes changed while their size and
modification time did not are named, the manifest is corrected (the next run tokenizes
the new content) and the command exits 2; otherwise it says what it verified and exits 0.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from forge_core.api import ForgeError, Plan

if TYPE_CHECKING:
    from forge_core.registry import Registries


def main(args: Any) -> int:
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved

    config, registries = load_resolved(args.config, args.overrides)
    if getattr(args, "verify", False):
        return verify(config, registries, args)
    if not args.out:
        raise ForgeError("forge-run prepare needs --out DIR (where to write the shards), or --verify.")
    if config.data.sources:
        raise ForgeError(
            f"{args.config} mixes {len(config.data.sources)} sources (data.sources); `forge-run prepare` "
            "tokenizes one (data.source). Prepare each with its own config, or let the run tokenize them "
            "into its cache."
        )
    plan = make_plan(config, registries, world_size=None)
    out = Path(args.out)
    lock = lock_output(out)
    try:
        return _prepare(args, config, registries, plan, out)
    finally:
        lock.release()


def lock_output(out: Path) -> Any:
    """Take ``OUT.lock``, or refuse naming the prepare that holds it."""
    from forge_core.train.run_lock import RunLock, describe, ensure_out_dir

    fix = "Give --out a directory you can write."
    ensure_out_dir(out.parent, "prepare --out", fix)

    def held(path: Path, holder: dict[str, Any]) -> ForgeError:
        return ForgeError(
            f"prepare --out: {str(out)!r} is being written by another `forge-run prepare`: "
            f"{describe(holder)}. Two at once would remove each other's partial output. Wait for "
            f"it to finish (or stop it), or give this one another --out. The lock is {path}; it is "
            f"released when its holder exits, even when killed."
        )

    return RunLock.take(out.with_name(out.name + ".lock"), "prepare --out", held, fix=fix)


def _prepare(args: Any, config: Any, registries: Registries, plan: Plan, out: Path) -> int:
    from forge_core import components
    from forge_core.data.bpe import train_bpe
    from forge_core.data.prepare import prepare
    from forge_core.data.shards import TOKENIZER_DIR
    from forge_core.train.rundir import holds_run

    overwrite = bool(getattr(args, "overwrite", False))
    if out.exists() and not overwrite:
        raise ForgeError(f"{out} already exists. Choose another directory or pass --overwrite.")
    found = holds_run(out) if overwrite and out.is_dir() else None
    if found is not None:
        raise ForgeError(
            f"prepare --out: {str(out)!r} holds a Forge run or checkpoint ({str(found)!r}); --overwrite "
            "would delete it. Give another --out, or remove what is there yourself if it is no longer needed."
        )
    vocab = int(getattr(args, "train_bpe", 0) or 0)
    options = config.data.tokenizer_options
    has_path = attrs.has(type(options)) and "path" in attrs.fields_dict(type(options))
    if vocab and not has_path:
        raise ForgeError(
            f"--train-bpe needs a tokenizer that loads from a directory (options with a "
            f"'path'), but data.tokenizer is {config.data.tokenizer!r}. Set data.tokenizer=hf."
        )
    source = components.source(plan, registries)
    print(f"source: {source.describe()}", file=sys.stderr)
    if not vocab:
        from forge_core.data.chat import chat_source

        tokenizer = components.tokenizer(plan, registries)
        prepare(chat_source(source, tokenizer, config.data.chat), tokenizer, out, overwrite=overwrite)
        _next_steps(config.data.tokenizer, None, out)
        return 0

    cls = plan.specs["tokenizer"].load()
    out.parent.mkdir(parents=True, exist_ok=True)
    trained = Path(tempfile.mkdtemp(prefix=f"{out.name}.bpe-", dir=out.parent))
    try:
        print(f"training a BPE tokenizer of {vocab} tokens ...", file=sys.stderr)
        train_bpe(source, vocab, trained / "tokenizer", overwrite=True)
        tokenizer = cls(attrs.evolve(options, path=str(trained / "tokenizer")))
        # A second pass over the source: sources are deterministic, so it is the same text.
        source = components.source(plan, registries)
        prepare(source, tokenizer, out, overwrite=overwrite)
    finally:
        shutil.rmtree(trained, ignore_errors=True)
    _next_steps(config.data.tokenizer, out / TOKENIZER_DIR, out)
    return 0


def verify(config: Any, registries: Registries, args: Any) -> int:
    """``--verify``: every file of every source hashed again against the manifest."""
    from forge_core.data.build import build_source
    from forge_core.data.cache import default_root
    from forge_core.data.fingerprint import file_set
    from forge_core.data.manifest import fingerprint
    from forge_core.plan import make_plan

    if args.out or args.train_bpe or args.overwrite:
        raise ForgeError("--verify writes nothing: drop --out, --train-bpe and --overwrite.")
    plan = make_plan(config, registries, world_size=None)
    root = config.data.cache.dir or default_root()
    stale: list[str] = []
    for index, chosen in enumerate(plan.sources):
        source = build_source(plan, registries, index)
        files = file_set(source)
        if files is None:
            print(
                f"{chosen.where} ({chosen.name}): names no files; its fingerprint is computed at "
                "every start, nothing to verify",
                file=sys.stderr,
            )
            continue
        checked = fingerprint(files, root, verify=True)
        size = sum(Path(p).stat().st_size for p in files.files)
        print(
            f"{chosen.where} ({chosen.name}): hashed {len(files.files)} files ({size / 1e6:.1f} MB); "
            f"{len(checked.stale)} changed under an unchanged size and time; manifest {checked.manifest}",
            file=sys.stderr,
        )
        stale += [f"{chosen.where}: {path}" for path in checked.stale]
    if stale:
        shown = "\n  ".join(stale[:20]) + (f"\n  (+{len(stale) - 20} more)" if len(stale) > 20 else "")
        raise ForgeError(
            f"{len(stale)} file(s) changed without a change of size or modification time, so a start "
            f"would have used the token cache of their old content:\n  {shown}\nThe manifest is "
            "corrected: the next run tokenizes the new content. Nothing else to do."
        )
    return 0


def _next_steps(tokenizer: str, tokenizer_path: Path | None, out: Path) -> None:
    lines = ["train on it with:", "  data.source: shards", f"  data.source_options: {{path: {out}}}"]
    lines.append(f"  data.tokenizer: {tokenizer}")
    if tokenizer_path is not None:
        lines.append(f"  data.tokenizer_options: {{path: {tokenizer_path}}}")
    print("\n".join(lines), file=sys.stderr)
