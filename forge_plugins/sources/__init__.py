"""Built-in data sources: ``text``, ``shards``, ``megatron``, ``token_file``, ``hf_datasets`` and
``stdlib`` (registered in :mod:`.plugin`)."""
