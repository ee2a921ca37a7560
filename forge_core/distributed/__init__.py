"""The distributed machinery: where this process runs and its process group
(:mod:`~forge_core.distributed.placement`), the device mesh of the judged degrees
(:mod:`~forge_core.distributed.mesh`), and the model with the plan's strategies applied
(:mod:`~forge_core.distributed.parallelize`). The training loop, evaluation and the
commands use it; it knows models only through their parallel contract."""
