"""Built-in attention backends: ``sdpa``, ``flex`` and ``eager``.

Each backend is a class constructed as ``cls(options)`` with ``prepare(doc_ids, seq_len,
device)`` (called once per model forward; the result is shared by every layer) and
``attend(q, k, v, prepared)``. Registration lives in :mod:`.plugin`, which imports no
torch so that ``forge-run check`` stays fast.
"""
