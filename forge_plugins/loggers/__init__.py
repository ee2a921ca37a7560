"""Built-in loggers: ``console``, ``jsonl``, ``tensorboard``, ``plot`` (registered in
:mod:`.plugin`). Each is a class whose instances implement the lifecycle hooks; the
trainer registers one instance per enabled logger for the length of a run."""
