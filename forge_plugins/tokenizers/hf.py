"""The ``hf`` tokenizer: any Hugging Face tokenizer from a local directory, or by Hub id
from the local Hugging Face cache (:mod:`forge_plugins.hub`; ``forge-run train`` downloads
an uncached one first, :func:`fetch`).

Loaded with ``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True,
trust_remote_code=False)``: Forge never runs code from a model folder. A folder that asks
for its own code (an ``auto_map`` in ``tokenizer_config.json``, or an ``AutoTokenizer``
entry in the ``auto_map`` of ``config.json``) is refused before transformers sees it, and
so is a folder without tokenizer files (:func:`folder_problem`, which needs no
transformers).
``encode`` adds no special tokens (no BOS; the pipeline appends EOS itself).
``vocab_size`` is ``len(tokenizer)`` (added tokens included); ``eos_id`` is the
tokenizer's EOS (an error if it has none); ``pad_id`` its PAD, or EOS when it has no
PAD. ``identity`` is a hash of everything that decides token ids: the full serialized
fast tokenizer (vocabulary, merges, normalizer, pre-tokenizer, added tokens) or, for a
slow tokenizer, its vocabulary; plus the EOS and PAD ids.
``encode_chat`` renders a conversation with the folder's ``chat_template`` (or a
template file) and says which tokens take a loss (:mod:`forge_plugins.tokenizers.chat`;
a fast tokenizer is needed: the mask comes from its character offsets); ``render_chat``
gives the rendered text (``forge-run sample --chat`` encodes it: special tokens written
in the text are read as themselves). ``decode`` skips special tokens, ``decode_special``
writes them out (``forge-run preview``).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.unstable import METADATA_LIMIT, FileRefused, read_small_text
from forge_plugins import hub
from forge_plugins.tokenizers.options import HFOptions

#: What a tokenizer folder must hold one of: a fast tokenizer's serialization, or a slow
#: tokenizer's vocabulary (BPE, WordPiece, SentencePiece, tiktoken).
FAST_FILE = "tokenizer.json"
VOCAB_FILES = ("vocab.json", "vocab.txt")
VOCAB_SUFFIXES = (".model", ".tiktoken")


def _json(path: str) -> Any:
    """A small JSON file of the folder, ``None`` when absent or not JSON (transformers
    then says why); :class:`~forge_core.api.files.FileRefused` when it is no regular
    file (a FIFO would hang transformers too)."""
    try:
        return json.loads(read_small_text(path, METADATA_LIMIT, os.path.basename(path)))
    except (OSError, ValueError, RecursionError):
        return None


def folder_problem(path: str) -> str | None:
    """Why ``path`` cannot be loaded as a Hugging Face tokenizer without running code
    from it, or ``None``. Reads only file names and two small JSON files."""
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return f"{path!r} cannot be read ({exc.strerror or exc})"
    for file, key in (("tokenizer_config.json", None), ("config.json", "AutoTokenizer")):
        try:
            data = _json(os.path.join(path, file)) if file in names else None
        except FileRefused as exc:
            return str(exc)
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if auto_map and (key is None or (isinstance(auto_map, dict) and key in auto_map)):
            return (
                f"{os.path.join(path, file)} names custom tokenizer code "
                f"(auto_map: {json.dumps(auto_map)[:200]}). "
                "Forge never runs code from model folders (it loads them with trust_remote_code=False). "
                "Use a tokenizer that needs no custom code, for example one saved as tokenizer.json "
                "by the `tokenizers` library or trained by `forge-run prepare --train-bpe`."
            )
    if FAST_FILE in names or any(n in VOCAB_FILES or n.endswith(VOCAB_SUFFIXES) for n in names):
        return None
    found = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "") if names else "nothing"
    return (
        f"{path!r} holds no tokenizer files (found: {found}). A Hugging Face tokenizer folder needs "
        f"{FAST_FILE} (what save_pretrained writes for a fast tokenizer) or a slow tokenizer's "
        "vocabulary: vocab.json with merges.txt, vocab.txt, a SentencePiece *.model or a *.tiktoken file."
    )


def chat_template_source(path: str) -> str | None:
    """The folder's own chat template, read without transformers (``chat_template.jinja``,
    a regular file of at most ``TEMPLATE_BYTES``, else ``chat_template`` of
    ``tokenizer_config.json``, a named list's ``default``)."""
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        from forge_core.api.unstable import FileRefused, read_small_text
        from forge_plugins.tokenizers.chat import TEMPLATE_BYTES

        try:
            return read_small_text(jinja, TEMPLATE_BYTES, "the chat template")
        except FileRefused as exc:
            raise ForgeError(f"{exc}.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ForgeError(
                f"{jinja}: cannot read the chat template ({getattr(exc, 'strerror', None) or exc})."
            ) from None
    config = _json(os.path.join(path, "tokenizer_config.json"))
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def load_pretrained(path: str) -> Any:
    """``AutoTokenizer`` from a local folder, offline, never running the folder's code."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


WHERE = "data.tokenizer_options.path"


def local_dir(options: HFOptions) -> str:
    """The folder ``path`` names: itself, or a Hub id's cached snapshot at ``revision``
    (raises :class:`~forge_plugins.hub.HubNotCached`, with the download command)."""
    return hub.local_folder(options.path, options.revision, hub.TOKENIZER_FILES, WHERE)[0]


def fetch(options: HFOptions) -> None:
    """The spec's ``fetch``: download a Hub id's tokenizer files unless cached or offline."""
    hub.download(options.path, options.revision, hub.TOKENIZER_FILES, WHERE)


def options_problem(options: HFOptions) -> str | None:
    """:func:`tokenizer_dir_problem` of the folder the options name (a Hub id's cached
    snapshot), or why there is none."""
    if options.revision != hub.DEFAULT_REVISION and not hub.is_hub_id(options.path):
        return (
            f"data.tokenizer_options.revision={options.revision!r} with the local directory "
            f"{options.path!r}: a revision chooses a snapshot of a Hub id; remove revision, or give "
            "path as org/name"
        )
    try:
        return tokenizer_dir_problem(local_dir(options))
    except hub.HubNotCached as exc:
        return str(exc)


def tokenizer_dir_problem(path: str) -> str | None:
    """Why ``data.tokenizer_options.path`` cannot be loaded, from the file system alone
    (no transformers import), or ``None``. Shared by the build and ``forge-run check``."""
    where = WHERE
    if not path:
        return (
            f"{where} is empty: give the directory of a Hugging Face "
            "tokenizer (for example one trained by `forge-run prepare`)."
        )
    if not os.path.isdir(path):
        what = "it is a file" if os.path.exists(path) else "it does not exist"
        return f"{where}: {path!r} is not a directory ({what})."
    problem = folder_problem(path)
    return None if problem is None else f"{where}: {problem}"


class HFTokenizer:
    def __init__(self, options: Any) -> None:
        problem = options_problem(options)
        if problem:
            raise ForgeError(problem)
        path = local_dir(options)
        try:
            tok = load_pretrained(path)
        except (OSError, ValueError) as exc:
            raise ForgeError(f"{path}: cannot load a Hugging Face tokenizer ({exc}).") from None
        if tok.eos_token_id is None:
            raise ForgeError(
                f"{path}: the tokenizer has no EOS token; Forge ends every document with "
                "one. Set `eos_token` in its tokenizer_config.json."
            )
        self.path = path
        self.tokenizer = tok
        self.vocab_size = len(tok)
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        self.identity = f"hf:{_fingerprint(tok)}:eos={self.eos_id}:pad={self.pad_id}"

    @classmethod
    def load(cls, directory: str) -> HFTokenizer:
        """The tokenizer ``save`` wrote to ``directory`` (a run keeps its own copy)."""
        return cls(HFOptions(path=str(directory)))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False, verbose=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # verbose=False: documents longer than the model's max length are expected here.
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def decode_special(self, ids: Any) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode_chat(
        self, messages: list[dict[str, Any]], *, train_from: int = 0, template: str | None = None
    ) -> Any:
        """``messages`` rendered by the chat template (``template``: a file, else the
        folder's own), as a MaskedDocument whose trainable tokens are the assistant's."""
        from forge_plugins.tokenizers.chat import encode_chat

        return encode_chat(self._template(template), messages, train_from, self._encode_offsets)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        template: str | None = None,
    ) -> str:
        """``messages`` as the chat template (``template``: a file, else the folder's own) renders them."""
        return self._template(template).render(messages, add_generation_prompt)[0]

    def chat_identity(self, template: str | None = None) -> str:
        """A hash of the chat template ``encode_chat`` renders with (it keys the token cache)."""
        return hashlib.sha256(self._template(template).source.encode()).hexdigest()[:16]

    def _template(self, path: str | None) -> Any:
        from forge_plugins.tokenizers.chat import ChatTemplate, read_template

        cached = getattr(self, "_chat", None)
        if cached is not None and cached[0] == path:
            return cached[1]
        variables = {k: v for k, v in self.tokenizer.special_tokens_map.items() if isinstance(v, str)}
        if path:
            template = ChatTemplate(read_template(path), path, variables)
        else:
            source = self.tokenizer.chat_template
            if isinstance(source, dict):  # named templates: the default one
                source = source.get("default")
            if not source:
                raise ForgeError(
                    f"{self.path}: the tokenizer has no chat template (no chat_template in "
                    "tokenizer_config.json, no chat_template.jinja). Set data.chat.template to a "
                    "Jinja template file."
                )
            template = ChatTemplate(source, f"{self.path} (its chat_template)", variables)
        self._chat = (path, template)
        return template

    def _encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        if not getattr(self.tokenizer, "is_fast", False):
            raise ForgeError(
                f"{self.path}: a slow tokenizer gives no character offsets, which the assistant mask "
                "is computed from. Use a fast tokenizer (a folder with tokenizer.json)."
            )
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return enc["input_ids"], [start for start, _ in enc["offset_mapping"]]

    def save(self, directory: str) -> None:
        self.tokenizer.save_pretrained(directory)

    def save_hf(self, directory: str) -> None:
        """The Hugging Face files (what ``save`` writes), for ``export-hf``."""
        self.save(directory)


def _fingerprint(tok: Any) -> str:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str()
    else:
        blob = json.dumps(sorted(tok.get_vocab().items()))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
