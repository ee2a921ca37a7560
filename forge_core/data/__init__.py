"""The generic data path: source -> tokenizer -> packer -> stateful loader, plus the
shard format and ``prepare``. It sees components only through their contracts (the
hook docstrings) and imports no plugin; submodules are imported on use, so importing
this package costs nothing.
"""
