"""What an optimizer factory receives for each trainable parameter: ``NamedParameter``,
its roles, and the weight-decay rule. The rule that assigns the roles (from the owning
module's type and the parameter's shape, or the model's ``param_roles()``) is the
trainer's, in ``forge_core.components.named_params``; this module stays torch-free."""

from __future__ import annotations

from typing import Any

import attrs

EMBEDDING, BIAS, NORM, VECTOR, MATRIX = "embedding", "bias", "norm", "vector", "matrix"
#: Every role, in the order the rule tries them (after the model's own say).
ROLES = (EMBEDDING, BIAS, NORM, VECTOR, MATRIX)
#: Roles that never take weight decay.
NO_DECAY = frozenset({BIAS, NORM, VECTOR})

#: Name of the optional model method that overrides the rule.
OVERRIDE = "param_roles"


@attrs.frozen
class NamedParameter:
    """One trainable parameter as an optimizer factory receives it.

    ``name`` is its name in ``named_parameters()`` of the model part that holds it;
    ``param`` the ``torch.nn.Parameter`` itself (a DTensor under FSDP or tensor
    parallelism); ``role`` one of ``embedding``, ``bias``, ``norm``, ``vector``,
    ``matrix``, decided in this order: the model's ``param_roles()`` when it names the
    parameter; ``embedding`` for the weight of an ``nn.Embedding``; ``bias`` for a
    parameter registered as ``bias``; ``norm`` for a parameter of a torch normalization
    module; ``vector`` for any other parameter of fewer than 2 dimensions; else
    ``matrix``. ``in_block``: whether it belongs to one of the model's repeated blocks
    (``blocks_of``: attention and feed-forward weights, the blocks' norms), as opposed to
    what sits outside them (embeddings, final norm, output head); always ``False`` for a
    model whose parallel contract names no blocks.
    """

    name: str
    param: Any
    role: str
    in_block: bool = False

    def decays(self, embeddings: bool = True) -> bool:
        """Whether weight decay applies: always to a matrix, to an embedding if ``embeddings``.

        Never to biases, norms and other vectors."""
        if self.role == EMBEDDING:
            return embeddings
        return self.role not in NO_DECAY
