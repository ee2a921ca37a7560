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

#: ``org/name`` as the Hub spells repository ids (each part: letters, digits, ``-_.``).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_REVISION = "main"
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
    folder = repo_folder(repo_id)
    commit = revision if COMMIT.fullmatch(revision) else None
    if commit is None:
        try:
            commit = (folder / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError, ValueError):  # ValueError: a NUL byte in the name
            return None
    if not COMMIT.fullmatch(commit):
        return None
    path = folder / "snapshots" / commit
    return Snapshot(path, commit) if path.is_dir() else None


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
    held = sorted(p.name for p in (repo_folder(repo_id) / "refs").glob("*"))
    have = f" (it holds revision {', '.join(held)})" if held else ""
    mode = (
        "HF_HUB_OFFLINE is set, so nothing is downloaded"
        if offline()
        else "`forge-run train` downloads it before judging the config, `check` reads only the cache"
    )
    return (
        f"{where}={repo_id!r}: no local folder of that name, and the Hugging Face Hub cache "
        f"{cache_dir()} does not hold {repo_id} at revision {revision!r}{have}; {mode}. Download it "
        f"with `{download_command(repo_id, revision, patterns)}` (HF_TOKEN set for a gated model), "
        "or point the option at a local folder"
    )


def local_folder(value: str, revision: str, patterns: tuple[str, ...], where: str) -> tuple[str, str]:
    """``(folder, commit)`` for an option's value: a local path as it is (commit ``""``),
    a Hub id as its cached snapshot. Raises :class:`HubNotCached` otherwise."""
    if not is_hub_id(value):
        return value, ""
    snapshot = cached(value, revision)
    if snapshot is None:
        raise HubNotCached(not_cached(value, revision, patterns, where))
    return str(snapshot.path), snapshot.commit


def download(repo_id: str, revision: str, patterns: tuple[str, ...], where: str) -> None:
    """Put ``repo_id`` at ``revision`` into the cache unless it is there, or offline
    (the rules then say how to download it). A cached revision is used as it is: the
    Hub is not asked whether a branch moved (``hf download`` refreshes it)."""
    revision = revision or DEFAULT_REVISION
    if not is_hub_id(repo_id) or offline() or cached(repo_id, revision) is not None:
        return
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
