"""Options of the built-in tokenizers. Light on purpose: imported by ``forge-run check``."""

from __future__ import annotations

import attrs

from forge_core.api import non_blank, option, path_fits


@attrs.frozen
class HFOptions:
    path: str = option(
        "",
        "Local directory of a Hugging Face tokenizer (what `save_pretrained` "
        "writes, or a BPE tokenizer trained by `forge-run prepare`), or a Hub id "
        "(org/name, when no such local path exists) found in the Hugging Face cache and "
        "downloaded into it by `forge-run train` unless HF_HUB_OFFLINE is set (tokenizer "
        "files only). Loaded with `transformers.AutoTokenizer`, offline and with "
        "`trust_remote_code=False`: a folder that needs its own code (an `auto_map`) is "
        "refused.",
        path_fits,
    )
    revision: str = option(
        "main",
        "The branch, tag or commit of a Hub id `path` (not used for a local directory).",
        non_blank,
    )
