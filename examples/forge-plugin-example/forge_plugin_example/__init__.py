"""An example third-party Forge plugin package.

It contributes, through the entry point ``example`` in the group ``forge``:

- the attention backend ``window``: causal sliding-window attention that honours
  ``doc_ids`` (:mod:`.window`);
- the packer ``greedy``: first-fit packing of whole documents that isolates them
  (:mod:`.greedy`);
- the rule ``example.window-covers-row`` (:mod:`.rules`);
- the logger ``csv``: ``metrics.csv`` in the run directory (:mod:`.csv_logger`).

:mod:`.plugin` registers them; it imports no torch, so ``forge-run check`` stays fast.
"""

__version__ = "0.1.0"
