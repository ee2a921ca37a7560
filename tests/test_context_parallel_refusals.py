"""ContextParallelAttention refuses what it cannot run, when it is built (before any
collective). Its numerics over a real cp group are proved under torchrun in
tests/distributed/test_context_parallel_attention.py."""

from __future__ import annotations

import pytest

from forge_core.api import AttentionContext, NoOptions
from forge_plugins.attention.eager import EagerAttention
from forge_plugins.context_parallel.attention import ContextParallelAttention
from forge_plugins.context_parallel.options import ContextParallelOptions


def cp_options(attention: str, balance: str = "zigzag") -> ContextParallelOptions:
    return ContextParallelOptions(attention=attention, balance=balance)


class SquareOnly:
    """A backend with the ordinary protocol only (no ``prepare_queries``)."""

    def prepare(self, doc_ids, seq_len, device):
        return None

    def attend(self, q, k, v, prepared):
        return q


def ctx(mode: str) -> AttentionContext:
    return AttentionContext(group=None, rank=0, size=2, options=cp_options(mode))


def test_an_unknown_cp_attention_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown cp attention 'ring'; known: allgather, ulysses$"):
        ContextParallelAttention(EagerAttention(NoOptions()), ctx("ring"))


def test_allgather_refuses_a_backend_without_rectangular_masks_and_names_ulysses():
    with pytest.raises(ValueError, match=r"SquareOnly has none: use attention 'ulysses'"):
        ContextParallelAttention(SquareOnly(), ctx("allgather"))


def test_ulysses_takes_any_backend_with_the_ordinary_protocol():
    wrapped = ContextParallelAttention(SquareOnly(), ctx("ulysses"))
    assert wrapped.mode == "ulysses" and isinstance(wrapped.backend, SquareOnly)
