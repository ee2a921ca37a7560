"""What must stay cheap stays torch-free: loading every entry point of the ``forge``
group and calling each registration hook it implements, the kit and its pytest plugin,
the commands that only judge or list (``check``, ``show``, ``plugins``, ``rules``, a
refused ``train``; a model and tokenizer by Hub id among them) and the generator of the
documentation pages. One fresh interpreter does all of it, since in this process torch is
long imported; the rest of the suite cannot see an import it should not make."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

HEAVY = ("torch", "transformers", "tokenizers")

DRIVER = """
import json, sys
from importlib import metadata

from forge_core.cli import main
from forge_core.registry import KINDS
from forge_core.testing import forge_run
import forge_core.testing.pytest_plugin

HEAVY = {heavy!r}
loaded = {{}}
for ep in sorted(metadata.entry_points(group="forge"), key=lambda ep: ep.name):
    module = ep.load()
    for hook in [kind.hook for kind in KINDS] + ["forge_rules"]:
        if hasattr(module, hook):
            getattr(module, hook)()
            loaded.setdefault(ep.name, []).append(hook)
    assert not set(HEAVY) & set(sys.modules), (ep.name, sorted(set(HEAVY) & set(sys.modules)))
codes = [forge_run(argv).code for argv in {commands!r}]
import forge_core.docgen
forge_core.docgen.generated_pages()
print(json.dumps({{"loaded": loaded, "codes": codes, "heavy": sorted(set(HEAVY) & set(sys.modules))}}))
"""


def test_entry_points_the_kit_the_judging_commands_and_docgen_import_no_torch(forge_config, tmp_path):
    valid = forge_config({"data": {"packer": "concat"}})
    refused = forge_config(
        {"data": {"packer": "concat"}, "parallel": {"pp": 2}}
    )  # train refuses it before building
    # check reads the hf_datasets files' fields (a Parquet schema through pyarrow) and the
    # CPU flags for bf16 without torch.
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.table({"body": ["some text"]}), tmp_path / "rows.parquet")
    fields = forge_config(
        {
            "data": {
                "source": "hf_datasets",
                "source_options": {"data_files": [str(tmp_path / "rows.parquet")]},
                "packer": "none",
            },
            "train": {"precision": "bf16"},
        }
    )
    # Hub ids: check reads the cache's layout and a snapshot's headers; a train refused for
    # an uncached id (offline) fetches nothing.
    from hub_cache import header_only_checkpoint, put, tokenizer
    from test_hub import CONFIG

    put(tmp_path / "hub", "acme/tiny", tokenizer(header_only_checkpoint(tmp_path / "ck", CONFIG)))
    by_id = {"init_from_hf": "acme/tiny"}
    hub = forge_config(
        {
            "model": {"options": by_id},
            "data": {"tokenizer": "hf", "tokenizer_options": {"path": "acme/tiny"}, "seq_len": 32},
        }
    )
    uncached = forge_config({"model": {"options": {"init_from_hf": "acme/missing"}}})
    commands = [
        ["check", valid],
        ["show", valid],
        ["plugins"],
        ["rules"],
        ["check", refused, "--world-size", "1"],
        [refused],
        ["check", fields],
        ["check", hub],
        ["check", uncached],
        [uncached],
    ]
    code = DRIVER.format(heavy=HEAVY, commands=commands)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["heavy"] == [], report
    assert report["codes"] == [0, 0, 0, 0, 2, 2, 2, 0, 2, 2], report
    # Every built-in plugin was loaded and registered something: nothing was skipped.
    assert {
        "attention",
        "models",
        "packers",
        "sources",
        "tokenizers",
        "optim",
        "parallel",
        "loggers",
        "core_rules",
    } <= set(report["loaded"]), report["loaded"]
    assert all(report["loaded"].values())
