"""Conformance checks for attention backends, and the reference they are held to.

A backend is tested at its own interface (``prepare(doc_ids, seq_len, device)`` then
``attend(q, k, v, prepared)``), so no model is needed. Two properties are checked:

- **agreement with the reference**: :func:`reference_attention`, a plain
  explicit-softmax implementation computed in float64, with and without ``doc_ids``,
  forward (under ``no_grad`` and with autograd) and backward, for grouped-query and
  multi-head shapes; one ``prepare`` result is reused for two ``attend`` calls, as every
  layer of a model reuses it;
- **document isolation** (for a backend that honours ``doc_ids``): in packed rows that
  hold several documents (a one-token document, a row that starts with one, documents
  that end exactly at the row end) each document's outputs, and the gradients of its
  queries, keys and values, equal those of the same document attended on its own; and
  the gradient of one document's outputs is exactly 0 on every other document's
  queries, keys and values. This needs no reference: a backend that lets tokens see
  across documents fails it whatever else it does.

Every check runs in the dtype asked for (float32 by default) and again in float64,
where it is a proof: the two sides of every comparison may differ only by float64
rounding (about 1e-14 of the size of what is compared), so a leak weighing 1e-10 of a
row is caught. Tolerances are derived from the size of what is compared
(:mod:`forge_core.testing.tolerance`), never fixed, because which kernel runs and how
it sums depend on the machine; the gradient that must not reach another document is
checked to be exactly 0, in every dtype. A backend must therefore follow its input
dtype (float64 in, float64 arithmetic); one without a float64 kernel passes
``float64=False`` and is checked in its own dtype only.

Both run on the packed rows ``layouts`` (document lengths per row, :data:`LAYOUTS` by
default); a backend that works in tiles passes longer rows whose documents cross tile
boundaries.

The standalone run places each document at the start of a row of the same length and
attends causally without ``doc_ids`` (upstream gradient zero after the document), so the
backend sees one input shape throughout: a compiled kernel compiles once, not once per
document length. The causal run is itself checked against the reference first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from forge_core.api import DOC_IDS, PairCountingBackend, QueryShardingBackend
from forge_core.testing.resolve import resolve
from forge_core.testing.tolerance import ROUNDING_FACTOR, assert_within_rounding, dtype_name, rms_row_norm

#: Document lengths of the packed rows (each row is filled to its end): 16 tokens each.
LAYOUTS: tuple[tuple[int, ...], ...] = ((5, 1, 6, 4), (1, 9, 6))
#: (query heads, key/value heads): grouped-query, then multi-head attention.
HEAD_SHAPES: tuple[tuple[int, int], ...] = ((4, 2), (2, 2))
HEAD_DIM = 8

MaskMod = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# --- the reference -------------------------------------------------------------------


def reference_mask(
    doc_ids: torch.Tensor | None,
    seq_len: int,
    device: torch.device | str = "cpu",
    mask_mod: MaskMod | None = None,
) -> torch.Tensor:
    """Boolean ``(B or 1, 1, S, S)`` mask, True where query ``i`` may attend to key ``j``:
    ``j <= i``, the same document when ``doc_ids`` is given, and ``mask_mod(i, j)``
    when given (an extra restriction such as a sliding window, evaluated on broadcast
    index tensors)."""
    q_idx = torch.arange(seq_len, device=device)[:, None]
    kv_idx = torch.arange(seq_len, device=device)[None, :]
    allowed = kv_idx <= q_idx
    if mask_mod is not None:
        allowed = allowed & mask_mod(q_idx, kv_idx).to(torch.bool)
    if doc_ids is None:
        return allowed[None, None]
    doc_ids = doc_ids.to(device)
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (allowed[None] & same_doc)[:, None]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    mask_mod: MaskMod | None = None,
) -> torch.Tensor:
    """Causal softmax attention of ``q (B, H, S, D)`` over ``k, v (B, Hkv, S, D)``,
    computed explicitly in float64 and returned in ``q``'s dtype; differentiable.

    Grouped-query attention shares key/value head ``j`` among query heads
    ``j * H/Hkv ... (j + 1) * H/Hkv - 1`` (``repeat_interleave``, the convention of
    SDPA's ``enable_gqa`` and Hugging Face). A query with no key left to attend to gets
    zeros.
    """
    heads, kv_heads, seq_len = q.shape[1], k.shape[1], q.shape[2]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    group = heads // kv_heads
    qd, kd, vd = q.double(), k.double(), v.double()
    if group > 1:
        kd = kd.repeat_interleave(group, dim=1)
        vd = vd.repeat_interleave(group, dim=1)
    scores = (qd @ kd.transpose(-1, -2)) / q.shape[-1] ** 0.5
    mask = reference_mask(doc_ids, seq_len, q.device, mask_mod)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ vd).to(q.dtype)


def doc_ids_from_lengths(layouts: Sequence[Sequence[int]], seq_len: int) -> torch.Tensor:
    """``doc_ids`` ``(rows, seq_len)`` for rows holding documents of the given lengths:
    document ``n`` of a row has id ``n``, as packers number them."""
    if not layouts:
        raise ValueError("layouts must hold at least one row of document lengths")
    rows = []
    for lengths in layouts:
        if sum(lengths) != seq_len or any(n <= 0 for n in lengths):
            raise ValueError(
                f"document lengths {tuple(lengths)} must be positive and add up to seq_len {seq_len}"
            )
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)))
    return torch.stack(rows).long()


def spans(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every document of a row of the given document lengths."""
    out, start = [], 0
    for length in lengths:
        out.append((start, start + length))
        start += length
    return out


def packed_metadata(
    rows: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(doc_ids, positions)``, LongTensors ``(len(rows), S)``, for rows of positive
    document lengths that each sum to the same ``S``, as packers that isolate documents
    emit them: document ``n`` of a row has id ``n``, positions restart at 0 at every
    document."""
    doc_ids = doc_ids_from_lengths(rows, sum(rows[0]) if rows else 0)
    positions = [torch.cat([torch.arange(n) for n in lengths]) for lengths in rows]
    return doc_ids.to(device), torch.stack(positions).to(device)


def lognormal_lengths(seq_len: int, median: float = 512, sigma: float = 1.0, seed: int = 0) -> list[int]:
    """Document lengths drawn log-normally (``median``, ``sigma`` of the log) until they
    fill ``seq_len``; the last document is cut to end the row (for benchmarks and
    long-row tests)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < seq_len:
        length = max(1, int(round(rng.lognormal(np.log(median), sigma))))
        lengths.append(min(length, seq_len - sum(lengths)))
    return lengths


class ReferenceBackend:
    """An attention backend computing :func:`reference_attention` (explicit softmax in
    float64, document masking from ``doc_ids``): what the kit builds models with when it
    checks a model rather than a backend, so the model's own numerics are what is
    proven. ``prepare`` returns the ``doc_ids``; ``attend`` masks with them."""

    def __init__(self, options: Any = None) -> None:
        self.options = options

    def prepare(self, doc_ids: torch.Tensor | None, seq_len: int, device: Any) -> torch.Tensor | None:
        return doc_ids

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Any) -> torch.Tensor:
        return reference_attention(q, k, v, doc_ids=prepared)


# --- running a backend ----------------------------------------------------------------


def available_devices() -> tuple[str, ...]:
    """``("cpu",)`` plus ``"cuda"`` when a GPU is visible."""
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def _construct(impl: Any, options: Any) -> Any:
    if hasattr(impl, "attend") and hasattr(impl, "prepare") and not isinstance(impl, type):
        return impl  # already an instance
    return impl(options)


@torch.no_grad()
def _forward(
    backend: Any, inputs: Sequence[tuple[torch.Tensor, ...]], doc_ids: torch.Tensor | None
) -> list[torch.Tensor]:
    """Outputs for several (q, k, v) triples sharing one ``prepare`` (like model layers)."""
    q0 = inputs[0][0]
    prepared = backend.prepare(doc_ids, q0.shape[2], q0.device)
    return [backend.attend(q.detach(), k.detach(), v.detach(), prepared) for q, k, v in inputs]


def _forward_backward(
    backend: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    doc_ids: torch.Tensor | None,
    where: str,
) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    prepared = backend.prepare(doc_ids, q.shape[2], q.device)
    out = backend.attend(*leaves, prepared)
    _check_output(out, q, where)
    if out.grad_fn is None:
        raise AssertionError(
            f"{where}: attend() returned an output that carries no gradient (it must stay differentiable)"
        )
    (out * grad_out).sum().backward()
    for name, leaf in zip("qkv", leaves):
        if leaf.grad is None:
            raise AssertionError(f"{where}: no gradient reached {name}")
    return (out.detach(), *(leaf.grad for leaf in leaves))


def _reference_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    doc_ids: torch.Tensor | None,
    mask_mod: MaskMod | None,
) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out = reference_attention(*leaves, doc_ids=doc_ids, mask_mod=mask_mod)
    (out * grad_out.double()).sum().backward()
    return (out.detach(), *(leaf.grad for leaf in leaves))


def _check_output(out: Any, q: torch.Tensor, where: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{where}: attend() must return a tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(q.shape):
        raise AssertionError(
            f"{where}: attend() returned shape {tuple(out.shape)}; expected the shape of q, {tuple(q.shape)}"
        )
    if out.dtype != q.dtype:
        raise AssertionError(f"{where}: attend() returned dtype {out.dtype}; expected q's dtype {q.dtype}")
    if out.device != q.device:
        raise AssertionError(
            f"{where}: attend() returned a tensor on {out.device}; expected q's device {q.device}"
        )


# --- the checks ------------------------------------------------------------------------


def _dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32' or torch.bfloat16")
    return value


def _random(
    generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device: str
) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)


def check_attention_backend(
    backend: Any,
    *,
    options: Any = None,
    devices: Iterable[str] = ("cpu",),
    seed: int = 0,
    honours: Iterable[str] | None = None,
    mask_mod: MaskMod | None = None,
    dtype: Any = "float32",
    float64: bool = True,
    rounding_factor: float = ROUNDING_FACTOR,
    layouts: Sequence[Sequence[int]] = LAYOUTS,
    extra_plugins: Iterable[tuple[str, Any]] = (),
    atol: None = None,
    rtol: None = None,
) -> None:
    """Check an attention backend against the contract; raise AssertionError on the
    first violation, naming the backend, device, dtype, head shape and what differs.

    ``backend`` is a registered name, an :class:`~forge_core.api.AttentionBackendSpec`,
    the implementation class or an instance. ``options`` is a mapping or an options
    instance (default: the spec's defaults). ``honours`` overrides the declared
    capabilities (default: the spec's ``honours``; ``{"doc_ids"}`` for a bare class):
    document isolation and agreement with ``doc_ids`` are checked only for a backend
    that honours ``doc_ids``. ``mask_mod(q_idx, kv_idx) -> bool tensor`` restricts the
    reference further for backends that attend to less than everything causal (a
    sliding window: ``lambda q, kv: q - kv < window``). ``devices`` lists where to run
    (see :func:`available_devices`). Every check runs in ``dtype`` and, with
    ``float64`` (the default), again in float64; tolerances follow from the dtype and
    the size of what is compared (:func:`~forge_core.testing.tolerance.rounding_tolerance`),
    ``rounding_factor`` times the one-sum rounding estimate. ``layouts`` gives the packed
    rows as document lengths per row, every row the same total length (e.g. rows longer
    than a tiled kernel's block, with documents crossing blocks).
    """
    if atol is not None or rtol is not None:
        raise ValueError(
            "check_attention_backend no longer takes atol/rtol: tolerances are derived from the dtype and "
            "the size of what is compared (forge_core.testing.tolerance), because fixed ones pass on one "
            "machine and fail on another; pass rounding_factor= (default 16) to scale them"
        )
    resolved = resolve("attention", backend, options, extra_plugins)
    if honours is None:
        honours = resolved.spec.honours if resolved.spec is not None else frozenset({DOC_IDS})
    honours = frozenset(honours)
    dtype = _dtype(dtype)
    dtypes = (dtype, torch.float64) if float64 and dtype != torch.float64 else (dtype,)
    layouts = tuple(tuple(lengths) for lengths in layouts)
    doc_ids = doc_ids_from_lengths(layouts, sum(layouts[0]) if layouts else 0)
    devices = _available(devices)
    instance = _construct(resolved.impl, resolved.options)
    for device in devices:
        device_doc_ids = doc_ids.to(device)
        for run_dtype in dtypes:
            for heads, kv_heads in HEAD_SHAPES:
                where = (
                    f"{resolved.label} on {device}, {dtype_name(run_dtype)}, "
                    f"{heads} query / {kv_heads} key-value heads"
                )
                case = _Case(
                    instance,
                    device,
                    run_dtype,
                    heads,
                    kv_heads,
                    seed,
                    mask_mod,
                    rounding_factor,
                    where,
                    layouts,
                )
                _check_case(case, device_doc_ids if DOC_IDS in honours else None, dtype)
    _counts_its_pairs(instance, resolved.label, doc_ids, DOC_IDS in honours, mask_mod)
    if float64 or dtype == torch.float64:
        _shards_queries(instance, resolved.label, doc_ids, DOC_IDS in honours, mask_mod, seed)


def _available(devices: Iterable[str]) -> tuple[str, ...]:
    devices = tuple(devices)
    for device in devices:
        if torch.device(device).type not in available_devices():
            raise ValueError(
                f"device {device!r} is not available here (available: {', '.join(available_devices())})"
            )
    return devices


def _check_case(case: _Case, doc_ids: torch.Tensor | None, dtype: torch.dtype) -> None:
    """Agreement with the reference, and with ``doc_ids`` (given for a backend that
    honours them) isolation too, on one device, dtype and head shape. An error other
    than a failed check, in float64 only, says how to opt out of float64."""
    try:
        case.agrees_with_reference(doc_ids=None)
        if doc_ids is not None:
            case.isolates_documents(doc_ids)
            case.gradient_stays_in_document(doc_ids)
            case.agrees_with_reference(doc_ids=doc_ids)
    except AssertionError:
        raise
    except Exception as error:
        if case.dtype != torch.float64 or dtype == torch.float64:
            raise
        raise AssertionError(
            f"{case.where}: the backend failed on float64 inputs ({type(error).__name__}: {error}). "
            "The kit proves agreement and isolation in float64, so a backend should compute in "
            "its input's dtype; one without a float64 kernel passes float64=False and is checked "
            f"in {dtype_name(dtype)} only"
        ) from error


def _counts_its_pairs(
    instance: Any, label: str, doc_ids: torch.Tensor, isolates: bool, mask_mod: MaskMod | None
) -> None:
    """A :class:`~forge_core.api.PairCountingBackend` counts the pairs of the reference
    mask, without ``doc_ids`` and, when it isolates documents, with them (what the
    trainer's MFU reads)."""
    if not isinstance(instance, PairCountingBackend):
        return
    rows, seq_len = doc_ids.shape
    for ids in (None, doc_ids) if isolates else (None,):
        allowed = reference_mask(ids, seq_len, mask_mod=mask_mod).expand(rows, 1, seq_len, seq_len)
        expected, got = int(allowed.sum()), instance.attended_pairs(ids, rows, seq_len)
        assert got == expected, (
            f"{label}: attended_pairs({'document ids' if ids is not None else 'None'}, {rows}, {seq_len}) "
            f"returned {got!r}, but its mask allows {expected} query-key pairs (the reference's)"
        )


def _shards_queries(
    instance: Any, label: str, doc_ids: torch.Tensor, isolates: bool, mask_mod: MaskMod | None, seed: int
) -> None:
    """A :class:`~forge_core.api.QueryShardingBackend`'s ``prepare_queries`` mask, for
    the head and tail quarters of every row's queries against the whole row, gives
    those queries the reference's output (in float64)."""
    if not isinstance(instance, QueryShardingBackend):
        return
    rows, seq_len = doc_ids.shape
    doc_ids = doc_ids if isolates else None
    quarter = max(1, seq_len // 4)
    index = torch.cat([torch.arange(quarter), torch.arange(seq_len - quarter, seq_len)])
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, 2, seq_len, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    prepared = instance.prepare_queries(doc_ids, index.expand(rows, -1), seq_len, "cpu")
    out = instance.attend(q[:, :, index], k, v, prepared)
    expected = reference_attention(q, k, v, doc_ids, mask_mod)[:, :, index]
    torch.testing.assert_close(
        out,
        expected,
        msg=lambda m: (
            f"{label}: prepare_queries(doc_ids, query_index, seq_len, device) for the queries "
            f"{index.tolist()} of every row does not give them the reference attention: {m}"
        ),
    )


class _Case:
    """One device, dtype and head shape: random inputs and the checks that use them."""

    def __init__(self, backend, device, dtype, heads, kv_heads, seed, mask_mod, factor, where, layouts):
        self.backend, self.device, self.dtype = backend, device, dtype
        self.mask_mod, self.factor, self.where = mask_mod, factor, where
        self.layouts, self.seq_len = layouts, sum(layouts[0])
        # The longest sums: over the keys of a row (softmax, probabilities times values,
        # gradients of keys and values) and over the head dimension (scores).
        self.terms = max(self.seq_len, HEAD_DIM)
        self.generator = torch.Generator().manual_seed(seed)
        batch = len(layouts)
        self.q_shape = (batch, heads, self.seq_len, HEAD_DIM)
        self.kv_shape = (batch, kv_heads, self.seq_len, HEAD_DIM)
        self.q, self.k, self.v = (
            self.random(self.q_shape),
            self.random(self.kv_shape),
            self.random(self.kv_shape),
        )
        self.grad_out = self.random(self.q_shape)

    def random(self, shape: tuple[int, ...]) -> torch.Tensor:
        # (B, H, S, D) views of (B, S, H, D) storage, as a model's q.transpose(1, 2) gives:
        # a backend must not assume contiguous inputs.
        b, h, s, d = shape
        return _random(self.generator, (b, s, h, d), self.dtype, self.device).transpose(1, 2)

    def close(self, got: torch.Tensor, want: torch.Tensor, what: str, scale: float) -> None:
        assert_within_rounding(
            got, want, dtype=self.dtype, terms=self.terms, what=what, factor=self.factor, scale=scale
        )

    def term_sizes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[float, ...]:
        """Typical size of the terms summed into the output and the gradients of q, k, v
        (``out = sum p v``, ``dv = sum p dO``, ``dq = sum p (dO.v - dO.out) k / sqrt(D)``,
        ``dk`` alike with q): the floor of their tolerances, since a result can cancel
        to 0 (a token that sees only itself has a query gradient of exactly 0)."""
        nq, nk, nv, ng = (rms_row_norm(t) for t in (q, k, v, self.grad_out))
        return nv, ng * nv * nk / HEAD_DIM**0.5, ng * nv * nq / HEAD_DIM**0.5, ng

    def agrees_with_reference(self, doc_ids: torch.Tensor | None) -> None:
        mode = "causal with doc_ids" if doc_ids is not None else "causal without doc_ids"
        where = f"{self.where}, {mode}"
        # Two "layers" share one prepare() result, as in a model forward.
        second = (self.random(self.q_shape), self.random(self.kv_shape), self.random(self.kv_shape))
        outs = _forward(self.backend, [(self.q, self.k, self.v), second], doc_ids)
        for layer, (out, (q, k, v)) in enumerate(zip(outs, [(self.q, self.k, self.v), second])):
            _check_output(out, q, where)
            # Compared with the float64 result itself, not rounded to the backend's dtype.
            want = reference_attention(q.double(), k.double(), v.double(), doc_ids, self.mask_mod)
            what = f"{where}: forward (no_grad, call {layer + 1} on one prepare()) differs from the reference"
            self.close(out, want, what, self.term_sizes(q, k, v)[0])
        got = _forward_backward(self.backend, self.q, self.k, self.v, self.grad_out, doc_ids, where)
        want = _reference_backward(self.q, self.k, self.v, self.grad_out, doc_ids, self.mask_mod)
        sizes = self.term_sizes(self.q, self.k, self.v)
        for name, g, w, size in zip(("output", "grad of q", "grad of k", "grad of v"), got, want, sizes):
            self.close(g, w, f"{where}: {name} (with autograd) differs from the reference", size)

    def _documents(self) -> list[tuple[int, int, int, int]]:
        """(row, document, start, length) of every document of every row."""
        return [
            (row, n, start, end - start)
            for row, lengths in enumerate(self.layouts)
            for n, (start, end) in enumerate(spans(lengths))
        ]

    def _span(self, row: int, n: int, start: int, length: int) -> str:
        return f"row {row}, document {n} (positions {start}..{start + length - 1} of {self.seq_len})"

    def isolates_documents(self, doc_ids: torch.Tensor) -> None:
        packed = _forward_backward(
            self.backend, self.q, self.k, self.v, self.grad_out, doc_ids, f"{self.where}, with doc_ids"
        )
        segments = self._documents()
        batch = self.q.shape[0]
        # Each document alone at the start of a row of the same length, ``batch`` rows at
        # a time so the backend sees the shapes it has already seen (a compiled kernel
        # does not recompile); what follows a document is unrelated random data that
        # causal attention must never let it see.
        results = []
        for first in range(0, len(segments), batch):
            chunk = segments[first : first + batch]
            alone = [self.random(tuple(t.shape)) for t in (self.q, self.k, self.v)]
            grad_alone = torch.zeros_like(self.grad_out)
            for i, (row, _, start, length) in enumerate(chunk):
                for dst, src in zip(alone, (self.q, self.k, self.v)):
                    dst[i, :, :length] = src[row, :, start : start + length]
                grad_alone[i, :, :length] = self.grad_out[row, :, start : start + length]
            results.append(
                (
                    chunk,
                    _forward_backward(
                        self.backend, *alone, grad_alone, None, f"{self.where}, documents alone"
                    ),
                )
            )
        # Outputs first: a leak shows up there as "document n sees an earlier document".
        sizes = self.term_sizes(self.q, self.k, self.v)
        for index, name in enumerate(("output", "grad of q", "grad of k", "grad of v")):
            for chunk, single in results:
                for i, (row, n, start, length) in enumerate(chunk):
                    p, s = packed[index], single[index]
                    self.close(
                        p[row, :, start : start + length],
                        s[i, :, :length],
                        f"{self.where}: document isolation broken at {self._span(row, n, start, length)}: "
                        f"the packed row's {name} differs from the same document attended on its own, so "
                        "tokens attend across documents (is the doc_ids mask from prepare() applied in "
                        "attend()?)",
                        sizes[index],
                    )

    def gradient_stays_in_document(self, doc_ids: torch.Tensor) -> None:
        """The gradient of document ``n``'s outputs (of every row at once) is exactly 0
        on every query, key and value outside document ``n``: a masked probability is
        exactly 0, so this holds in every dtype, and it catches leaks far below any
        rounding tolerance (a mask that only down-weights other documents)."""
        segments = self._documents()
        owner = torch.empty(doc_ids.shape, dtype=torch.long)  # document of every position
        for row, n, start, length in segments:
            owner[row, start : start + length] = n
        for n in range(max(len(lengths) for lengths in self.layouts)):
            inside = torch.zeros(doc_ids.shape, dtype=torch.bool)
            for row, m, start, length in segments:
                if m == n:
                    inside[row, start : start + length] = True
            inside_4d = inside[:, None, :, None].to(self.device)
            grad_out = self.grad_out.masked_fill(~inside_4d, 0.0)
            grads = _forward_backward(
                self.backend, self.q, self.k, self.v, grad_out, doc_ids, f"{self.where}, with doc_ids"
            )[1:]
            for name, grad in zip(("q", "k", "v"), grads):
                outside = grad.detach().masked_fill(inside_4d, 0.0).cpu()
                if not outside.any():
                    continue
                b, h, pos, _ = torch.nonzero(outside)[0].tolist()
                source = next(((r, m, s, length) for r, m, s, length in segments if r == b and m == n), None)
                reached = f"the {name} of position {pos} (document {int(owner[b, pos])}, head {h})"
                if source is None:
                    raise AssertionError(
                        f"{self.where}: row {b} holds no document {n} and gets no upstream gradient in this "
                        f"run, yet {reached} has gradient {outside[b, h, pos].abs().max().item():.3g}: "
                        "rows of the batch are mixed"
                    )
                raise AssertionError(
                    f"{self.where}: document isolation broken at {self._span(*source)}: the gradient of its "
                    f"outputs reaches {reached} with {outside[b, h, pos].abs().max().item():.3g} (largest "
                    f"outside the document {outside.abs().max().item():.3g}), where it must be exactly 0, so "
                    "tokens attend across documents (is the doc_ids mask from prepare() applied in attend() "
                    "and in its backward?)"
                )
