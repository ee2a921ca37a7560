"""Context parallelism (``parallel.cp``): each process of a cp group holds a share of
every row's tokens; attention gathers what the share needs from the rest of the group."""
