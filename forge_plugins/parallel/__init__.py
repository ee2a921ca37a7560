"""Built-in parallelism strategies: pipeline (``pp``), tensor (``tp``), fully sharded
data parallel (``fsdp``, HSDP with replicas) and replicated data parallel (``ddp``).

``plugin.py`` registers them without importing torch; the implementations live in
``pipeline.py``, ``tensor.py``, ``fsdp.py`` and ``ddp.py`` and are imported only when a
run applies them.
"""
