"""The pluggy markers of the project ``forge``: decorate hook implementations with
:data:`hookimpl` (give their parameters no defaults); :data:`hookspec` marks the hook
contract in :mod:`forge_core.hookspecs`."""

from __future__ import annotations

import pluggy

#: The pluggy project name of the hooks (``forge-run`` loads plugins from the entry-point
#: group of the same name).
PROJECT = "forge"
#: Marks a hook of the contract in :mod:`forge_core.hookspecs`.
hookspec = pluggy.HookspecMarker(PROJECT)
#: Marks a plugin's implementation of a hook (give its parameters no defaults).
hookimpl = pluggy.HookimplMarker(PROJECT)
