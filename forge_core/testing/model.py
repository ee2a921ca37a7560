"""Conformance checks for models: what the trainer and the strategies rely on.

:func:`check_model` builds the model with its factory (``build(options, vocab_size=,
attention=)``, as a run does) and checks, each with a specific message on failure:

- **contract**: the built module has what :class:`~forge_core.api.Model` and the
  protocols its spec calls for require (:func:`~forge_core.api.model_contract_gaps`):
  a ``forward`` taking ``input_ids`` and every keyword of the spec's ``accepts``,
  ``parallel_contract()`` when ``supports`` is not empty, ``init_weights()`` with a
  ``pretrained_option``, ``cache``, ``positions`` and ``attention_mask`` keywords beside
  ``new_cache()``. Always checked.

- **backend**: the model computes attention through the backend it is given: every
  forward calls ``attention.prepare(doc_ids, seq_len, device)`` with the ``doc_ids`` it
  received, then ``attention.attend(q, k, v, prepared)`` with what that ``prepare``
  returned; and it answers the trainer's build-time forward (``input_ids`` of shape
  ``(1, 4)``, no metadata, under ``no_grad``, which measures the FLOPs) with logits.
  A model that computes attention itself ignores ``attention.backend`` and the document
  mask, and leaks across documents.
- **isolation**: packed rows give every document the logits and the gradients (of the
  parameters and of the embedding outputs) it gets alone, through the whole model, in
  float64 (:mod:`forge_core.testing.isolation`); the gradient on other documents' tokens
  is exactly 0.
- **routing** (a model whose contract names ``experts``, a mixture of experts): on
  packed rows in float64, every call of each block's ``experts.dispatcher(experts, x,
  indices, weights)`` routes each token to ``k`` distinct experts among
  ``num_experts`` (an assignment dropped by a capacity gives index -1 and weight 0),
  with finite weights that sum to ``experts.weight_sum`` for every token that kept all
  its experts when the module declares one (not ``None``), and returns, for every
  token, the sum over its kept experts of weight times that expert's
  ``compute`` of the token alone (so a dispatcher that sends a token to another expert,
  or loses it, fails). The MoE's own statistics (its balancing losses) couple the
  documents of a batch by definition: check isolation with them off.
- **expert parallel** (the same models): the routed experts split over an
  expert-parallel group of 1 and of 2, emulated in one process
  (:mod:`forge_core.testing.experts`): each rank's copy of the experts module holds its
  block of experts (every parameter sliced along dim 0, ``first_expert``,
  ``local_experts``), each assignment computed by the copy holding its expert; logits
  and every parameter's gradient equal the unsplit model's in float64.
- **tensor parallel** (a model whose contract supplies a plan): for both
  ``sequence_parallel`` values (a model may refuse ``True`` with a ``ForgeError``,
  reported as skipped, and then must not declare ``SEQUENCE_PARALLEL``), every path
  the plan names exists (a block path in at least one block: a model may mix dense and
  mixture-of-experts blocks), and every parameter is sharded by a style or declared
  ``replicated`` or ``partial``, decided by names, with the function the ``tp``
  strategy uses after applying the plan
  (:func:`~forge_core.api.unstable.tensor_parallel_coverage`); no process group is needed.
- **pipeline** (a model whose contract has a split): the stages the registered ``pp``
  strategy cuts (its own ``stages(model, model_name, n_stages)``) run in sequence in
  one process, the metadata keywords passed to every stage, and reproduce the unsplit
  model's logits on packed rows in float64, for 2 stages and (with 3 blocks or more)
  3, whose middle stage holds neither the first nor the last modules.
- **facts**: the spec's ``facts(options)`` agree with the built model (blocks, query
  and key/value heads seen at ``attend``, tied embeddings), and what the spec declares
  in ``supports`` is what ``parallel_contract()`` supplies.

Checks that do not apply (no contract, no plan, one block, no spec) are reported as
skipped, with the reason, in the returned :class:`ModelReport`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from fnmatch import fnmatch
from typing import Any

import attrs
import torch

from forge_core.api import (
    BLOCKS,
    INPUT_IDS,
    OUTPUT_HEAD,
    PIPELINE,
    SEQUENCE_PARALLEL,
    TENSOR_PARALLEL,
    ForgeError,
    TensorParallelPlan,
    blocks_of,
    contract_of,
    model_contract_gaps,
)
from forge_core.api.unstable import tensor_parallel_coverage, tied_parameter_names
from forge_core.testing.attention import ReferenceBackend, packed_metadata
from forge_core.testing.experts import check_expert_parallel
from forge_core.testing.isolation import DEFAULT_ROWS, check_document_isolation
from forge_core.testing.resolve import resolve
from forge_core.testing.tolerance import ROUNDING_FACTOR, assert_within_rounding, dtype_name, longest_sum

CHECKS = ("backend", "routing", "expert_parallel", "isolation", "tensor_parallel", "pipeline", "facts")

#: The stage forward contract, quoted by every pipeline failure.
STAGE_CONTRACT = (
    "a pipeline stage is a shallow copy of the model whose split's `first` modules (on every stage but "
    "the first) and `last` modules (on every stage but the last) are None: without its `first` modules, "
    "forward takes hidden states (batch, seq, dim) in place of input_ids; without its `last` modules it "
    "returns hidden states; doc_ids and positions arrive as keyword arguments on every stage, which builds "
    "its own mask from them (attention.prepare)"
)


@attrs.frozen
class ModelReport:
    """What :func:`check_model` checked: ``checked`` (names from :data:`CHECKS`, and
    ``pipeline[n]`` per stage count), ``skipped`` (name -> why), ``worst`` (per check, the
    largest ratio of a difference to its tolerance), ``facts`` (what the built model
    showed: blocks, heads, kv_heads, tied_embeddings)."""

    checked: tuple[str, ...]
    skipped: dict[str, str]
    worst: dict[str, float]
    facts: dict[str, Any]


class _Probe:
    """The backend the model is built with: records every ``prepare`` and ``attend``
    and delegates to ``inner``. The copies of the model the checks make share it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.prepared: list[tuple[Any, Any]] = []  # (doc_ids given, result)
        self.attended: list[tuple[tuple[int, ...], tuple[int, ...], Any]] = []  # (q shape, k shape, prepared)

    def prepare(self, doc_ids: Any, seq_len: int, device: Any) -> Any:
        result = self.inner.prepare(doc_ids, seq_len, device)
        self.prepared.append((doc_ids, result))
        return result

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Any) -> torch.Tensor:
        self.attended.append((tuple(q.shape), tuple(k.shape), prepared))
        return self.inner.attend(q, k, v, prepared)

    def __deepcopy__(self, memo: dict) -> _Probe:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)


def check_model(
    model: Any,
    *,
    options: Any = None,
    attention: Any = None,
    attention_options: Any = None,
    vocab_size: int = 61,
    rows: Sequence[Sequence[int]] = DEFAULT_ROWS,
    seed: int = 0,
    dtypes: Iterable[Any] = (torch.float64,),
    standalone: str = "exact",
    checks: Iterable[str] = CHECKS,
    pipeline_strategy: str = "pp",
    rounding_factor: float = ROUNDING_FACTOR,
    extra_plugins: Iterable[tuple[str, Any]] = (),
) -> ModelReport:
    """Check a model against the contract (see the module docstring); raise
    AssertionError on the first violation, naming the model and what is wrong.

    ``model`` is a registered name, a :class:`~forge_core.api.ModelSpec` or the factory
    itself; ``options`` a mapping (structured against the spec's options class), an
    options instance, or ``None`` (the defaults; keep the model small). ``attention``:
    the backend the model is built with, as a registered name, spec, class or instance
    (default: the kit's :class:`~forge_core.testing.attention.ReferenceBackend`, explicit
    softmax, so the model's own numerics are proven). ``dtypes``: where the isolation
    check runs (float64 proves; add float32 to see training precision; a backend without
    a float64 kernel, such as compiled flex on CPU, passes ``(torch.float32,)`` and
    ``standalone="prefix"``). ``checks`` selects among :data:`CHECKS`;
    ``pipeline_strategy`` names the registered strategy whose stage builder is used.
    """
    checks = tuple(checks)
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; the model checks are {list(CHECKS)}")
    extra_plugins = tuple(extra_plugins)
    resolved = resolve("model", model, options, extra_plugins)
    spec, label = resolved.spec, resolved.label
    backend = _attention(attention, attention_options, extra_plugins)
    probe = _Probe(backend)
    torch.manual_seed(seed)
    built = _built(resolved, vocab_size, probe)
    if attention is not None:
        label = f"{label} with attention {_name(attention)}"
    checked: list[str] = []
    skipped: dict[str, str] = {}
    worst: dict[str, float] = {}
    seen = _backend_use(built, probe, rows, label)  # always: every other check needs a working forward
    if "backend" in checks:
        checked.append("backend")
    contract = contract_of(built)
    if "routing" in checks:
        why, ratio = _routing(built, contract, rows, seed, label, rounding_factor)
        _record("routing", why, checked, skipped)
        if ratio is not None:
            worst["routing"] = ratio
    if "expert_parallel" in checks:
        why, ratio = check_expert_parallel(built, contract, rows, seed, label, rounding_factor)
        _record("expert_parallel", why, checked, skipped)
        if ratio is not None:
            worst["expert_parallel"] = ratio
    if "isolation" in checks:
        worst["isolation"] = _isolation(built, label, rows, seed, standalone, dtypes, rounding_factor)
        checked.append("isolation")
    if "tensor_parallel" in checks:
        why = _tensor_parallel(built, contract, label, skipped)
        _record("tensor_parallel", why, checked, skipped)
    if "pipeline" in checks:
        why, done, ratio = _pipeline(
            built, contract, spec, label, rows, seed, pipeline_strategy, extra_plugins, rounding_factor
        )
        if why:
            skipped["pipeline"] = why
        checked.extend(done)
        if ratio is not None:
            worst["pipeline"] = ratio
    if "facts" in checks:
        why = _facts(built, contract, spec, resolved.options, seen, label)
        _record("facts", why, checked, skipped)
    return ModelReport(tuple(checked), skipped, worst, seen)


def _built(resolved: Any, vocab_size: int, probe: Any) -> torch.nn.Module:
    """The model the factory builds, checked to be a module that meets the contract."""
    label = resolved.label
    try:
        built = resolved.impl(resolved.options, vocab_size=vocab_size, attention=probe)
    except Exception as error:
        raise AssertionError(
            f"{label}: the factory failed: build(options, vocab_size={vocab_size}, attention=<backend>) "
            f"raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(built, torch.nn.Module):
        raise AssertionError(
            f"{label}: the factory must return a torch.nn.Module, got {type(built).__name__}"
        )
    gaps = model_contract_gaps(built, resolved.spec)
    if gaps:
        raise AssertionError(
            f"{label}: does not meet the model contract (forge_core.api.Model): {'; '.join(gaps)}"
        )
    return built


def _isolation(
    built: Any,
    label: str,
    rows: Sequence[Sequence[int]],
    seed: int,
    standalone: str,
    dtypes: Iterable[Any],
    rounding_factor: float,
) -> float:
    """isolation: every document of a packed row computes as it does alone; the worst
    deviation, as a share of the rounding tolerance."""
    try:
        ratios = check_document_isolation(
            built,
            rows=rows,
            seed=seed,
            standalone=standalone,
            dtypes=tuple(_dtype(d) for d in dtypes),
            rounding_factor=rounding_factor,
        )
    except AssertionError as error:
        raise AssertionError(
            f"{label}: document isolation broken: {error}. The model must pass doc_ids to "
            "attention.prepare and positions to its position encoding (restarting at every document)"
        ) from error
    return max(ratios.values())


def _record(check: str, why_skipped: str | None, checked: list[str], skipped: dict[str, str]) -> None:
    if why_skipped:
        skipped[check] = why_skipped
    else:
        checked.append(check)


def _name(component: Any) -> str:
    if isinstance(component, str):
        return repr(component)
    return repr(getattr(component, "name", None) or getattr(component, "__name__", type(component).__name__))


def _dtype(dtype: Any) -> torch.dtype:
    from forge_core.testing.attention import _dtype as attention_dtype

    return attention_dtype(dtype)


def _attention(attention: Any, options: Any, extra_plugins: tuple) -> Any:
    if attention is None:
        return ReferenceBackend()
    impl_options = resolve("attention", attention, options, extra_plugins)
    impl = impl_options.impl
    if hasattr(impl, "attend") and hasattr(impl, "prepare") and not isinstance(impl, type):
        return impl
    return impl(impl_options.options)


# --- backend --------------------------------------------------------------------------


def _backend_use(
    model: torch.nn.Module, probe: _Probe, rows: Sequence[Sequence[int]], label: str
) -> dict[str, Any]:
    """The backend checks; returns what the forward showed (heads, kv heads)."""
    probe.reset()
    try:
        with torch.no_grad():
            out = model(torch.zeros(1, 4, dtype=torch.long))
    except Exception as error:
        raise AssertionError(
            f"{label}: the trainer's build-time forward failed: model(input_ids of shape (1, 4)) without "
            f"doc_ids/positions, under torch.no_grad(), raised {type(error).__name__}: {error}. The trainer "
            "makes this forward once before training, to measure the FLOPs of attention"
        ) from error
    if not isinstance(out, torch.Tensor) or tuple(out.shape[:2]) != (1, 4) or out.dim() != 3:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise AssertionError(
            f"{label}: forward(input_ids (1, 4)) must return logits (1, 4, vocab), got {shape}"
        )
    doc_ids, positions = packed_metadata(rows)
    input_ids = torch.zeros(doc_ids.shape, dtype=torch.long)
    probe.reset()
    with torch.no_grad():
        model(input_ids, doc_ids=doc_ids, positions=positions)
    if not probe.attended:
        raise AssertionError(
            f"{label}: the forward never called attend() of the attention backend the model was built with "
            "(the factory's `attention` argument), so it computes attention some other way: "
            "attention.backend does not reach it and neither does the document mask, so packed documents "
            "attend to each other. Compute every attention as attention.attend(q, k, v, prepared) with "
            "prepared = attention.prepare(doc_ids, seq_len, device), made once per forward"
        )
    if not probe.prepared:
        raise AssertionError(
            f"{label}: attend() was called but prepare() never was: call attention.prepare(doc_ids, seq_len, "
            "device) once per forward and pass its result to every attend()"
        )
    if not any(given is not None and torch.equal(given.cpu(), doc_ids) for given, _ in probe.prepared):
        got = [None if given is None else tuple(given.shape) for given, _ in probe.prepared]
        raise AssertionError(
            f"{label}: the forward received doc_ids {tuple(doc_ids.shape)} but called attention.prepare() "
            f"with doc_ids {got}: pass the doc_ids keyword to prepare(), or the backend cannot keep packed "
            "documents apart"
        )
    results = [id(result) for _, result in probe.prepared]
    stray = [n for n, (_, _, prepared) in enumerate(probe.attended) if id(prepared) not in results]
    if stray:
        raise AssertionError(
            f"{label}: attend() call(s) {stray} received something prepare() did not return in this forward: "
            "pass every attend() the result of attention.prepare(doc_ids, ...)"
        )
    q_shape, k_shape, _ = probe.attended[0]
    return {
        "heads": q_shape[1],
        "kv_heads": k_shape[1],
        "attend_calls": len(probe.attended),
        "prepare_calls": len(probe.prepared),
    }


# --- routing (mixtures of experts) ------------------------------------------------------


class _RecordingDispatch:
    """Wraps an experts module's dispatcher, keeping every call's arguments and result."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []

    def __call__(self, experts: Any, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> Any:
        out = self.inner(experts, x, indices, weights)
        self.calls.append((x.detach(), indices.detach(), weights.detach(), out.detach()))
        return out


def _one_expert(experts: Any, row: torch.Tensor, expert: int) -> torch.Tensor:
    counts = torch.zeros(experts.local_experts, dtype=torch.long)
    counts[expert - experts.first_expert] = 1
    return experts.compute(row, counts)


def _routing(model, contract, rows, seed, label, factor) -> tuple[str | None, float | None]:
    """The routing check (see the module docstring): ``(why skipped, worst ratio)``."""
    if contract is None or not contract.experts:
        return "the model's contract names no experts (ParallelContract.experts): no mixture of experts", None
    model = copy.deepcopy(model).double()
    holders = [
        block.get_submodule(contract.experts)
        for block in blocks_of(model)
        if _has_submodule(block, contract.experts)
    ]
    if not holders:
        return f"no block holds {contract.experts!r}: every block is dense", None
    recorders = []
    for experts in holders:
        recorders.append(_RecordingDispatch(experts.dispatcher))
        experts.dispatcher = recorders[-1]
    doc_ids, positions = packed_metadata(rows)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 8, doc_ids.shape, generator=generator)
    with torch.no_grad():
        model(input_ids, doc_ids=doc_ids, positions=positions)
    worst = 0.0
    for n, (experts, recorder) in enumerate(zip(holders, recorders)):
        where = f"{label}: experts {contract.experts!r} of MoE block {n}"
        if not recorder.calls:
            raise AssertionError(
                f"{where}: the forward never called experts.dispatcher(experts, x, indices, weights)"
            )
        for x, indices, weights, out in recorder.calls:
            worst = max(worst, _check_routed_call(experts, x, indices, weights, out, where, factor))
    return None, worst


def _has_submodule(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _check_routed_call(experts, x, indices, weights, out, where, factor) -> float:
    total = experts.num_experts
    if indices.dim() != 2 or tuple(weights.shape) != tuple(indices.shape) or indices.shape[0] != x.shape[0]:
        raise AssertionError(
            f"{where}: the dispatcher got x {tuple(x.shape)}, indices {tuple(indices.shape)}, weights "
            f"{tuple(weights.shape)}: indices and weights must be (tokens, k) for x (tokens, dim)"
        )
    bad = (indices < -1) | (indices >= total)
    if bad.any():
        raise AssertionError(
            f"{where}: expert index {int(indices[bad][0])} outside 0..{total - 1} "
            "(or -1 for a dropped assignment)"
        )
    for t, chosen in enumerate(indices.tolist()):
        kept = [e for e in chosen if e >= 0]
        if len(set(kept)) != len(kept):
            raise AssertionError(
                f"{where}: token {t} is routed to experts {chosen}: each token's experts must be distinct"
            )
    dropped_weight = weights[indices < 0]
    if dropped_weight.numel() and dropped_weight.abs().max() > 0:
        raise AssertionError(
            f"{where}: a dropped assignment (index -1) carries weight {float(dropped_weight.abs().max())}"
        )
    if not torch.isfinite(weights).all():
        raise AssertionError(f"{where}: router weights are not finite")
    weight_sum = getattr(experts, "weight_sum", None)
    full = (indices >= 0).all(-1)
    if weight_sum is not None and full.any():
        sums = weights[full].sum(-1)
        off = (sums - weight_sum).abs().max()
        if off > 1e-9 * max(1.0, abs(weight_sum)):
            raise AssertionError(
                f"{where}: a token's weights sum to {float(sums[(sums - weight_sum).abs().argmax()]):.12g}, "
                f"not the {weight_sum:g} the experts module declares (weight_sum)"
            )
    want = torch.zeros_like(out)
    for t, chosen in enumerate(indices.tolist()):
        for j, e in enumerate(chosen):
            if e >= 0:
                want[t] += weights[t, j].to(x.dtype) * _one_expert(experts, x[t : t + 1], e)[0]
    try:
        return assert_within_rounding(
            out,
            want,
            dtype=x.dtype,
            terms=longest_sum(experts) + indices.shape[1],  # the experts' matmuls, then k terms
            what="combined output",
            factor=factor,
        )
    except AssertionError as error:
        raise AssertionError(
            f"{where}: the dispatcher's result is not each token's weighted sum of its experts' compute "
            f"({error}): it sends tokens to other experts, or loses or mixes them"
        ) from error


# --- tensor parallel ------------------------------------------------------------------

#: Styles that prepare a module's inputs or outputs and leave its parameters alone.
_INPUT_OUTPUT_STYLES = ("PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput")


def _resolve_path(module: torch.nn.Module, path: str) -> list[str]:
    """Module paths under ``module`` matching ``path`` (``parallelize_module``'s
    grammar: dotted, each part an fnmatch pattern over child names); a last part may
    name a parameter."""
    found = [("", module)]
    parts = path.split(".")
    for i, token in enumerate(parts):
        nxt = []
        for prefix, mod in found:
            for name, child in mod.named_children():
                if fnmatch(name, token):
                    nxt.append((prefix + name + ".", child))
            if i == len(parts) - 1:
                for name, _ in mod.named_parameters(recurse=False):
                    if fnmatch(name, token):
                        nxt.append((prefix + name + ".", None))
        found = [(p, m) for p, m in nxt if m is not None or i == len(parts) - 1]
    return [p[:-1] for p, _ in found]


def _tensor_parallel(
    model: torch.nn.Module, contract: Any, label: str, refused: dict[str, str]
) -> str | None:
    """The tensor-parallel check; a variant the model refuses with a ForgeError (a plan
    without sequence parallelism only, say) is recorded in ``refused``."""
    if contract is None or contract.tensor_parallel is None:
        return "the model's parallel_contract() supplies no tensor-parallel plan"
    blocks = blocks_of(model)
    prefixes = {id(sub): name for name, sub in model.named_modules()}
    for sequence_parallel in (False, True):
        where = f"{label}: tensor-parallel plan (sequence_parallel={sequence_parallel})"
        try:
            plan = contract.tensor_parallel(sequence_parallel=sequence_parallel)
        except ForgeError as error:
            if not sequence_parallel:
                raise AssertionError(
                    f"{where}: refused ({error}); a plan must exist without sequence parallelism"
                ) from error
            refused[f"tensor_parallel[sequence_parallel={sequence_parallel}]"] = (
                f"refused by the model: {error}"
            )
            continue
        except Exception as error:
            raise AssertionError(
                f"{where}: parallel_contract().tensor_parallel(sequence_parallel="
                f"{sequence_parallel}) raised {type(error).__name__}: {error}"
            ) from error
        if not isinstance(plan, TensorParallelPlan):
            raise AssertionError(f"{where}: returned {type(plan).__name__}, not a TensorParallelPlan")
        sharded: set[str] = set()
        for scope_name, scope, roots in (
            ("root", plan.root, [""]),
            ("block", plan.block, [prefixes[id(b)] + "." for b in blocks]),
        ):
            for kind, paths in (
                ("styles", list(scope.styles)),
                ("replicated", scope.replicated),
                ("partial", scope.partial),
            ):
                for path in paths:
                    holders = [model.get_submodule(r[:-1]) if r else model for r in roots]
                    missing = [
                        r[:-1] or "the model" for r, m in zip(roots, holders) if not _resolve_path(m, path)
                    ]
                    # A block path need not be in every block (dense and MoE blocks mix).
                    if missing and (scope_name == "root" or len(missing) == len(roots)):
                        holders_do = (
                            "the model does" if scope_name == "root" else f"block(s) {', '.join(missing)} do"
                        )
                        raise AssertionError(
                            f"{where}: its {scope_name} scope's {kind} name {path!r}, which {holders_do} "
                            "not hold: the strategy would skip it (torch only warns), and whatever the path "
                            "meant to cover would stay a per-rank copy. Paths are relative to the model "
                            "(root) or to each block"
                        )
            for path, style in scope.styles.items():
                if type(style).__name__ in _INPUT_OUTPUT_STYLES:
                    continue
                for root in roots:
                    holder = model.get_submodule(root[:-1]) if root else model
                    sharded.update(root + found for found in _resolve_path(holder, path))
        uncovered, _ = tensor_parallel_coverage(
            model, blocks, plan, lambda name, _: any(name.startswith(s + ".") for s in sharded)
        )
        if uncovered:
            raise AssertionError(
                f"{where}: parameter(s) {', '.join(uncovered)} are neither sharded by a style nor declared "
                "`replicated` or `partial`, so under tensor parallelism each rank would train its own copy "
                "and their gradients would never be reduced (the tp strategy refuses such a plan at build). "
                "Add each to its scope's `replicated` (computed on replicated activations: the same gradient "
                "on every rank) or `partial` (applied to this rank's shard, such as per-head q/k norms: "
                "gradients summed over the tensor-parallel ranks)"
            )
    return None


# --- pipeline -------------------------------------------------------------------------


def _pipeline(model, contract, spec, label, rows, seed, strategy_name, extra_plugins, factor):
    if contract is None or contract.pipeline is None:
        return "the model's parallel_contract() has no pipeline split", [], None
    n_blocks = len(blocks_of(model))
    if n_blocks < 2:
        return f"the model has {n_blocks} block(s): nothing to split", [], None
    from forge_core.registry import load_registries

    strategy = load_registries(extra=extra_plugins)["parallelism"].get(strategy_name).load()
    build_stages = getattr(strategy, "stages", None)
    if build_stages is None:
        raise ValueError(
            f"parallelism strategy {strategy_name!r} exposes no stages(model, model_name, n_stages)"
        )
    model64 = copy.deepcopy(model).to(torch.float64)
    doc_ids, positions = packed_metadata(rows)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vocab = model64(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
        input_ids = torch.randint(0, vocab, doc_ids.shape, generator=gen)
        want = model64(input_ids, doc_ids=doc_ids, positions=positions)
    name = spec.name if spec is not None else type(model).__name__
    done, worst = [], 0.0
    for n_stages in sorted({2, min(3, n_blocks)}):
        stages = build_stages(model64, name, n_stages)
        h = input_ids
        for s, stage in enumerate(stages):
            kept = ", ".join(getattr(stage, contract.blocks).keys())
            where = (
                f"{label}: pipeline stage {s} of {n_stages} (blocks {kept}"
                f"{'' if s == 0 else ', given hidden states'}"
                f"{'' if s == n_stages - 1 else ', returning hidden states'})"
            )
            given = INPUT_IDS if s == 0 else f"hidden states {tuple(h.shape)}"
            try:
                with torch.no_grad():
                    h = stage(h, doc_ids=doc_ids, positions=positions)
            except Exception as error:
                raise AssertionError(
                    f"{where} raised {type(error).__name__}: {error} when called with {given} and the "
                    f"doc_ids and positions keywords. The stage forward contract: {STAGE_CONTRACT}"
                ) from error
            if s < n_stages - 1:
                if not (
                    isinstance(h, torch.Tensor)
                    and h.is_floating_point()
                    and h.dim() == 3
                    and tuple(h.shape[:2]) == tuple(input_ids.shape)
                ):
                    got = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
                    raise AssertionError(
                        f"{where} returned {got}, not hidden states (batch, seq, dim) = "
                        f"{tuple(input_ids.shape)} + (dim,). {STAGE_CONTRACT}"
                    )
        try:
            worst = max(
                worst,
                assert_within_rounding(
                    h,
                    want,
                    dtype=torch.float64,
                    terms=longest_sum(model64, doc_ids.shape[1]),
                    factor=factor,
                    what=f"{dtype_name(torch.float64)}: {n_stages} pipeline stages run in sequence differ "
                    "from the unsplit model on packed rows",
                    dims=("row", "token", "vocab"),
                ),
            )
        except AssertionError as error:
            raise AssertionError(
                f"{label}: {error}. Does every stage build its mask from the doc_ids keyword "
                f"(attention.prepare) and its positions from the positions keyword? {STAGE_CONTRACT}"
            ) from error
        done.append(f"pipeline[{n_stages}]")
    return None, done, worst


# --- facts ----------------------------------------------------------------------------


def _facts(model, contract, spec, options, seen, label) -> str | None:
    blocks = blocks_of(model)
    tied = bool(tied_parameter_names(model))
    seen.update({"blocks": len(blocks) if contract is not None else None, "tied_embeddings": tied})
    if spec is None:
        return "no spec (the model was given as a factory): facts and supports not checked"
    supplied = set()
    if contract is not None:
        supplied.add(BLOCKS)
        if contract.tensor_parallel is not None:
            supplied.add(TENSOR_PARALLEL)
            try:
                contract.tensor_parallel(sequence_parallel=True)
                supplied.add(SEQUENCE_PARALLEL)
            except ForgeError:
                pass  # refused: the tensor-parallel check reports it as skipped
        if contract.pipeline is not None:
            supplied.add(PIPELINE)
        if contract.output_head is not None:
            weight = getattr(getattr(model, contract.output_head, None), "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                raise AssertionError(
                    f"{label}: parallel_contract().output_head is {contract.output_head!r}, which is not an "
                    "attribute of the model with a 2-D weight (vocab, dim): the chunked loss applies that "
                    "weight itself"
                )
            supplied.add(OUTPUT_HEAD)
    missing = sorted(set(spec.supports) - supplied)
    if missing:
        raise AssertionError(
            f"{label}: the spec declares supports {sorted(spec.supports)} but parallel_contract() "
            f"{'is missing' if contract is None else 'does not supply'} {missing}: the rule engine would let "
            "strategies through that fail at build. Declare in supports only what the contract supplies"
        )
    if spec.facts is None:
        return "the spec declares no facts"
    facts = spec.facts(options)
    observed = {
        "blocks": len(blocks),
        "heads": seen["heads"],
        "kv_heads": seen["kv_heads"],
        "tied_embeddings": tied,
    }
    if contract is None:
        observed.pop("blocks")
    wrong = [
        f"{key} {getattr(facts, key)!r} (the model has {value!r})"
        for key, value in observed.items()
        if getattr(facts, key) != value
    ]
    if wrong:
        raise AssertionError(
            f"{label}: its spec's facts(options) disagree with the built model: {'; '.join(wrong)}. "
            "The parallelism rules judge configs by these facts (heads divisible by tp, blocks per pipeline "
            "stage, tied embeddings), so a wrong fact lets a config through that fails or trains wrong. "
            "Heads are counted from q and k at attend(), blocks from the contract's blocks, tied from "
            "parameters registered twice"
        )
    return None
