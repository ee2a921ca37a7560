"""An MkDocs hook (``hooks:`` in mkdocs.yml): a code block marked
``<!-- runnable file=PATH -->`` shows ``PATH`` as its title on the site.

The marker is the runnable-docs grammar of ``tests/doc_chapters.py``: an HTML comment on
the line right before a plain fence, which a code host and MkDocs both hide. Here, on
the site only, the comment becomes a title line above the block (``docs/css/forge.css``
joins the two); the Markdown a code host shows is unchanged, and nothing but the site
build reads this module.
"""

from __future__ import annotations

import html
import re

_FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
# A marker line with a ``file=`` word as the last line before a fence (a marker anywhere
# else marks nothing, and tests/doc_chapters.py refuses it).
_MARKER = re.compile(
    r"^<!--[ \t]*runnable\b[^\n]*?\bfile=(?P<path>\S+?)(?:[ \t][^\n]*?)?[ \t]*-->[ \t]*\n\Z", re.M
)


def _title(match: re.Match) -> str:
    return f'<p class="code-title"><code>{html.escape(match.group("path"))}</code></p>\n\n'


def titled(markdown: str) -> str:
    """``markdown`` with a title line (``<p class="code-title">``) before every
    ``file=`` block, in place of its marker; text inside code blocks is left alone."""
    parts, at = [], 0
    for fence in _FENCE.finditer(markdown):
        parts += [_MARKER.sub(_title, markdown[at : fence.start()]), fence.group(0)]
        at = fence.end()
    return "".join(parts) + markdown[at:]


def on_page_markdown(markdown: str, **_: object) -> str:
    return titled(markdown)
