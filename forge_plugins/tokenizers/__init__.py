"""Built-in tokenizers: ``byte`` and ``hf`` (registered in :mod:`.plugin`)."""
