"""The ``llama`` model's tensor-parallel plan (Megatron-style), supplied to the ``tp``
strategy through :meth:`forge_plugins.models.llama.Llama.parallel_contract`.

- ``attention.wq/wk/wv`` and ``feed_forward.w1/w3`` column-wise: each rank computes
  ``n_heads / tp`` heads and ``1 / tp`` of the MLP's hidden units, with no
  communication; ``attention.wo`` and ``feed_forward.w2`` row-wise: one all-reduce (or
  reduce-scatter) per sub-layer brings the partial sums together.
- ``tok_embeddings`` row-wise (the vocabulary is split; the input ids are replicated).
- ``output`` column-wise with a replicated output: every rank gets the full logits and
  computes the same loss (loss parallelism is off). A tied output shares the
  embedding's matrix, sharded the same way (dim 0, the vocabulary), so the strategy
  keeps the two tied.
- Without sequence parallelism the norms are ``replicated``: they run on the whole,
  replicated residual stream, so every rank computes the same gradient for them.
- The qwen3 family's per-head q/k norms (``attention.q_norm``/``k_norm``) are
  ``partial`` with or without sequence parallelism: each rank applies them to its own
  heads, so its gradient is its heads' share and the strategy sums them over the
  group. The olmo2 family's q/k norms span the whole projection: their weights are
  sharded with the heads (dim 0, as ``wq``/``wk`` split their outputs) and the sums of
  squares all-reduced over the group (:class:`ProjectionNormParallel`), so each rank's
  gradient is that of its own shard. Biases (qwen2's q/k/v, llama's optional ones) are
  sharded with their layer: column-wise layers split theirs, row-wise layers keep theirs
  replicated.
- Mixture-of-experts blocks (``feed_forward`` an ``MoE``) keep their router, routed
  experts and shared experts whole on every rank (``replicated``): they run on the
  replicated residual stream, each rank routes every token itself and gets the same
  gradient; their attention is tensor-parallel as in every block. (Sharding experts is
  expert parallelism's job, found through ``ParallelContract.experts``.) The dense
  blocks' ``feed_forward.w1/w2/w3`` styles name nothing in an MoE block and are skipped
  there.
- With sequence parallelism the norms run on ``1 / tp`` of the sequence
  (``SequenceParallel``): the residual stream is a sequence-sharded DTensor between
  sub-layers, gathered before attention and the MLP, reduce-scattered after. It keeps
  the DTensor (global shape) so the model reads the true sequence length.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from forge_core.api import TensorParallelPlan, TensorParallelScope

BLOCK_NORMS = ("attention_norm", "ffn_norm")
#: The post-norm block's (olmo2), on the outputs of attention and MLP: replicated, or
#: under sequence parallelism on the sequence shards, as the pre-norm ones.
POST_NORMS = ("post_attention_norm", "post_ffn_norm")
#: Norms of the queries and keys (qwen3: per head; olmo2: over the whole projection).
QK_NORMS = ("attention.q_norm", "attention.k_norm")
#: An MoE block's routing parts, replicated on every tensor-parallel rank (with its
#: ``feed_forward.shared`` experts when it has them).
MOE_PARTS = ("feed_forward.router", "feed_forward.experts")


class FeedForwardInput(ParallelStyle):
    """Under sequence parallelism, the feed-forward's input is gathered from the
    sequence shards. A dense SwiGLU's row-wise ``w2`` reduce-scatters its output; a
    replicated MoE's whole output is re-sharded along the sequence (a local slice: every
    rank computed all of it)."""

    def _apply(self, module, device_mesh):
        if hasattr(module, "experts"):
            style = PrepareModuleInputOutput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_input=True,
                output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
                use_local_output=False,
            )
        else:
            style = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
            )
        return style._apply(module, device_mesh)


class ProjectionNormParallel(ParallelStyle):
    """A norm over a whole column-wise projection
    (:class:`~forge_plugins.models.llama.ProjectionNorm`): its weight sharded along dim 0
    as the projection's output is, and the group set over which each rank's sum of
    squares is all-reduced."""

    def _apply(self, module, device_mesh):
        weight = distribute_tensor(module.weight.data, device_mesh, [Shard(0)])
        module.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
        module.group = device_mesh.get_group()
        return module


def tensor_parallel_plan(
    *,
    sequence_parallel: bool,
    qk_norm: bool = False,
    projection_norm: bool = False,
    post_norm: bool = False,
    dense: bool = True,
    moe: bool = False,
    shared: bool = False,
) -> TensorParallelPlan:
    """``qk_norm``, ``projection_norm``: the blocks norm q and k per head (qwen3), or
    over the whole projections (olmo2); ``post_norm``: the blocks' norms are olmo2's.
    ``dense``, ``moe``,
    ``shared``: whether the model part holds dense blocks, MoE blocks, MoE blocks with
    shared experts (every path of the plan names something that some block holds)."""
    partial = QK_NORMS if qk_norm else ()
    norms = POST_NORMS if post_norm else BLOCK_NORMS
    replicated = (MOE_PARTS if moe else ()) + (("feed_forward.shared",) if shared else ())
    residual = Shard(1) if sequence_parallel else Replicate()
    root = {
        "tok_embeddings": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=residual, use_local_output=not sequence_parallel
        ),
        "output": ColwiseParallel(input_layouts=residual, output_layouts=Replicate(), use_local_output=True),
    }
    block = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual, use_local_output=not sequence_parallel),
    }
    if projection_norm:
        block.update({norm: ProjectionNormParallel() for norm in QK_NORMS})
    if dense:
        block.update(
            {
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(
                    output_layouts=residual, use_local_output=not sequence_parallel
                ),
            }
        )
    if not sequence_parallel:
        return TensorParallelPlan(
            root=TensorParallelScope(styles=root, replicated=("norm",)),
            block=TensorParallelScope(styles=block, replicated=norms + replicated, partial=partial),
        )
    root["norm"] = SequenceParallel(use_local_output=False)
    block.update({norm: SequenceParallel(use_local_output=False) for norm in norms})
    block.update(
        {
            # attention(x, cos, sin, prepared): gather x; the rest are not DTensors.
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None, None, None),
                desired_input_layouts=(Replicate(), None, None, None),
                use_local_output=True,
            ),
            "feed_forward": FeedForwardInput(),
        }
    )
    return TensorParallelPlan(
        root=TensorParallelScope(styles=root),
        block=TensorParallelScope(styles=block, replicated=replicated, partial=partial),
    )
