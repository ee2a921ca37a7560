"""The generic data path: sources -> token cache (or prepared shards) -> held-out split
-> packer layout -> rows read lazily by the stateful loader, with weighted mixing of
sources, plus the shard format and ``prepare``. ``build`` assembles it for a run. It
sees components only through their contracts (the hook docstrings) and imports no
plugin; submodules are imported on use, so importing this package costs nothing.
"""
