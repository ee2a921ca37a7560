"""``muon``: ``torch.optim.Muon`` for the hidden layers' matrices, AdamW for every other
parameter, as torch's documentation of Muon prescribes, stepped as one optimizer.

Which parameters Muon takes is one declared rule over what the optimizer factory is given
(:class:`~forge_core.api.NamedParameter`), never a model's parameter names: a parameter
``in_block`` (inside one of the blocks the model's parallel contract names) with the role
``matrix`` and exactly two dimensions. Everything else goes to AdamW: the token
embedding and the output head (outside the blocks, though 2-D), every norm, bias and
other vector, with weight decay where :func:`~forge_plugins.optim.groups.decay_groups`
puts it.

One optimizer, because the trainer, the learning-rate schedule and checkpointing (DCP's
``get_optimizer_state_dict``) each handle one ``torch.optim.Optimizer`` per model part:
:class:`MuonWithAdamW` is an ``Optimizer`` whose ``param_groups`` and ``state`` are the
two torch optimizers' own, so the schedule sets every group's ``lr`` and a checkpoint
holds both states under the parameters' names.
"""

from __future__ import annotations

from typing import Any

import torch

from forge_core.api import ForgeError
from forge_plugins.optim.groups import decay_groups
from forge_plugins.optim.optimizers import _on_cuda


def takes_muon(p: Any) -> bool:
    """The rule: a 2-D weight matrix inside one of the model's blocks."""
    return p.in_block and p.role == "matrix" and p.param.ndim == 2


def split(named_params: list[Any]) -> tuple[list[Any], list[Any]]:
    """``(muon, adamw)``: the named parameters each optimizer takes, in the given order."""
    return [p for p in named_params if takes_muon(p)], [p for p in named_params if not takes_muon(p)]


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` and ``torch.optim.AdamW`` stepped together. ``param_groups``:
    Muon's groups, then AdamW's (the same dicts the two optimizers read); ``state``: one
    mapping both write into. ``state_dict()``/``load_state_dict()`` are the standard
    ``Optimizer`` ones over all groups."""

    def __init__(self, muon: torch.optim.Optimizer | None, adamw: torch.optim.Optimizer | None) -> None:
        self.parts = [opt for opt in (muon, adamw) if opt is not None]
        self._sizes = [len(opt.param_groups) for opt in self.parts]
        super().__init__([group for opt in self.parts for group in opt.param_groups], {})
        self._share()

    def _share(self) -> None:
        """Point the two optimizers at this one's groups and state (again after a load,
        which replaces both)."""
        start = 0
        for opt, size in zip(self.parts, self._sizes):
            opt.param_groups = self.param_groups[start : start + size]
            opt.state = self.state
            start += size

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.parts:
            opt.step()
        return loss


def build_muon(named_params: list[Any], lr: float, options: Any) -> MuonWithAdamW:
    muon_params, rest = split(named_params)
    if not muon_params:
        raise ForgeError(
            "train.optimizer = 'muon' found no 2-D weight inside the model's blocks (the blocks its "
            "parallel_contract() names): Muon would optimize nothing. Use train.optimizer: adamw, or a "
            "model whose contract names its blocks."
        )
    muon = torch.optim.Muon(
        [p.param for p in muon_params],
        lr=lr,
        weight_decay=options.weight_decay,
        momentum=options.momentum,
        nesterov=options.nesterov,
        ns_coefficients=tuple(options.ns_coefficients),
        eps=options.eps,
        ns_steps=options.ns_steps,
        adjust_lr_fn=options.adjust_lr,
    )
    groups = decay_groups(rest, options.adamw_weight_decay, options.decay_embeddings)
    adamw = None
    if groups:
        fast = {"fused": True} if _on_cuda(groups) else {"foreach": True}
        adamw = torch.optim.AdamW(
            groups, lr=lr, betas=(options.adamw_beta1, options.adamw_beta2), eps=options.adamw_eps, **fast
        )
    return MuonWithAdamW(muon, adamw)
