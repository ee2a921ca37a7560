"""The inductor cache the compiled FlexAttention kernel is kept in: a directory of
Forge's own per set of things a compiled CPU kernel depends on.

torch 2.13 keys its compiled-graph cache by the graph, the shapes and the thread count,
but not by ``ATEN_CPU_CAPABILITY``: a kernel compiled at one CPU kernel level is loaded
at another, and every process of every checkout on a machine shares one cache
(``/tmp/torchinductor_<user>``). Measured: flex compiled under ``ATEN_CPU_CAPABILITY=avx2``
and loaded (a cache hit) by a process at ``avx512`` returns zeros for 176 of 272 query
rows (worst difference 2.73), with no error: the wrong result a test saw once while
other processes shared the cache. So unless the user chose a cache directory
(``TORCHINDUCTOR_CACHE_DIR``), :func:`use_keyed_cache_dir` points inductor at
``<torch's default>/forge/<key>``, the key naming the torch version, the machine, the
CPU kernel level and the thread count. A process only ever loads kernels compiled under
the same key; processes with the same key still share (a first compile costs about
15 s on CPU, so each run does not pay it again).

A directory this module chose is not the user's choice: a child process inherits the
variable, and with another thread count (``torchrun`` workers run on one thread) or
kernel level it gets its own directory again.

Setting the variable redirects every inductor cache of the process, a
``train.compile`` of the model's blocks included (its kernels depend on the same
things). Precompiled headers stay where torch put them at import: their key is their
compile command, which names the instruction set.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_key() -> str:
    """What a compiled CPU kernel depends on beyond its graph, as one directory name."""
    key = (
        f"torch-{torch.__version__}-{platform.machine()}-"
        f"{torch.backends.cpu.get_cpu_capability()}-{torch.get_num_threads()}threads"
    )
    return re.sub(r"[^A-Za-z0-9._+-]", "_", key)


def keyed_root() -> Path:
    """Where the keyed directories live: beside torch's own default cache."""
    return Path(default_cache_dir()) / "forge"


def chosen_by_user(value: str | None) -> bool:
    """Whether ``TORCHINDUCTOR_CACHE_DIR=value`` is the user's choice: set, and neither
    torch's default (which inductor writes into the variable itself on first use) nor a
    directory this module chose (inherited from a parent process)."""
    if not value:
        return False
    path = Path(value).absolute()
    return path != Path(default_cache_dir()).absolute() and path.parent != keyed_root().absolute()


def use_keyed_cache_dir() -> str:
    """Point inductor at the keyed directory unless the user chose one; the directory in
    use either way. Call before the first compile of the process."""
    if not chosen_by_user(os.environ.get(ENV)):
        os.environ[ENV] = str(keyed_root() / cache_key())
    return os.environ[ENV]
