"""The pluggy markers of the project ``forge``: decorate hook implementations with
:data:`hookimpl` (give their parameters no defaults); :data:`hookspec` marks the hook
contract in :mod:`forge_core.hookspecs`."""

from __future__ import annotations

import pluggy

PROJECT = "forge"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
