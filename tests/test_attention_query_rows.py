"""``prepare_queries``: the built-in backends' masks for the queries of some row positions
against the whole row (what a context-parallel rank attends with). Each is proved to be
the rows ``query_index`` of the square mask: the tables, and in float64 the output and
the gradients of ``q``, ``k``, ``v`` against the full attention's rows."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from forge_core.api import NoOptions
from forge_core.testing import doc_ids_from_lengths
from forge_plugins.attention import flex_kernel
from forge_plugins.attention.eager import EagerAttention
from forge_plugins.attention.flex import FlexAttention
from forge_plugins.attention.masks import (
    _row_ids,
    document_causal_mask,
    query_block_mask,
    query_causal_mask,
    query_mask_mod,
)
from forge_plugins.attention.options import FlexOptions, SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention

S = 60  # not a whole number of 16-token flex blocks: the last key block overhangs
#: Documents crossing block boundaries, single-token documents, a last one to the row end.
ROWS = doc_ids_from_lengths(((5, 1, 11, 7, 9, 1, 26), (1, 16, 7, 10, 26)), S)
ZIGZAG = torch.tensor([[*range(0, 15), *range(45, 60)]])  # rank 0 of 2, head-tail split


def _sorted_sample(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(S, generator=torch.Generator().manual_seed(seed))[:n].sort().values


QUERY_INDEX = {
    "zigzag": ZIGZAG,
    "tail": torch.arange(28, S)[None],  # whole query blocks past whole key blocks: full ones
    "scattered": _sorted_sample(27, 1)[None],  # 27: the last query block overhangs
    "per-row": torch.stack([_sorted_sample(30, 2), _sorted_sample(30, 3)]),
    "unsorted": torch.randperm(S, generator=torch.Generator().manual_seed(4))[None, :30],
}


@pytest.fixture
def unfused_flex(monkeypatch):
    """FlexAttention running PyTorch's unfused flex_attention (every dtype, float64
    included) and, with gradients on CPU, the backend's own backward."""
    monkeypatch.setattr(flex_kernel, "compiled", flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield FlexAttention(FlexOptions(block_size=16))


def _backend(name, unfused_flex):
    return {"eager": EagerAttention(NoOptions()), "sdpa": SdpaAttention(SdpaOptions())}.get(
        name
    ) or unfused_flex


def _square_rows(doc_ids, query_index):
    ids, query_index = _row_ids(doc_ids, query_index, S, "cpu")
    square = document_causal_mask(ids, S, "cpu")
    return torch.stack([square[b, 0, query_index[b]] for b in range(ids.shape[0])])[:, None]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "causal"])
@pytest.mark.parametrize("which", QUERY_INDEX)
def test_dense_query_mask_is_the_rows_of_the_square_mask(which, packed):
    doc_ids = ROWS if packed else None
    query_index = QUERY_INDEX[which]
    assert torch.equal(query_causal_mask(doc_ids, query_index, S, "cpu"), _square_rows(doc_ids, query_index))


@pytest.mark.parametrize("block_size", [16, 8])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "causal"])
@pytest.mark.parametrize("which", ["zigzag", "tail", "scattered", "per-row"])
def test_query_block_mask_tables_equal_create_block_mask(which, packed, block_size):
    # The tables built from document starts are exactly what evaluating every entry gives.
    doc_ids = ROWS if packed else None
    query_index = QUERY_INDEX[which]
    built = query_block_mask(doc_ids, query_index, S, "cpu", block_size)
    ids, qi = _row_ids(doc_ids, query_index, S, "cpu")
    batch = None if doc_ids is None and query_index.shape[0] == 1 else ids.shape[0]
    reference = create_block_mask(
        query_mask_mod(ids, qi, block_size), batch, None, qi.shape[1], S, device="cpu", BLOCK_SIZE=block_size
    )
    assert built.shape == reference.shape == (batch or 1, 1, query_index.shape[1], S)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(built, name), getattr(reference, name)), name
    if which == "tail" and not packed:
        assert int(built.full_kv_num_blocks.sum()) > 0  # the full-block path is exercised


def _attention_rows(backend, doc_ids, query_index, rect: bool):
    """Output at the query rows and the gradients of q, k, v of a weighted loss on them."""
    g = torch.Generator().manual_seed(0)
    batch = 2
    q = torch.randn(batch, 4, S, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(batch, 2, S, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in "kv")
    weight = torch.randn(batch, 4, query_index.shape[1], 8, generator=g, dtype=torch.float64)
    rows = query_index.expand(batch, -1)[:, None, :, None].expand(-1, 4, -1, 8)
    if rect:
        out = backend.attend(q.gather(2, rows), k, v, backend.prepare_queries(doc_ids, query_index, S, "cpu"))
    else:
        out = backend.attend(q, k, v, backend.prepare(doc_ids, S, "cpu")).gather(2, rows)
    (out * weight).sum().backward()
    return out.detach(), q.grad.gather(2, rows), k.grad, v.grad


@pytest.mark.numerical
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "causal"])
@pytest.mark.parametrize("which", QUERY_INDEX)
@pytest.mark.parametrize("name", ["eager", "sdpa", "flex"])
def test_attend_with_prepare_queries_equals_the_rows_of_full_attention(name, which, packed, unfused_flex):
    backend = _backend(name, unfused_flex)
    doc_ids = ROWS if packed else None
    rect = _attention_rows(backend, doc_ids, QUERY_INDEX[which], rect=True)
    full = _attention_rows(backend, doc_ids, QUERY_INDEX[which], rect=False)
    for what, got, want in zip(("out", "dq", "dk", "dv"), rect, full):
        assert (got - want).abs().max() <= 1e-12 * want.abs().max(), f"{name} {what}"
    if packed:
        # Control: without document isolation the same rows differ, so the check can fail.
        leaky = _attention_rows(backend, None, QUERY_INDEX[which], rect=True)
        assert (leaky[0] - full[0]).abs().max() > 1e-3


def test_prepare_is_unchanged_for_the_square_case(unfused_flex):
    # The rows of every position are the square mask itself.
    everything = torch.arange(S)[None]
    assert torch.equal(query_causal_mask(ROWS, everything, S, "cpu"), document_causal_mask(ROWS, S, "cpu"))
    assert SdpaAttention(SdpaOptions()).prepare(None, S, "cpu") is None


@pytest.mark.parametrize(
    ("query_index", "match"),
    [
        (torch.tensor([[0, 60]]), r"query_index must hold row positions in \[0, 60\)"),
        (torch.tensor([[-1, 3]]), r"query_index must hold row positions in \[0, 60\)"),
        (torch.zeros(3, 4, dtype=torch.long), r"shape \(1 or 2, queries\)"),
        (torch.zeros(1, 4), r"LongTensor"),
        (torch.zeros(4, dtype=torch.long), r"LongTensor of shape"),
    ],
)
@pytest.mark.parametrize("build", [query_causal_mask, query_block_mask])
def test_query_masks_refuse_a_query_index_that_is_not_row_positions(build, query_index, match):
    with pytest.raises(ValueError, match=match):
        build(ROWS, query_index, S, "cpu")
