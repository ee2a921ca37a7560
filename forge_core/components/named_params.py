"""What an optimizer factory receives: every trainable parameter with its name and role.

The role is decided by one declared rule, from the module that owns the parameter and
the parameter's shape, never from the names a particular model gives its layers:

1. the model's own say: a model (the root module, or a pipeline stage of it) may define
   ``param_roles(self) -> dict[str, str]`` mapping parameter names (as
   ``named_parameters()`` spells them) to roles; those win;
2. ``embedding``: the weight of an ``nn.Embedding`` / ``nn.EmbeddingBag``;
3. ``bias``: a parameter registered under the name ``bias``;
4. ``norm``: a parameter of one of torch's normalization modules (LayerNorm, RMSNorm,
   GroupNorm, batch and instance norms, LocalResponseNorm);
5. ``vector``: any other parameter with fewer than two dimensions (the scale of a norm
   written by hand, a learned gate);
6. ``matrix``: everything else.

A parameter shared by several modules (tied embeddings) appears once, with the role of
the first module that holds it in ``named_modules()`` order. Under FSDP and tensor
parallelism a parameter is a DTensor whose ``ndim`` is that of the whole tensor, so the
rule gives every layout the same answer.

``in_block``: the parameter belongs to one of the blocks the model's parallel contract
names (``blocks_of``); what an optimizer treats the hidden layers' matrices apart by
(Muon), whatever the model calls them.

Weight decay (:meth:`NamedParameter.decays`): ``matrix`` decays, ``embedding`` decays
when the optimizer's options say so, ``bias``, ``norm`` and ``vector`` never do.
"""

from __future__ import annotations

from typing import Any

from forge_core.api.errors import ForgeError
from forge_core.api.optim import BIAS, EMBEDDING, MATRIX, NORM, OVERRIDE, ROLES, VECTOR, NamedParameter
from forge_core.api.parallel import blocks_of


def _norm_types() -> tuple[type, ...]:
    from torch import nn

    types = [nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase]
    if hasattr(nn, "RMSNorm"):
        types.append(nn.RMSNorm)
    return tuple(types)


def _declared_roles(module: Any) -> dict[str, str]:
    override = getattr(module, OVERRIDE, None)
    if override is None:
        return {}
    roles = dict(override())
    wrong = {name: role for name, role in roles.items() if role not in ROLES}
    if wrong:
        raise ForgeError(
            f"{type(module).__name__}.{OVERRIDE}() gives unknown roles {wrong}; a role is one "
            f"of {', '.join(ROLES)}"
        )
    return roles


def named_parameters(module: Any) -> list[NamedParameter]:
    """Every trainable parameter of ``module`` with its role, in ``named_parameters()``
    order (the order a hand-built optimizer over ``module.parameters()`` would see)."""
    from torch import nn

    norms = _norm_types()
    owner: dict[int, tuple[nn.Module, str]] = {}
    for _, sub in module.named_modules():
        for local, param in sub.named_parameters(recurse=False):
            owner.setdefault(id(param), (sub, local))
    declared = _declared_roles(module)
    in_blocks = {id(p) for block in blocks_of(module) for p in block.parameters()}
    out = []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        sub, local = owner[id(param)]
        if name in declared:
            role = declared[name]
        elif isinstance(sub, (nn.Embedding, nn.EmbeddingBag)):
            role = EMBEDDING
        elif local == "bias":
            role = BIAS
        elif isinstance(sub, norms):
            role = NORM
        elif param.ndim < 2:
            role = VECTOR
        else:
            role = MATRIX
        out.append(NamedParameter(name=name, param=param, role=role, in_block=id(param) in in_blocks))
    return out
