"""Built-in data sources: ``text``, ``shards`` and ``stdlib`` (registered in :mod:`.plugin`)."""
