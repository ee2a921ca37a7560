"""The kit's expert-parallel check: a mixture-of-experts model's routed experts split
over a group of 1 and of 2 (emulated in one process) compute what the whole module does.

Expert parallelism (``parallel.ep``) keeps on each rank a contiguous block of a block's
routed experts (``ParallelContract.experts``): every parameter of the experts module
sliced along dim 0, ``first_expert`` and ``local_experts`` set, and a dispatcher that
sends each kept assignment to the rank holding its expert, where ``compute(x_grouped,
counts)`` runs over that rank's experts only. This check does the same without a process
group: each "rank" is a copy of the module holding its block, and the exchange is an
index select, so what it proves is the model's side of the seam: weights stacked along
dim 0, and a ``compute`` that reads its experts by local index. Logits and the gradient
of every parameter (the experts' gathered back from the blocks) must equal the unsplit
model's in float64.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from forge_core.api import blocks_of
from forge_core.testing.attention import packed_metadata
from forge_core.testing.tolerance import assert_within_rounding, longest_sum

#: The group sizes the check emulates: every expert on one rank, then two blocks.
GROUP_SIZES = (1, 2)


class _ExpertBlocks:
    """A dispatcher over ``pieces`` (copies of one experts module, each holding a block of
    its experts): each kept assignment goes to the piece holding its expert."""

    def __init__(self, pieces: list[Any]) -> None:
        self.pieces = pieces

    def __call__(self, experts: Any, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> Any:
        out = x.new_zeros(x.shape)
        flat = indices.reshape(-1)
        for piece in self.pieces:
            local = flat - piece.first_expert
            held = (local >= 0) & (local < piece.local_experts)
            order = torch.where(held, local, piece.local_experts).argsort(stable=True)[: int(held.sum())]
            counts = torch.bincount(local[order], minlength=piece.local_experts)
            token = order // indices.shape[1]
            rows = piece.compute(x[token], counts) * weights.reshape(-1)[order].unsqueeze(-1).to(x.dtype)
            out = out.index_add(0, token, rows)
        return out


def _block_of(experts: Any, rank: int, size: int, where: str) -> Any:
    total = experts.num_experts
    first, local = rank * (total // size), total // size
    piece = copy.deepcopy(experts)
    for name, param in experts.named_parameters(recurse=False):
        if param.shape[0] != total:
            raise AssertionError(
                f"{where}: parameter {name!r} has shape {tuple(param.shape)}; expert parallelism slices "
                f"every parameter of the experts module along dim 0, which must be its {total} experts"
            )
        setattr(piece, name, torch.nn.Parameter(param.detach()[first : first + local].clone()))
    piece.first_expert, piece.local_experts = first, local
    return piece


def check_expert_parallel(model, contract, rows, seed, label, factor) -> tuple[str | None, float | None]:
    """The check (see the module docstring): ``(why skipped, worst ratio)``."""
    if contract is None or not contract.experts:
        return "the model's contract names no experts (ParallelContract.experts): no mixture of experts", None
    reference = copy.deepcopy(model).double()
    paths = [
        f"{contract.blocks}.{name}.{contract.experts}"
        for name, block in _named_blocks(reference, contract)
        if _holds(block, contract.experts)
    ]
    if not paths:
        return f"no block holds {contract.experts!r}: every block is dense", None
    doc_ids, positions = packed_metadata(rows)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 8, doc_ids.shape, generator=generator)
    want, want_grads = _forward_backward(reference, input_ids, doc_ids, positions, seed)
    terms = longest_sum(reference, doc_ids.shape[1])
    worst = 0.0
    for size in GROUP_SIZES:
        split = copy.deepcopy(reference)
        pieces: dict[str, list[Any]] = {}
        for path in paths:
            experts = split.get_submodule(path)
            if experts.num_experts % size:
                continue
            where = f"{label}: experts {path!r} split over {size} ranks"
            pieces[path] = [_block_of(experts, rank, size, where) for rank in range(size)]
            experts.dispatcher = _ExpertBlocks(pieces[path])
        where = f"{label}: routed experts split over an expert-parallel group of {size}"
        try:
            got, grads = _forward_backward(split, input_ids, doc_ids, positions, seed)
        except Exception as error:
            raise AssertionError(
                f"{where}: the forward raised {type(error).__name__}: {error}. Each rank's experts module "
                "holds only its block (first_expert, local_experts; every parameter sliced along dim 0), "
                "and compute(x_grouped, counts) must read its experts by local index"
            ) from error
        for path, blocks in pieces.items():
            for name, _ in split.get_submodule(path).named_parameters(recurse=False):
                parts = [getattr(piece, name).grad for piece in blocks]
                grads[f"{path}.{name}"] = torch.cat(
                    [
                        g if g is not None else torch.zeros_like(getattr(p, name))
                        for g, p in zip(parts, blocks)
                    ]
                )
        worst = max(
            worst,
            assert_within_rounding(
                got, want, dtype=torch.float64, terms=terms, what=f"{where}: logits", factor=factor
            ),
        )
        for name, expected in want_grads.items():
            worst = max(
                worst,
                assert_within_rounding(
                    grads[name],
                    expected,
                    dtype=torch.float64,
                    terms=terms,
                    what=f"{where}: gradient of {name}",
                    factor=factor,
                ),
            )
    return None, worst


def _named_blocks(model: torch.nn.Module, contract: Any) -> list[tuple[str, torch.nn.Module]]:
    blocks = getattr(model, contract.blocks)
    if hasattr(blocks, "items"):
        return list(blocks.items())
    return [(str(i), block) for i, block in enumerate(blocks_of(model))]


def _holds(block: torch.nn.Module, path: str) -> bool:
    try:
        block.get_submodule(path)
    except AttributeError:
        return False
    return True


def _forward_backward(
    model, input_ids, doc_ids, positions, seed
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits, and every parameter's gradient of a fixed random projection of them."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids, doc_ids=doc_ids, positions=positions)
    probe = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=logits.dtype)
    (logits * probe).sum().backward()
    grads = {
        name: (param.grad if param.grad is not None else torch.zeros_like(param))
        for name, param in model.named_parameters()
    }
    return logits.detach(), grads
