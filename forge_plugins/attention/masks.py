"""Attention masks built from per-token document ids, shared by the built-in backends.

``doc_ids`` is a LongTensor ``(batch, seq)``; ``doc_ids[b, i]`` is the number of EOS
tokens strictly before ``i`` in row ``b``, so it never decreases along a row. A query
attends to a key when the key is not in its future and both carry the same document id.

Memory, per batch row of length ``S``:

- :func:`document_causal_mask` (dense, used by ``sdpa`` and ``eager``): ``S^2`` booleans,
  64 MiB at ``S = 8192``.
- :func:`document_block_mask` (``flex``): four int32 tables of about ``(S / 128)^2``
  entries each (kv and q indices, partial and full blocks), about 64 KiB at ``S = 8192``.
  It is built from per-block first/last document ids without ever materialising the
  ``S x S`` mask (``create_block_mask`` would evaluate every entry once).

Context parallelism gives a rank the queries of some row positions only
(``query_index (B or 1, Sq)``, ascending) against the keys of the whole row: the
rectangular masks :func:`query_causal_mask` (dense ``(B, 1, Sq, S)``) and
:func:`query_block_mask` (a ``BlockMask`` with ``Q_LEN = Sq``, ``KV_LEN = S``) are the
rows ``query_index`` of the square ones.
"""

from __future__ import annotations

from typing import Any

import torch


def check_doc_ids(doc_ids: torch.Tensor, seq_len: int) -> None:
    if doc_ids.dim() != 2 or doc_ids.shape[1] != seq_len:
        raise ValueError(
            f"doc_ids must have shape (batch, {seq_len}), got {tuple(doc_ids.shape)}: pass the "
            "packer's doc_ids for the same rows as input_ids"
        )


def causal_mask(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """Boolean ``(1, 1, S, S)`` mask, True where a query may attend to a key."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]


def document_causal_mask(doc_ids: torch.Tensor, seq_len: int, device: torch.device | str) -> torch.Tensor:
    """Block-diagonal causal boolean mask ``(B, 1, S, S)``: causal and same document.

    The diagonal is always True, so no query row is fully masked (no NaN from softmax).
    """
    check_doc_ids(doc_ids, seq_len)
    doc_ids = doc_ids.to(device)
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same_doc & causal_mask(seq_len, device)[0])[:, None]


def causal_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return q_idx >= kv_idx


def document_mask_mod(doc_ids: torch.Tensor):
    """FlexAttention ``mask_mod``: causal and same document."""

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    return mask_mod


def _block_edges(doc_ids: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last document id of every block of ``block_size`` tokens, ``(B, nblocks)``."""
    seq_len = doc_ids.shape[1]
    starts = torch.arange(0, seq_len, block_size, device=doc_ids.device)
    ends = torch.clamp(starts + block_size, max=seq_len) - 1
    return doc_ids[:, starts], doc_ids[:, ends]


def _compact(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, nq, nkv)`` bool -> (count ``(B, 1, nq)``, ascending indices first ``(B, 1, nq, nkv)``)."""
    counts = selected.sum(-1, dtype=torch.int32)
    # A stable descending sort of the 0/1 flags lists the selected blocks first, in order.
    indices = torch.argsort(selected.to(torch.int8), dim=-1, descending=True, stable=True)
    return counts[:, None], indices.to(torch.int32)[:, None]


def document_block_mask(
    doc_ids: torch.Tensor | None,
    seq_len: int,
    device: torch.device | str,
    block_size: int = 128,
):
    """FlexAttention ``BlockMask`` for causal attention within documents.

    ``doc_ids=None`` gives the plain causal mask (batch dimension 1, broadcast). With
    non-decreasing ``doc_ids`` (the packer contract) the block tables come from the first
    and last document id of every block in ``O(S + (S/block)^2)``; other ids fall back
    to ``create_block_mask``, which evaluates the mask entry by entry.
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    if doc_ids is None:
        # One document spanning the row gives exactly the causal block structure; the
        # mask is broadcast over the batch, so its mask_mod must not index by batch.
        ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
        mask_mod = causal_mask_mod
    else:
        check_doc_ids(doc_ids, seq_len)
        ids = doc_ids = doc_ids.to(device)
        mask_mod = document_mask_mod(doc_ids)
        if not bool((doc_ids[:, 1:] >= doc_ids[:, :-1]).all()):
            return create_block_mask(
                mask_mod,
                doc_ids.shape[0],
                None,
                seq_len,
                seq_len,
                device=doc_ids.device,
                BLOCK_SIZE=block_size,
            )
    first, last = _block_edges(ids, block_size)
    nblocks = first.shape[1]
    q_blk = torch.arange(nblocks, device=ids.device)[:, None]
    kv_blk = torch.arange(nblocks, device=ids.device)[None, :]
    below = (kv_blk < q_blk)[None]
    # Ids never decrease, so a key block before a query block shares a document with it
    # exactly when its last id reaches the query block's first id, and every pair shares
    # one when its first id already equals the query block's last id.
    touches = below & (last[:, None, :] >= first[:, :, None])
    full = below & (first[:, None, :] == last[:, :, None])
    if seq_len % block_size:
        # Like create_block_mask: a block that overhangs the row end is never "full", so
        # the kernel applies mask_mod (and its bounds check) there. Only the last query
        # block can pair with it: the last key block is below no query block.
        full[:, -1, :] = False
    diagonal = (kv_blk == q_blk)[None].expand_as(touches)
    partial = (touches & ~full) | diagonal
    kv_num, kv_idx = _compact(partial)
    full_num, full_idx = _compact(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(seq_len, seq_len),
    )


def block_mask_bytes(block_mask: Any) -> int:
    """Bytes held by a BlockMask's tensors (its memory cost)."""
    total = 0
    for name in (
        "kv_num_blocks",
        "kv_indices",
        "full_kv_num_blocks",
        "full_kv_indices",
        "q_num_blocks",
        "q_indices",
        "full_q_num_blocks",
        "full_q_indices",
    ):
        tensor = getattr(block_mask, name, None)
        if tensor is not None:
            total += tensor.numel() * tensor.element_size()
    return total


# --- rectangular masks: the queries at some row positions against the whole row -----


def check_query_index(query_index: torch.Tensor, doc_ids: torch.Tensor | None, seq_len: int) -> None:
    batch = None if doc_ids is None else doc_ids.shape[0]
    if (
        query_index.dim() != 2
        or query_index.dtype != torch.long
        or (batch is not None and query_index.shape[0] not in (1, batch))
    ):
        rows = "1" if batch is None else f"1 or {batch}"
        raise ValueError(
            f"query_index must be a LongTensor of shape ({rows}, queries), got {query_index.dtype} "
            f"{tuple(query_index.shape)}: pass the row positions of this rank's queries"
        )
    if query_index.numel() and not (0 <= int(query_index.min()) and int(query_index.max()) < seq_len):
        raise ValueError(f"query_index must hold row positions in [0, {seq_len}), got {query_index.tolist()}")


def _row_ids(doc_ids: torch.Tensor | None, query_index: torch.Tensor, seq_len: int, device) -> tuple:
    """``(doc_ids, query_index)`` on ``device`` with one batch size (1 when both broadcast);
    no ``doc_ids`` is one document spanning the row."""
    query_index = query_index.to(device)
    if doc_ids is None:
        return torch.zeros(query_index.shape[0], seq_len, dtype=torch.long, device=device), query_index
    check_doc_ids(doc_ids, seq_len)
    doc_ids = doc_ids.to(device)
    return doc_ids, query_index.expand(doc_ids.shape[0], -1)


def query_causal_mask(
    doc_ids: torch.Tensor | None, query_index: torch.Tensor, seq_len: int, device: torch.device | str
) -> torch.Tensor:
    """Boolean ``(B, 1, Sq, S)``: the query at row position ``query_index[b, t]`` may attend
    key ``j`` when ``j`` is not in its future and (with ``doc_ids``) in its document.
    Equals ``document_causal_mask(...)[:, :, query_index[b]]`` row by row."""
    check_query_index(query_index, doc_ids, seq_len)
    doc_ids, query_index = _row_ids(doc_ids, query_index, seq_len, device)
    keys = torch.arange(seq_len, device=device)
    past = keys[None, None, :] <= query_index[:, :, None]
    same_doc = doc_ids.gather(1, query_index)[:, :, None] == doc_ids[:, None, :]
    return (past & same_doc)[:, None]


def query_mask_mod(doc_ids: torch.Tensor, query_index: torch.Tensor, block_size: int):
    """FlexAttention ``mask_mod`` for queries at ``query_index``: causal and same document.

    Both tables are padded to whole blocks (repeating their last entry) so that the
    kernel's padded indices of an overhanging block stay in range; the padded results
    are discarded. A table of batch size 1 is read at row 0 for every batch row (the
    mask is broadcast)."""
    q_len, seq_len = query_index.shape[1], doc_ids.shape[1]
    query_index = _pad_last(query_index, -q_len % block_size)
    doc_ids = _pad_last(doc_ids, -seq_len % block_size)
    broadcast = doc_ids.shape[0] == 1

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        row = 0 if broadcast else b
        pos = query_index[row, q_idx]
        return (pos >= kv_idx) & (doc_ids[row, pos] == doc_ids[row, kv_idx])

    return mask_mod


def _pad_last(t: torch.Tensor, extra: int) -> torch.Tensor:
    """``t (B, n)`` with its last column repeated ``extra`` more times."""
    return t if extra <= 0 else torch.cat([t, t[:, -1:].expand(-1, extra)], dim=1)


def query_block_mask(
    doc_ids: torch.Tensor | None,
    query_index: torch.Tensor,
    seq_len: int,
    device: torch.device | str,
    block_size: int = 128,
):
    """FlexAttention ``BlockMask`` (``Q_LEN = Sq``, ``KV_LEN = S``) for the queries at row
    positions ``query_index (B or 1, Sq)`` against the whole row, causal within documents.

    With non-decreasing ``doc_ids`` (or none) and ascending ``query_index`` the tables
    are exact and cost ``O(S + (Sq/block) (S/block) log block)``: the keys a query at
    ``i`` sees are ``[start of its document, i]``, so a key block ``[ks, ke]`` is touched
    by a query block exactly when its first query at or after ``ks`` starts its document
    by ``ke``, and full when every query is at or after ``ke`` in the document of ``ks``.
    Other inputs fall back to ``create_block_mask``.
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    check_query_index(query_index, doc_ids, seq_len)
    ids, query_index = _row_ids(doc_ids, query_index, seq_len, device)
    q_len = query_index.shape[1]
    mask_mod = query_mask_mod(ids, query_index, block_size)
    if doc_ids is None and query_index.shape[0] == 1:
        batch = None  # broadcast over the batch, like the square causal mask
    else:
        batch = ids.shape[0]
    monotone = bool((ids[:, 1:] >= ids[:, :-1]).all()) and bool(
        (query_index[:, 1:] > query_index[:, :-1]).all()
    )
    if not monotone:
        return create_block_mask(
            mask_mod, batch, None, q_len, seq_len, device=ids.device, BLOCK_SIZE=block_size
        )
    # Start of each token's document: ids never decrease, so it is the first position
    # holding the same id.
    doc_start = torch.searchsorted(ids, ids, side="left")
    padded = _pad_last(query_index, -q_len % block_size)
    q_blocks = padded.reshape(padded.shape[0], -1, block_size).contiguous()  # (B, nq, block) ascending
    n_q = q_blocks.shape[1]
    ks = torch.arange(0, seq_len, block_size, device=ids.device)
    ke = torch.clamp(ks + block_size, max=seq_len) - 1
    # First query of each block at or after each key block's start, (B, nq, nkv).
    first_after = torch.searchsorted(q_blocks, ks.expand(*q_blocks.shape[:2], -1).contiguous())
    real = torch.full((n_q,), block_size, device=ids.device)
    real[-1] = q_len - (n_q - 1) * block_size  # the last block may overhang
    exists = first_after < real[None, :, None]
    pos = q_blocks.gather(2, first_after.clamp(max=block_size - 1))
    touches = exists & (doc_start.gather(1, pos.flatten(1)).view_as(pos) <= ke)
    # The padding repeats the last query, so a block's last entry is its last query.
    first_q, last_q = q_blocks[:, :, :1], q_blocks[:, :, -1]
    full = (ke <= first_q) & (ids[:, ks][:, None, :] == ids.gather(1, last_q)[:, :, None])
    if q_len % block_size:
        full[:, -1, :] = False  # an overhanging block gets mask_mod (and its bounds check)
    if seq_len % block_size:
        full[:, :, -1] = False
    kv_num, kv_idx = _compact(touches & ~full)
    full_num, full_idx = _compact(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(q_len, seq_len),
    )


# The BlockMask builders run eagerly even inside torch.compile(model): they inspect
# doc_ids (a data-dependent branch) and return a BlockMask, neither of which a graph
# should capture. torch.compiler.disable imports torch._dynamo (over a second of CPU),
# which the sdpa and eager backends never need, so each is wrapped when first looked up on
# this module (PEP 562), not at import: every caller gets the wrapped function.
_OUTSIDE_GRAPHS = {fn.__name__: fn for fn in (document_block_mask, query_block_mask)}
del document_block_mask, query_block_mask


def __getattr__(name: str) -> Any:
    if name not in _OUTSIDE_GRAPHS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fn = globals()[name] = torch.compiler.disable(_OUTSIDE_GRAPHS[name])
    return fn
