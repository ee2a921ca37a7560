"""Run under ``torchrun``: every rank builds the training data of one config through the
token cache, as the trainer does, and rank 0 writes what each saw: the digest of all its
rows, its notes, how many times the source was tokenized (a line per tokenization in a
counter file). Tokenizing is slowed by a second so the other rank finds the lock held.

Usage: ``torchrun --standalone --nproc-per-node 2 data_cache_worker.py CONFIG COUNTER OUT.json``
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np
import torch.distributed as dist

from forge_core import components
from forge_core.cli.exiting import exit_process
from forge_core.data import prepare
from forge_core.data.build import build_training_data
from forge_core.plan import make_plan
from forge_core.resolve import load_resolved


def main() -> None:
    config, counter, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    original = prepare.write_shards

    def counted(*args, **kwargs):
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return original(*args, **kwargs)

    prepare.write_shards = counted
    cfg, registries = load_resolved(config)
    plan = make_plan(cfg, registries, dist.get_world_size())
    tokenizer = components.tokenizer(plan, registries)
    notes: list[str] = []
    data = build_training_data(plan, registries, tokenizer, is_main=True, report=notes.append)
    rows = data.rows.read(np.arange(data.rows.num_rows))
    digest = hashlib.sha256(b"".join(rows[k].tobytes() for k in sorted(rows))).hexdigest()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, {"rows": data.rows.num_rows, "digest": digest, "notes": notes})
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
