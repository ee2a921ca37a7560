"""The keys of a batch and the ignore label: the one definition every packer, model,
strategy and the trainer refer to.

A packer returns ``{INPUT_IDS, LABELS}`` plus the per-token metadata its spec emits
(``DOC_IDS``, ``POSITIONS``); the trainer passes every key but ``LABELS`` to the model
as keyword arguments. A label of ``IGNORE_INDEX`` takes no loss (padding, and the EOS of
a document whose next token belongs to another document).
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
LABELS = "labels"
#: Per-token metadata the built-ins know about. Third-party packers may emit others; the
#: rule engine treats every key the same way.
DOC_IDS = "doc_ids"
POSITIONS = "positions"
#: The label that takes no loss (PyTorch's ``cross_entropy`` default ``ignore_index``).
IGNORE_INDEX = -100
