"""``forge_core.api``, the plugin contract: torch-free, a leaf of the import graph, and
the only path into the kernel that the built-ins and the example package use."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from conftest import REPO

API_DIR = REPO / "forge_core" / "api"
EXAMPLE = REPO / "examples" / "forge-plugin-example"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_api_imports_neither_torch_nor_the_rest_of_forge():
    proc = _python(
        "import json, sys\n"
        "import forge_core.api, forge_core.api.unstable\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('forge_core', 'forge_plugins', 'torch', 'numpy', 'cattrs', 'yaml'))))"
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert all(
        m == "forge_core" or m == "forge_core.api" or m.startswith("forge_core.api.") for m in loaded
    ), loaded


def test_api_source_imports_only_api_modules():
    """The static side of the test above: no import of a kernel module, even a lazy one
    inside a function, so that no later code path can pull the kernel into a plugin's
    registration module."""
    outside = []
    for path in sorted(API_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            outside += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] in ("forge_core", "forge_plugins", "torch")
                and not n.startswith("forge_core.api")
            ]
    assert not outside


def test_every_public_name_is_exported():
    import forge_core.api as api

    assert sorted(api.__all__) == sorted(
        n
        for n in vars(api)
        if n[0] not in "_@"
        and n
        not in {
            "batch",
            "chat",
            "environ",
            "errors",
            "files",
            "fingerprint",
            "hooks",
            "metrics",
            "optim",
            "options",
            "packing",
            "parallel",
            "protocols",
            "rules",
            "run",
            "shards",
            "specs",
            "transforms",
            "unstable",
            "validators",
        }
    )


def test_every_module_of_forge_and_the_example_package_imports_without_a_deprecation():
    """Every module of forge_core, forge_plugins and the example package imported in a
    fresh interpreter with deprecation warnings as errors: none is left unimportable by a
    move, and none leans on a deprecated path of its own dependencies."""
    code = f"""
import importlib, pkgutil, sys, warnings
warnings.simplefilter("error", DeprecationWarning)
sys.path.insert(0, {str(EXAMPLE)!r})
import forge_core, forge_plugins, forge_plugin_example
count = 0
for pkg in (forge_core, forge_plugins, forge_plugin_example):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
        count += 1
print(count)
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert int(proc.stdout) > 100  # the walk really ran over the packages


def _forge_imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_built_in_plugins_and_the_example_package_import_only_the_api_from_the_kernel():
    """Built-ins are written as a third party would write them: from the kernel they
    import only forge_core.api (and the test kit, forge_core.testing), lazily or not, and
    the helpers of forge_core.api.unstable, which the example package, as a third party,
    does not; no other submodule of the api."""
    roots = [REPO / "forge_plugins", EXAMPLE]
    files = [f for root in roots for f in sorted(root.rglob("*.py")) if ".venv" not in f.parts]
    assert len(files) > 40
    inside = [
        f"{f.relative_to(REPO)}: {name}"
        for f in files
        for name in _forge_imports(f)
        if name.split(".")[0] == "forge_core"
        and name not in ("forge_core.api", "forge_core.api.unstable")
        and not name.startswith("forge_core.testing")
    ]
    assert not inside
    example = [f for f in files if EXAMPLE in f.parents]
    assert example and not [f for f in example if "forge_core.api.unstable" in _forge_imports(f)]


def test_environment_sets_and_unsets_for_a_while_and_restores_even_on_error():
    from forge_core.api.unstable import environment

    env = {"KEPT": "old", "GONE": "here"}
    with pytest.raises(RuntimeError), environment({"KEPT": "new", "GONE": None, "ADDED": 3}, env):
        assert env == {"KEPT": "new", "ADDED": "3"}
        raise RuntimeError
    assert env == {"KEPT": "old", "GONE": "here"}


#: The contract, by group: what a third party builds on. A name enters or leaves it only
#: by a decision recorded here (and in the changelog), never as a side effect.
STABLE = {
    # hook markers
    "PROJECT", "hookimpl", "hookspec",
    # specs and what they name
    "ComponentSpec", "AttentionBackendSpec", "LoggerSpec", "ModelSpec", "NoOptions", "ObjectiveSpec",
    "OptimizerSpec", "PackerSpec", "ParallelismSpec", "ScheduleSpec", "SourceSpec", "TokenizerSpec",
    "TransformSpec", "import_path",
    # rules and the plan they judge
    "Rule", "Severity", "Plan", "ActiveStrategy", "ChosenSource", "ChosenTransform", "DEGREES",
    # errors, options and validators
    "ForgeError", "option", "Validator", "above", "at_least", "between", "max_chars", "non_blank",
    "path_fits", "relative_path", "satisfies",
    # protocols
    "AttentionBackend", "CachingModel", "Model", "ModelTransform", "Packer", "LazyPacker",
    "ParallelModule", "PretrainedModel", "Source", "Strategy", "Tokenizer", "model_contract_gaps",
    # optional capabilities, each its own protocol
    "PairCountingBackend", "QueryShardingBackend", "FingerprintedSource", "FileFingerprintedSource",
    "TokenDocumentSource", "RecordSource", "BatchEncodingTokenizer", "ChatTokenizer",
    "ChatRenderingTokenizer", "SpecialDecodingTokenizer", "HFSavingTokenizer",
    "BatchTransformingStrategy", "AdapterWritingTransform", "TokenGroupModule", "OptimizerStepModule",
    # the parallel contract
    "BLOCKS", "OUTPUT_HEAD", "PIPELINE", "QUERY_SHARDS", "SEQUENCE_PARALLEL", "TENSOR_PARALLEL",
    "AttentionContext", "MeshDim", "ModelFacts", "ModelSplit", "ParallelContext", "ParallelContract",
    "PipelineSplit", "TensorParallelPlan", "TensorParallelScope", "blocks_of", "contract_of",
    # batch keys, packing and documents
    "DOC_IDS", "IGNORE_INDEX", "INPUT_IDS", "LABELS", "POSITIONS", "BOUNDARIES", "Boundaries",
    "RowLayout", "MaskedDocument", "TokenDocuments", "FileSet", "files_fingerprint",
    # what optimizers, transforms and lifecycle hooks receive
    "NamedParameter", "ROLES", "TransformContext", "transforms_disabled", "RunContext",
}  # fmt: skip


def test_the_stable_contract_is_exactly_the_listed_names():
    import forge_core.api as api

    assert sorted(api.__all__) == sorted(STABLE)


def test_every_stable_name_is_documented_on_the_hooks_page():
    """The hook reference lists every stable name with a summary from its docstring (or a
    constant's ``#:`` comment), so no part of the contract is undocumented."""
    from forge_core.docgen import facade_rows

    rows = facade_rows()
    assert {name for name, _, _ in rows} == STABLE
    assert [name for name, _, summary in rows if len(summary) < 10] == []


def test_a_moved_name_imported_from_the_facade_says_where_it_went():
    import forge_core.api as api
    import forge_core.api.unstable as unstable

    assert unstable.MOVED_FROM_API and not set(unstable.MOVED_FROM_API) & STABLE
    for name in unstable.MOVED_FROM_API:
        assert getattr(unstable, name) is not None
        moved = rf"forge_core\.api\.{name} moved to forge_core\.api\.unstable\.{name} \(not stable: "
        with pytest.raises(ImportError, match=moved):
            exec(f"from forge_core.api import {name}", {})
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        api.nothing_here  # noqa: B018
