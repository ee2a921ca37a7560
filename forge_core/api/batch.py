"""The keys of a batch and the ignore label: the one definition every packer, model,
strategy and the trainer refer to.

A packer returns ``{INPUT_IDS, LABELS}`` plus the per-token metadata its spec emits
(``DOC_IDS``, ``POSITIONS``); the trainer passes every key but ``LABELS`` to the model
as keyword arguments. A label of ``IGNORE_INDEX`` takes no loss (padding, and the EOS of
a document whose next token belongs to another document).
"""

from __future__ import annotations

#: The batch key of the token ids a model reads.
INPUT_IDS = "input_ids"
#: The batch key of each token's target (the next token, or :data:`IGNORE_INDEX`).
LABELS = "labels"
# Per-token metadata the built-ins know about. Third-party packers may emit others; the
# rule engine treats every key the same way.
#: Per-token metadata: the document each token belongs to, numbered within its row.
DOC_IDS = "doc_ids"
#: Per-token metadata: each token's position within its document.
POSITIONS = "positions"
#: The label that takes no loss (PyTorch's ``cross_entropy`` default ``ignore_index``).
IGNORE_INDEX = -100
