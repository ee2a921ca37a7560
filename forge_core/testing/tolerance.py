"""Tolerances for comparing two computations of one quantity, derived from its size.

Two evaluations of the same mathematics (a packed row with a document mask against a
document run alone, a backend against the float64 reference, one kernel against
another) differ by rounding alone, and how they round depends on the machine: which
CPU kernel runs (AVX2, AVX-512, the portable one), how work is split between threads,
how sums are blocked. A fixed ``atol``/``rtol`` tuned on one machine fails on the next.
The tolerance here is derived from what is compared instead:

    |got - want| <= factor * eps(dtype) * sqrt(terms) * ||row of want||_2

- ``eps(dtype)``: the spacing of the dtype at 1 (``torch.finfo(dtype).eps``).
- ``sqrt(terms)``: a sum of ``n`` terms computed in two orders differs by about
  ``sqrt(n)`` roundings of the size of the terms (the probabilistic bound of Higham
  and Mary, "A new approach to probabilistic rounding error analysis", 2019; the worst
  case ``n`` is never approached by independent roundings). ``terms`` is the longest
  sum in the computation: a model's largest parameter dimension or its sequence
  length, attention's sequence length or head dimension.
- ``||row||``: the norm of the row (last dimension) of the expected value that the
  element sits in. Linear maps and normalisations mix every entry of a token's vector,
  so an entry's rounding error is set by the size of its whole row, not by its own
  value: an entry of 0.33 in an embedding-gradient row of norm 83 is off by 1e-4 in
  float32 on one machine and exactly right on another, which no relative tolerance on
  the entry alone can accept without accepting real errors elsewhere. A row whose
  terms cancel still carries the rounding of its terms (the query gradient of a token
  that sees only itself is exactly 0, computed as a difference of two products of
  ordinary size): the row norm is floored by the root-mean-square row norm of the
  tensor compared, and by ``scale``, the size of the terms summed, where the caller
  knows it (attention's inputs).
- ``factor`` (:data:`ROUNDING_FACTOR`) covers the chain of such sums (forward and
  backward through every layer). Measured on the built-in backends and model (float32
  and float64 at CPU kernel levels ``default``, AVX2 and AVX-512, on one and two
  threads; bf16 and fp16), the largest difference is 0.6 (float32, float64) and 0.9
  (bf16, fp16) times ``eps * sqrt(terms) * ||row||``, so 16 leaves a margin of more
  than 15 while staying orders of magnitude below what a leak across documents or a
  wrong mask produces (a difference of the order of the row itself).

Half-precision inputs (bf16, fp16) are accumulated in fp32 by every sensible kernel,
so their tolerance is the rounding of the stored results, ``eps(dtype)`` per stage,
plus the fp32 accumulation term: ``factor * (eps(dtype) + eps(fp32) * sqrt(terms)) *
||row||``.

What must be exactly zero (the gradient that reaches another document) is checked
exactly, in every dtype: a masked attention probability is ``exp(-inf) = 0``, and
zero times anything is zero whatever the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

#: Multiple of the one-sum rounding estimate a comparison may differ by (see above).
ROUNDING_FACTOR = 16.0


def rounding_tolerance(
    want: torch.Tensor,
    dtype: torch.dtype,
    terms: int,
    factor: float = ROUNDING_FACTOR,
    scale: float = 0.0,
) -> torch.Tensor:
    """Per-element tolerance (float64, broadcastable to ``want``) for a computation in
    ``dtype`` whose longest sum has ``terms`` terms, each of size up to about ``scale``
    (see the module docstring)."""
    if terms < 1:
        raise ValueError(f"terms must be at least 1, got {terms}")
    if factor <= 0 or not math.isfinite(factor):
        raise ValueError(f"the rounding factor must be a positive number, got {factor}")
    eps = torch.finfo(dtype).eps
    if eps > torch.finfo(torch.float32).eps:
        per_row = eps + torch.finfo(torch.float32).eps * math.sqrt(terms)  # fp32 accumulation
    else:
        per_row = eps * math.sqrt(terms)
    want64 = want.detach().to(device="cpu", dtype=torch.float64)
    if want64.dim() == 0:
        return factor * per_row * want64.abs()
    floor = max(rms_row_norm(want64), scale)
    return factor * per_row * want64.norm(dim=-1, keepdim=True).clamp(min=floor)


def longest_sum(model: torch.nn.Module, seq_len: int = 1) -> int:
    """``terms`` for a model: the sums of its forward and backward run over one of its
    parameters' dimensions (matmuls, norms) or over the sequence (attention)."""
    return max([seq_len, *(max(p.shape) for p in model.parameters() if p.dim())])


def assert_within_rounding(
    got: torch.Tensor,
    want: torch.Tensor,
    *,
    dtype: torch.dtype,
    terms: int,
    what: str,
    dims: Sequence[str] | None = None,
    factor: float = ROUNDING_FACTOR,
    scale: float = 0.0,
) -> float:
    """AssertionError naming ``what``, the largest difference, the tolerance and the
    first mismatch when ``got`` and ``want`` differ by more than the rounding of a
    computation in ``dtype`` (:func:`rounding_tolerance`; ``scale``: the size of the terms
    summed, when known). Returns the largest ratio of difference to
    tolerance (below 1 when it passes), for reports."""
    got64, want64 = _as_float64(got, want, what, dims)
    tolerance = rounding_tolerance(want64, dtype, terms, factor, scale).expand_as(want64)
    diff = (got64 - want64).abs()
    bad = diff > tolerance
    if bad.any():
        index = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(
            f"{what}: max |difference| {diff.max().item():.3g} exceeds the rounding tolerance of "
            f"{dtype_name(dtype)} ({factor:g} * eps * sqrt({terms}) * |row|); first mismatch at "
            f"{where(index, dims)}: "
            f"got {got64[index].item():.9g}, expected {want64[index].item():.9g}, "
            f"difference {diff[index].item():.3g} against a tolerance of {tolerance[index].item():.3g} "
            f"(row norm {want64[index[:-1]].norm().item() if want64.dim() else abs(want64.item()):.3g}, "
            f"floored at {max(rms_row_norm(want64), scale):.3g}, the typical row or the size of the terms)"
        )
    nonzero = tolerance > 0
    return (diff[nonzero] / tolerance[nonzero]).max().item() if nonzero.any() else 0.0


def assert_exactly_zero(got: torch.Tensor, what: str, dims: Sequence[str] | None = None) -> None:
    """AssertionError naming ``what``, how many entries are not exactly 0, the largest
    and the first of them."""
    got64 = got.detach().to(device="cpu", dtype=torch.float64)
    nonzero = got64 != 0
    if nonzero.any():
        index = tuple(torch.nonzero(nonzero)[0].tolist())
        raise AssertionError(
            f"{what}: {int(nonzero.sum())} entries are not exactly 0 (largest |value| "
            f"{got64.abs().max().item():.3g}); first at {where(index, dims)}: {got64[index].item():.6g}"
        )


def _as_float64(got, want, what, dims):
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    got64 = got.detach().to(device="cpu", dtype=torch.float64)
    want64 = want.detach().to(device="cpu", dtype=torch.float64)
    if not torch.isfinite(got64).all():
        index = tuple(torch.nonzero(~torch.isfinite(got64))[0].tolist())
        raise AssertionError(f"{what}: non-finite value {got64[index].item()} at {where(index, dims)}")
    return got64, want64


def rms_row_norm(tensor: torch.Tensor) -> float:
    """Root-mean-square norm of the rows (last dimension) of ``tensor``."""
    t = tensor.detach().to(device="cpu", dtype=torch.float64)
    if t.numel() == 0:
        return 0.0
    if t.dim() == 0:
        return abs(t.item())
    return t.norm(dim=-1).square().mean().sqrt().item()


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def where(index: tuple[int, ...], dims: Sequence[str] | None = None) -> str:
    """An index as text: named by ``dims`` when given, else by attention's layout."""
    if dims is not None and len(dims) == len(index):
        return "[" + ", ".join(f"{dim} {i}" for dim, i in zip(dims, index)) + "]"
    if len(index) == 4:
        return f"[batch {index[0]}, head {index[1]}, position {index[2]}, dim {index[3]}]"
    if len(index) == 3:
        return f"[head {index[0]}, position {index[1]} within the document, dim {index[2]}]"
    return str(list(index))
