"""Expert parallelism (``parallel.ep``): each process of an ep group holds a contiguous
block of every MoE layer's routed experts; tokens travel to their experts' ranks and back
by all-to-all."""
