"""Forge's kernel: hook contract, specs, plugin manager, registries, config, rules, CLI.

The kernel knows kinds of components, never concrete ones; the built-ins in
``forge_plugins`` register through the same entry-point group as third-party packages.
"""

__version__ = "0.1.0"
