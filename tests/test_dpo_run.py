"""A DPO run end to end: the `Preference training (DPO)` section of docs/fine-tuning.md
played as a reader pastes it (``forge-run`` in process on a tiny preference JSONL
rendered by a chat template, pairs packed several to a row by bfd). Its own checks are
the proof: the first loss is log 2 (policy == reference), the reward accuracy and the
margin rise on a learnable preference, the evaluation goes through the objective and
generalises to held-out prompts, and the layouts DPO cannot run under are refused."""

from __future__ import annotations

from pathlib import Path

from doc_chapters import code_blocks, play

PAGE = Path(__file__).resolve().parent.parent / "docs" / "fine-tuning.md"
TITLE = "## Preference training (DPO)"


def section() -> str:
    text = PAGE.read_text()
    assert TITLE in text, f"{PAGE} has no {TITLE!r} section"
    body = text.split(TITLE, 1)[1]
    return TITLE + body.split("\n## ", 1)[0]


def test_the_dpo_section_has_runnable_commands():
    blocks = code_blocks(section(), "docs/fine-tuning.md")
    assert sum(b.runnable and b.lang == "console" for b in blocks) >= 2
    assert sum(b.runnable and b.lang == "python" for b in blocks) >= 2


def test_the_dpo_section_runs_as_pasted(tmp_path):
    play(section(), tmp_path, "docs/fine-tuning.md#preference-training-dpo")
