"""A small decoder for the model conformance checks, with deliberate flaws.

Its module names are its own (``embed``, ``stack``, ``mix.wq``, ``final_norm``,
``lm_head``), not llama's, and its blocks hold per-head q norms (``mix.q_norm``, a
``partial`` entry of the tensor-parallel plan). With ``experts`` its MLP is a mixture of
experts of its own making (``mlp.route``, ``mlp.bank``: GELU experts, a per-slot
dispatcher) that meets the same contract as the built-in one
(``ParallelContract.experts``). ``KitOptions.flaw`` names one way to
break the model contract (:data:`FLAWS`); ``""`` is the correct model.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from forge_core.api import (
    BLOCKS,
    DOC_IDS,
    OUTPUT_HEAD,
    PIPELINE,
    POSITIONS,
    SEQUENCE_PARALLEL,
    TENSOR_PARALLEL,
    ForgeError,
    ModelFacts,
    ModelSpec,
    ParallelContract,
    PipelineSplit,
    TensorParallelPlan,
    TensorParallelScope,
)

FLAWS = (
    "own_attention",
    "prepare_without_doc_ids",
    "shifts_across_documents",
    "plan_misses_q_norm",
    "plan_stale_path",
    "stage_crash",
    "stage_drops_doc_ids",
    "wrong_facts",
    "supports_without_split",
    "build_forward_needs_metadata",
    "head_not_linear",
    "refuses_sequence_parallel",
    "forward_names_tokens",
    "forward_without_positions",
    "misroutes",
    "duplicate_experts",
    "experts_by_global_index",
)
#: Flaws of the mixture of experts: the model gets experts for them.
ROUTING_FLAWS = ("misroutes", "duplicate_experts", "experts_by_global_index")


@attrs.frozen
class KitOptions:
    dim: int = 16
    blocks: int = 3
    heads: int = 4
    kv_heads: int = 2
    tied: bool = False
    experts: int = 0  # routed experts of each block's MLP; 0: a dense MLP
    flaw: str = attrs.field(default="", validator=attrs.validators.in_(("", *FLAWS)))


def kit_facts(options: KitOptions) -> ModelFacts:
    heads = options.heads * (2 if options.flaw == "wrong_facts" else 1)
    return ModelFacts(
        blocks=options.blocks, heads=heads, kv_heads=options.kv_heads, tied_embeddings=options.tied
    )


def spec(**changes) -> ModelSpec:
    fields = dict(
        name="kitdecoder",
        summary="test decoder",
        impl="kit_models:build",
        options=KitOptions,
        accepts={DOC_IDS, POSITIONS},
        supports={BLOCKS, TENSOR_PARALLEL, SEQUENCE_PARALLEL, PIPELINE, OUTPUT_HEAD},
        facts=kit_facts,
    )
    return ModelSpec(**{**fields, **changes})


class Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x (B, S, H, D)`` at ``positions (B, S)``."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (100.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = (positions[..., None].double() * freqs)[:, :, None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Mix(nn.Module):
    def __init__(self, o: KitOptions, attention) -> None:
        super().__init__()
        self.head_dim = o.dim // o.heads
        self.wq = nn.Linear(o.dim, o.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(o.dim, o.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(o.dim, o.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(o.heads * self.head_dim, o.dim, bias=False)
        self.q_norm = Norm(self.head_dim)
        self.attention, self.flaw = attention, o.flaw

    def forward(self, x, positions, prepared):
        b, s, _ = x.shape
        q = self.q_norm(self.wq(x).view(b, s, -1, self.head_dim))
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = rotate(q, positions), rotate(k, positions)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.flaw == "own_attention":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = self.attention.attend(q, k, v, prepared)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Bank(nn.Module):
    """The routed experts, with the attributes and methods of the experts contract."""

    def __init__(self, dim: int, experts: int, flaw: str) -> None:
        super().__init__()
        self.num_experts, self.first_expert, self.local_experts = experts, 0, experts
        self.weight_sum = 1.0  # the router renormalises its top-2
        self.up = nn.Parameter(torch.empty(experts, dim, 2 * dim))
        self.down = nn.Parameter(torch.empty(experts, 2 * dim, dim))
        self.dispatcher = misrouting_dispatch if flaw == "misroutes" else slot_dispatch
        # Reads its weights by global expert id: right while it holds every expert, wrong
        # once expert parallelism leaves it a block of them.
        self.offset = flaw == "experts_by_global_index"

    def compute(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        groups = x.split(counts.tolist())
        first = self.first_expert if self.offset else 0
        return torch.cat(
            [F.gelu(rows @ self.up[first + e]) @ self.down[first + e] for e, rows in enumerate(groups)]
        )


def slot_dispatch(bank: Bank, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, shift: int = 0):
    """Slot by slot, expert by expert: each token's weighted sum over its experts."""
    out = torch.zeros_like(x)
    for j in range(indices.shape[1]):
        for e in range(bank.num_experts):
            rows = indices[:, j] == e
            counts = torch.zeros(bank.local_experts, dtype=torch.long)
            counts[(e + shift) % bank.num_experts] = int(rows.sum())
            out[rows] += weights[rows, j, None].to(x.dtype) * bank.compute(x[rows], counts)
    return out


def misrouting_dispatch(bank, x, indices, weights):
    return slot_dispatch(bank, x, indices, weights, shift=1)  # every token to the next expert


class Experts(nn.Module):
    def __init__(self, dim: int, experts: int, flaw: str) -> None:
        super().__init__()
        self.route = nn.Linear(dim, experts, bias=False)
        self.bank = Bank(dim, experts, flaw)
        self.flaw = flaw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(-1, d)
        weights, indices = self.route(tokens).softmax(-1).topk(2, dim=-1)
        if self.flaw == "duplicate_experts":
            indices = indices[:, :1].expand(-1, 2)
        weights = weights / weights.sum(-1, keepdim=True)
        return self.bank.dispatcher(self.bank, tokens, indices, weights).view(b, s, d)


class Layer(nn.Module):
    def __init__(self, o: KitOptions, attention) -> None:
        super().__init__()
        self.norm1, self.mix, self.norm2 = Norm(o.dim), Mix(o, attention), Norm(o.dim)
        if o.experts:
            self.mlp = Experts(o.dim, o.experts, o.flaw)
            return
        self.mlp = nn.Sequential()
        self.mlp.up = nn.Linear(o.dim, 2 * o.dim)
        self.mlp.act = nn.GELU()
        self.mlp.down = nn.Linear(2 * o.dim, o.dim)

    def forward(self, x, positions, prepared):
        x = x + self.mix(self.norm1(x), positions, prepared)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, o: KitOptions, vocab_size: int, attention) -> None:
        super().__init__()
        self.o, self.attention = o, attention
        self.embed = nn.Embedding(vocab_size, o.dim)
        self.stack = nn.ModuleDict({str(i): Layer(o, attention) for i in range(o.blocks)})
        self.final_norm = Norm(o.dim)
        self.lm_head = nn.Linear(o.dim, vocab_size, bias=False)
        if o.tied:
            self.lm_head.weight = self.embed.weight

    def parallel_contract(self) -> ParallelContract:
        split = (
            None
            if self.o.flaw == "supports_without_split"
            else PipelineSplit(first=("embed",), last=("final_norm", "lm_head"))
        )
        head = "final_norm" if self.o.flaw == "head_not_linear" else "lm_head"
        return ParallelContract(
            blocks="stack",
            pipeline=split,
            tensor_parallel=self.plan,
            output_head=head,
            experts="mlp.bank" if self.o.experts else None,
        )

    def plan(self, *, sequence_parallel: bool) -> TensorParallelPlan:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        if sequence_parallel and self.o.flaw == "refuses_sequence_parallel":
            raise ForgeError("model 'kitdecoder' does not support sequence parallelism")
        block = {
            "mix.wq": ColwiseParallel(),
            "mix.wk": ColwiseParallel(),
            "mix.wv": ColwiseParallel(),
            "mix.wo": RowwiseParallel(),
        }
        if not self.o.experts:  # the experts are replicated (expert parallelism shards them)
            block.update({"mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()})
        if self.o.flaw == "plan_stale_path":
            block["attention.wq"] = block.pop("mix.wq")
        partial = () if self.o.flaw == "plan_misses_q_norm" else ("mix.q_norm",)
        return TensorParallelPlan(
            root=TensorParallelScope(
                styles={
                    "embed": RowwiseParallel(input_layouts=Replicate()),
                    "lm_head": ColwiseParallel(output_layouts=Replicate()),
                },
                replicated=("final_norm",),
            ),
            block=TensorParallelScope(
                styles=block,
                replicated=("norm1", "norm2", *(("mlp",) if self.o.experts else ())),
                partial=partial,
            ),
        )

    def forward(self, input_ids, doc_ids=None, positions=None):
        if self.embed is not None or self.o.flaw == "stage_crash":
            h = self.embed(input_ids)
        else:
            h = input_ids
        b, s = h.shape[:2]
        if self.o.flaw == "build_forward_needs_metadata":
            positions = positions + 0
        if self.o.flaw == "shifts_across_documents":  # a token shift that ignores document boundaries
            h = h + 0.5 * F.pad(h, (0, 0, 1, 0))[:, :-1]
        if positions is None:
            positions = torch.arange(s, device=h.device).expand(b, s)
        ids = doc_ids
        if self.o.flaw == "prepare_without_doc_ids" or (
            self.o.flaw == "stage_drops_doc_ids" and self.embed is None
        ):
            ids = None
        prepared = self.attention.prepare(ids, s, h.device)
        for layer in self.stack.values():
            h = layer(h, positions, prepared)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


class TokensDecoder(Decoder):
    """Names its input ``tokens``: the trainer's ``forward(input_ids=...)`` fails."""

    def forward(self, tokens, doc_ids=None, positions=None):
        return super().forward(tokens, doc_ids, positions)


class NoPositionsDecoder(Decoder):
    """Takes no ``positions`` keyword although its spec accepts them."""

    def forward(self, input_ids, doc_ids=None):
        return super().forward(input_ids, doc_ids)


def build(options: KitOptions, vocab_size: int, attention) -> Decoder:
    if options.flaw in ROUTING_FLAWS and not options.experts:
        options = attrs.evolve(options, experts=4)
    cls = {"forward_names_tokens": TokensDecoder, "forward_without_positions": NoPositionsDecoder}
    model = cls.get(options.flaw, Decoder)(options, vocab_size, attention)
    with torch.no_grad():  # a large init, so that any leak shows
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.4)
    return model
