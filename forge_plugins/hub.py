"""Models and tokenizers named by a Hugging Face Hub id (``org/name``), found in the
local Hub cache without torch or network, and downloaded into it when allowed.

The cache is the one ``huggingface_hub`` writes and reads, located as it locates it:
``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``. A model lies in ``models--{org}--{name}/``: ``refs/{revision}``
holds the commit a branch or tag points at, ``snapshots/{commit}/`` the files (links into
``blobs/``). :func:`cached` reads that layout with the file system alone, so
``forge-run check`` judges a Hub id in milliseconds; :func:`download` calls
``huggingface_hub.snapshot_download`` with only the files Forge reads (config, safetensors
weights and their index, tokenizer files), and only when ``HF_HUB_OFFLINE`` is not set.

A local path wins: a value that names an existing file or folder is never a Hub id.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import attrs

from forge_core.api import ForgeError
from forge_core.api.unstable import FileRefused, read_small_text

#: ``org/name`` as the Hub spells repository ids (each part: letters, digits, ``-_.``).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_REVISION = "main"
#: A ref holds one commit name (40 hex digits and a newline): anything far larger is not one.
REF_LIMIT = 1024
#: What a tokenizer download fetches: a fast tokenizer's serialization and settings, a
#: slow tokenizer's vocabulary (BPE, WordPiece, SentencePiece, tiktoken), a chat template.
TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "chat_template.jinja",
)
#: What a model download fetches: every JSON file (config, safetensors index, tokenizer
#: settings), the safetensors weights and the tokenizer; never pickled weights.
MODEL_FILES = (
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "chat_template.jinja",
)


class HubNotCached(ForgeError, FileNotFoundError):
    """A Hub id (at a revision) is not in the local cache and may not be downloaded."""


def cache_dir() -> Path:
    """The Hub cache ``huggingface_hub`` uses, from the environment as it reads it."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def is_hub_id(value: str) -> bool:
    """Whether ``value`` is read as a Hub id: ``org/name`` and no such local path."""
    return bool(HUB_ID.fullmatch(value)) and not os.path.exists(value)


@attrs.frozen
class Snapshot:
    """A cached snapshot: the folder and the commit it is."""

    path: Path
    commit: str


def repo_folder(repo_id: str) -> Path:
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached(repo_id: str, revision: str = DEFAULT_REVISION) -> Snapshot | None:
    """The cached snapshot of ``repo_id`` at ``revision`` (a branch, a tag or a commit),
    or ``None`` when the cache does not hold it."""
    revision = revision or DEFAULT_REVISION
    commit = revision if COMMIT.fullmatch(revision) else read_ref(repo_id, revision)
    if commit is None or not COMMIT.fullmatch(commit):
        return None
    path = repo_folder(repo_id) / "snapshots" / commit
    return Snapshot(path, commit) if path.is_dir() else None


def read_ref(repo_id: str, revision: str) -> str | None:
    """What ``refs/{revision}`` of ``repo_id`` holds (stripped), or ``None`` when there is
    no such ref. A ref that is not a small regular file (a FIFO, ``/dev/zero``) is
    refused (:class:`~forge_core.api.files.FileRefused`) rather than read."""
    try:
        ref = repo_folder(repo_id) / "refs" / revision
        return read_small_text(ref, REF_LIMIT, "the Hub cache ref").strip()
    except (OSError, UnicodeDecodeError, ValueError):  # ValueError: a NUL byte in the name
        return None


def download_command(repo_id: str, revision: str, patterns: tuple[str, ...]) -> str:
    """The ``hf download`` command (``huggingface_hub``'s CLI) that puts ``repo_id`` at
    ``revision`` into the cache, with only ``patterns``."""
    words = ["hf", "download", repo_id]
    if revision and revision != DEFAULT_REVISION:
        words += ["--revision", revision]
    for pattern in patterns:
        words += ["--include", pattern]
    return shlex.join(words)


def not_cached(repo_id: str, revision: str, patterns: tuple[str, ...], where: str) -> str:
    """Why ``repo_id`` cannot be used here and how to fetch it (the words of the
    error that ``check`` and the build give)."""
    revision = revision or DEFAULT_REVISION
    mode = (
        "HF_HUB_OFFLINE is set, so nothing is downloaded"
        if offline()
        else "`forge-run train` downloads it before judging the config, `check` reads only the cache"
    )
    return (
        f"{where}={repo_id!r}: no local folder of that name, and the Hugging Face Hub cache "
        f"{cache_dir()} does not hold {repo_id} at revision {revision!r}{held(repo_id, revision)}; "
        f"{mode}. Download it "
        f"with `{download_command(repo_id, revision, patterns)}` (HF_TOKEN set for a gated model), "
        "or point the option at a local folder"
    )


def _names(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _ref_shown(repo_id: str, name: str) -> str:
    try:
        value = read_ref(repo_id, name)
    except FileRefused:
        return "not a regular file"
    return "unreadable" if value is None else repr(value[:48])


def held(repo_id: str, revision: str) -> str:
    """What the cache holds of ``repo_id``, said against ``revision`` in parentheses:
    what its ref resolves to (or why it resolves to nothing), the refs and the snapshots
    there; nothing when the cache holds nothing of it."""
    folder = repo_folder(repo_id)
    if not folder.is_dir():
        return ""
    refs = sorted(p.name for p in (folder / "refs").glob("*") if not p.is_dir())
    snapshots = sorted(p.name for p in (folder / "snapshots").glob("*") if p.is_dir())
    if COMMIT.fullmatch(revision):
        why = f"no snapshot of commit {revision}"
    elif revision not in refs:
        why = f"no refs/{revision}"
    else:  # a ref that is no regular file was refused before this message is asked for
        commit = read_ref(repo_id, revision)
        if commit is None:
            why = f"refs/{revision} is unreadable"
        elif not COMMIT.fullmatch(commit):
            why = f"refs/{revision} holds {commit[:48]!r}, not a full commit name (40 hex digits)"
        else:
            why = f"refs/{revision} resolves to commit {commit}, which has no snapshot folder"
    shown = [f"{name} -> {_ref_shown(repo_id, name)}" for name in refs if name != revision]
    return (
        f" ({why}; "
        + (f"other refs: {_names(shown)}; " if shown else "")
        + (f"snapshots held: {_names(snapshots)})" if snapshots else "no snapshots held)")
    )


def local_folder(value: str, revision: str, patterns: tuple[str, ...], where: str) -> tuple[str, str]:
    """``(folder, commit)`` for an option's value: a local path as it is (commit ``""``),
    a Hub id as its cached snapshot. Raises :class:`HubNotCached` otherwise."""
    if not is_hub_id(value):
        return value, ""
    try:
        snapshot = cached(value, revision)
    except FileRefused as exc:
        raise HubNotCached(
            f"{where}={value!r}: {exc} (remove it: `hf download` writes the ref anew)"
        ) from None
    if snapshot is None:
        raise HubNotCached(not_cached(value, revision, patterns, where))
    return str(snapshot.path), snapshot.commit


def download(repo_id: str, revision: str, patterns: tuple[str, ...], where: str) -> None:
    """Put ``repo_id`` at ``revision`` into the cache unless it is there, or offline
    (the rules then say how to download it). A cached revision is used as it is: the
    Hub is not asked whether a branch moved (``hf download`` refreshes it)."""
    revision = revision or DEFAULT_REVISION
    if not is_hub_id(repo_id) or offline():
        return
    try:
        if cached(repo_id, revision) is not None:
            return
    except FileRefused:
        return  # the rules refuse it, naming the option
    print(
        f"downloading {repo_id} (revision {revision}) from the Hugging Face Hub into {cache_dir()}",
        file=sys.stderr,
        flush=True,
    )
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, revision=revision, allow_patterns=list(patterns))
    except Exception as exc:  # network, authentication, unknown id or revision: all the user's to fix
        raise ForgeError(
            f"{where}={repo_id!r}: downloading it from the Hugging Face Hub failed "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Check the id and "
            f"the revision {revision!r}, log in (HF_TOKEN) for a gated model, or download it yourself: "
            f"`{download_command(repo_id, revision, patterns)}`"
        ) from None
