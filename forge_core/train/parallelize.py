"""Deprecated location of :class:`ModelSplit` and ``transformer_blocks``: import them from
:mod:`forge_core.api` (``transformer_blocks`` is now ``blocks_of``).

Kept for one release; each name warns and names its new home. The module that applies
the strategies is :mod:`forge_core.distributed.parallelize`."""

from forge_core.deprecation import moved

__getattr__ = moved(
    __name__, {"ModelSplit": "forge_core.api", "transformer_blocks": "forge_core.api:blocks_of"}
)
