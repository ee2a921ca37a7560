"""Options of the built-in tokenizers. Light on purpose: imported by ``forge-run check``."""

from __future__ import annotations

import attrs

from forge_core.api import option, path_fits


@attrs.frozen
class HFOptions:
    path: str = option(
        "",
        "Local directory of a Hugging Face tokenizer (what `save_pretrained` "
        "writes, or a BPE tokenizer trained by `forge-run prepare`). Loaded with "
        "`transformers.AutoTokenizer`, offline and with `trust_remote_code=False`: a "
        "folder that needs its own code (an `auto_map`) is refused.",
        path_fits,
    )
