"""Built-in packers: ``none``, ``concat`` and ``bfd`` (registered in :mod:`.plugin`)."""
