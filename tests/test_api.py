"""``forge_core.api``, the plugin contract: torch-free, a leaf of the import graph, and
the only path Forge itself uses; every old import path still works for one release and
warns naming the new one."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import warnings

import pytest
from conftest import REPO

API_DIR = REPO / "forge_core" / "api"
EXAMPLE = REPO / "examples" / "forge-plugin-example"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_api_imports_neither_torch_nor_the_rest_of_forge():
    proc = _python(
        "import json, sys\n"
        "import forge_core.api\n"
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
            "validators",
        }
    )


def test_no_module_of_forge_or_the_example_package_uses_a_deprecated_path():
    """Every module of forge_core, forge_plugins and the example package imported in a
    fresh interpreter with deprecation warnings as errors: nothing inside Forge still goes
    through an old path."""
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
    import only forge_core.api (and the test kit, forge_core.testing), lazily or not."""
    roots = [REPO / "forge_plugins", EXAMPLE]
    files = [f for root in roots for f in sorted(root.rglob("*.py")) if ".venv" not in f.parts]
    assert len(files) > 40
    inside = [
        f"{f.relative_to(REPO)}: {name}"
        for f in files
        for name in _forge_imports(f)
        if name.split(".")[0] == "forge_core"
        and not name.startswith(("forge_core.api", "forge_core.testing"))
    ]
    assert not inside


OLD_PATHS = [
    ("forge_core.specs", "ModelSpec", "forge_core.api", "ModelSpec"),
    ("forge_core.specs", "ParallelismSpec", "forge_core.api", "ParallelismSpec"),
    ("forge_core.specs", "DOC_IDS", "forge_core.api", "DOC_IDS"),
    ("forge_core.specs", "import_path", "forge_core.api", "import_path"),
    ("forge_core.hookspecs", "hookimpl", "forge_core.api", "hookimpl"),
    ("forge_core.hookspecs", "PROJECT", "forge_core.api", "PROJECT"),
    ("forge_core.rules", "Rule", "forge_core.api", "Rule"),
    ("forge_core.rules", "RuleContext", "forge_core.api", "Plan"),
    ("forge_core.errors", "ForgeError", "forge_core.api", "ForgeError"),
    ("forge_core.errors", "did_you_mean", "forge_core.api", "did_you_mean"),
    ("forge_core.errors", "unknown_name", "forge_core.api", "unknown_name"),
    ("forge_core.run_context", "RunContext", "forge_core.api", "RunContext"),
    ("forge_core.train.parallel_context", "ParallelContext", "forge_core.api", "ParallelContext"),
    ("forge_core.train.parallelize", "ModelSplit", "forge_core.api", "ModelSplit"),
    ("forge_core.train.parallelize", "transformer_blocks", "forge_core.api", "blocks_of"),
    ("forge_core.rules", "render", "forge_core.cli.report", "render"),
    ("forge_core.judge", "IMPLEMENTATION_FOUND", "forge_core.component_checks", "IMPLEMENTATION_FOUND"),
    ("forge_core.config.validators", "at_least", "forge_core.api", "at_least"),
    ("forge_core.config.schema", "field", "forge_core.api", "option"),
    ("forge_plugins.optim.options", "opt", "forge_core.api", "option"),
]


@pytest.mark.parametrize(
    ("module", "name", "new_module", "new_name"), OLD_PATHS, ids=[f"{m}.{n}" for m, n, _, _ in OLD_PATHS]
)
def test_old_path_warns_and_names_the_new_one(module, name, new_module, new_name):
    old = importlib.import_module(module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(old, name)
    assert value is getattr(importlib.import_module(new_module), new_name)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 1, messages
    assert f"{module}.{name} is deprecated" in messages[0]
    assert f"from {new_module} import {new_name}" in messages[0]
    assert caught[0].filename == __file__  # the warning points at the caller's line


def test_an_unknown_name_at_an_old_path_is_an_attribute_error():
    import forge_core.specs

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        forge_core.specs.Nope  # noqa: B018


def test_rule_context_alias_still_constructs_a_plan():
    import forge_core.api as api
    import forge_core.rules

    with pytest.warns(DeprecationWarning, match="RuleContext is now called Plan"):
        ctx_cls = forge_core.rules.RuleContext
    assert ctx_cls is api.Plan
