"""Context parallelism's pieces that need no process group: the batch transform, the
strategy's declaration and its check-time rules."""

from __future__ import annotations

import pytest
import torch

from forge_core.api import DOC_IDS, INPUT_IDS, LABELS, POSITIONS
from forge_core.testing import check_rule
from forge_plugins.context_parallel import rules as R
from forge_plugins.context_parallel.shard import shard_batch

MODEL = {"name": "llama", "options": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}}


def packed_batch(rows: int = 3, seq_len: int = 16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    starts = (torch.rand(rows, seq_len, generator=gen) < 0.25).long()
    starts[:, 0] = 1
    doc_ids = starts.cumsum(1) - 1
    index = torch.arange(seq_len).expand(rows, seq_len)
    first = torch.where(starts.bool(), index, torch.zeros_like(index)).cummax(1).values
    ids = torch.randint(0, 50, (rows, seq_len), generator=gen)
    return {INPUT_IDS: ids, LABELS: ids.roll(-1, 1), DOC_IDS: doc_ids, POSITIONS: index - first}


@pytest.mark.parametrize("balance", ["zigzag", "documents"])
@pytest.mark.parametrize("cp", [2, 4])
def test_the_shards_of_a_row_hold_every_token_once_with_its_metadata(cp, balance):
    batch = packed_batch()
    shards = [shard_batch(batch, rank, cp, balance) for rank in range(cp)]
    assert all(s[INPUT_IDS].shape == (3, 16 // cp) for s in shards)
    # Every (token, label, document, position) of a row appears in exactly one shard.
    for row in range(3):
        whole = sorted(zip(*(batch[k][row].tolist() for k in (DOC_IDS, POSITIONS, INPUT_IDS, LABELS))))
        held = sorted(
            t
            for s in shards
            for t in zip(*(s[k][row].tolist() for k in (DOC_IDS, POSITIONS, INPUT_IDS, LABELS)))
        )
        assert held == whole


def test_rows_without_positions_get_their_row_positions():
    ids = torch.arange(32).view(2, 16)
    shard = shard_batch({INPUT_IDS: ids, LABELS: ids}, 1, 2, "documents")
    # zigzag (no doc_ids): rank 1 of 2 holds chunks 1 and 2 of 4.
    assert shard[POSITIONS].tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]] * 2
    assert torch.equal(shard[INPUT_IDS], ids.gather(1, shard[POSITIONS]))


def base(**more):
    return {"model": MODEL, "data": {"packer": "bfd", "seq_len": 32}, "parallel": {"cp": 2}, **more}


def test_seq_len_must_split_into_2cp_chunks(tmp_path):
    check_rule(
        R.CP_SEQ_LEN,
        violating=[base(data={"packer": "bfd", "seq_len": 30})],
        passing=[base(), {**base(data={"packer": "bfd", "seq_len": 30}), "parallel": {"cp": 1}}],
        world_size=2,
    )


def test_allgather_needs_a_backend_that_declares_query_shards(tmp_path):
    from forge_core.api import AttentionBackendSpec, hookimpl

    class Plugin:
        @staticmethod
        @hookimpl
        def forge_attention_backends():
            return [
                AttentionBackendSpec(
                    name="square_only",
                    summary="a backend without prepare_queries",
                    impl="forge_plugins.attention.sdpa:SdpaAttention",
                    honours={DOC_IDS},
                )
            ]

    ulysses = {"cp": 2, "options": {"cp": {"attention": "ulysses"}}}
    messages = check_rule(
        R.CP_ATTENTION_BACKEND,
        violating=[base(attention={"backend": "square_only"})],
        passing=[base(), {**base(attention={"backend": "square_only"}), "parallel": ulysses}],
        extra_plugins=[("square_only", Plugin)],
        world_size=2,
    )
    assert "does not declare 'query_shards'" in messages[0]


def test_ulysses_needs_heads_that_divide_over_cp_times_tp():
    ulysses = {"options": {"cp": {"attention": "ulysses"}}}
    check_rule(
        R.CP_ULYSSES_HEADS,
        violating=[{**base(), "parallel": {"cp": 4, **ulysses}}],  # 2 key/value heads over 4 ranks
        passing=[{**base(), "parallel": {"cp": 2, **ulysses}}, {**base(), "parallel": {"cp": 4}}],
        world_size=4,
    )
