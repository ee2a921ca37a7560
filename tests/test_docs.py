"""Tests that keep the documentation true.

- Every hookspec is in ``docs/hooks.md`` with its exact signature and docstring.
- The generated pages (hooks, configuration, CLI, component and rule references) equal
  what ``python -m forge_core.docgen`` produces from the code now.
- Every config key of the schema (recursively) and every built-in component option is
  documented in ``docs/configuration.md``; every ``forge-run`` command and option is in
  ``docs/cli.md``; every kind of component is in ``docs/architecture.md``.
- Every code block of the plugin-author guide marked ``runnable`` is executed: each
  chapter is played in its own temporary project directory, as a reader would.
- Every YAML config shown in the docs is a valid config; every relative link resolves;
  the index and the MkDocs nav list every page.

How a chapter is played (the grammar of runnable blocks):

- ```` ```LANG runnable file=PATH ````: the block's text is written to ``PATH`` in the
  project directory (Python modules, ``pyproject.toml``, YAML configs).
- ```` ```python runnable ```` without ``file``: run as a script in the project
  directory; it must not raise (its asserts are the check).
- ```` ```console runnable [exit=N] ````: each ``$ command`` runs in the project
  directory and must exit ``N`` (default 0); every non-empty line shown after a
  command, except lines starting with ``...`` (elided or illustrative output), must
  occur in that command's output (spaces collapsed).
  ``$ pip install -e .`` is emulated: the ``pyproject.toml`` written earlier is read and
  a ``.dist-info`` with its ``forge`` entry points is put on the path, which is what
  importlib.metadata discovery sees after a real install.
- ``<!-- runnable-setup: a.md b.md -->`` in a chapter first writes the files of those
  chapters and installs their packages.

All chapters are played in one runner process (this file run as a script), so torch is
imported once: ``forge-run`` commands call ``forge_core.cli.main`` (what the console
script runs), ``python -m pytest`` calls ``pytest.main``, Python blocks are executed,
all with file descriptors 1 and 2 captured; any other command runs with bash. Between
chapters the runner forgets the chapter's modules and removes it from ``sys.path``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from forge_core import docgen
from forge_core.cli import COMMANDS, build_parser
from forge_core.config.loader import parse_yaml, resolve_components, structure
from forge_core.config.schema import ForgeConfig

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GUIDE = DOCS / "plugin-guide"
BIN = Path(sys.executable).parent

# --- parsing Markdown ---------------------------------------------------------------

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)


@attrs.frozen
class Block:
    lang: str
    runnable: bool
    flags: frozenset[str]
    options: dict[str, str]
    text: str
    line: int


def code_blocks(markdown: str) -> list[Block]:
    blocks = []
    for m in _FENCE.finditer(markdown):
        words = m.group(1).split()
        lang = words[0] if words else ""
        options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        flags = frozenset(w for w in words[1:] if "=" not in w)
        blocks.append(Block(lang, "runnable" in flags, flags, options, m.group(2), markdown.count("\n", 0, m.start()) + 1))
    return blocks


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` for each ``$`` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith("$ "):
            if steps:
                steps[-1][1].append(line)
            continue
        command = line[2:]
        while command.endswith("\\") and i < len(lines):
            command = command[:-1] + lines[i].strip()
            i += 1
        steps.append((command, []))
    return steps


def setup_chapters(markdown: str) -> list[str]:
    """Chapters named by ``<!-- runnable-setup: a.md b.md -->``: their files are written
    and their packages installed before this chapter is played."""
    match = re.search(r"<!--\s*runnable-setup:(.*?)-->", markdown)
    return match.group(1).split() if match else []


def _squash(text: str) -> str:
    return " ".join(text.split())


# --- playing a chapter --------------------------------------------------------------


def emulate_pip_install(project: Path) -> str:
    """What ``pip install -e .`` leaves for entry-point discovery: a dist-info named
    after the project with the ``[project.entry-points.forge]`` table."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    name, version = meta["name"], meta["version"]
    eps = meta.get("entry-points", {}).get("forge", {})
    assert eps, "pyproject.toml declares no entry points in the group 'forge'"
    info = project / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "\n".join(f"{k} = {v}" for k, v in eps.items())
    (info / "entry_points.txt").write_text(f"[forge]\n{lines}\n")
    return f"Successfully installed {name}-{version}"


def chapter_env(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    env["PYTHONPATH"] = str(project)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def play_chapters(chapters: dict[str, str], root: Path) -> dict[str, str | None]:
    """Play chapters (``{where: markdown}``) in one fresh Python process, each in its own
    project directory under ``root``; ``{where: failure message or None}``. One process
    imports torch once for every chapter, and nothing a chapter does leaks into the test
    process."""
    (root / ".chapters.json").write_text(json.dumps(chapters))
    done = subprocess.run(
        [sys.executable, __file__, "--play", str(root / ".chapters.json")],
        cwd=root, env=chapter_env(root), capture_output=True, text=True, timeout=1800,
    )
    results = root / ".results.json"
    if not results.is_file():
        raise AssertionError(f"the chapter runner crashed (exit {done.returncode}):\n{done.stderr[-20000:]}")
    return json.loads(results.read_text())


def play(markdown: str, project: Path, where: str) -> None:
    failure = play_chapters({where: markdown}, project)[where]
    if failure:
        raise AssertionError(failure)


def _play_all_here(spec: Path) -> None:
    """The runner process of :func:`play_chapters`."""
    chapters = json.loads(spec.read_text())
    results: dict[str, str | None] = {}
    for n, (where, markdown) in enumerate(chapters.items()):
        project = spec.parent / f"chapter{n}"
        project.mkdir()
        try:
            play_here(markdown, project, where)
            results[where] = None
        except AssertionError as exc:
            results[where] = str(exc)
        finally:
            # Leave no trace for the next chapter: its entry points, modules, cwd.
            os.chdir(spec.parent)
            sys.path.remove(str(project))
            _forget_modules_under(project)
    (spec.parent / ".results.json").write_text(json.dumps(results))


@contextlib.contextmanager
def _captured_fds() -> Iterator[Any]:
    """Send file descriptors 1 and 2 to a temporary file: catches print, logging
    handlers and tqdm alike, whatever stream object they hold."""
    sys.stdout.flush()
    sys.stderr.flush()
    sink = tempfile.TemporaryFile(mode="w+b")
    saved = os.dup(1), os.dup(2)
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    try:
        yield sink
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _in_process(fn: Any, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``fn()`` with output captured and ``env`` set; ``(exit status, output)``."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    with _captured_fds() as sink:
        try:
            rc = fn() or 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported like an uncaught error in a process
            traceback.print_exc()
            rc = 1
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sink.seek(0)
    return rc, sink.read().decode("utf-8", "replace")


def _forget_modules_under(project: Path) -> None:
    """A rewritten module is imported afresh by the next command, as in a new process."""
    importlib.invalidate_caches()
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(project)):
            del sys.modules[name]


def _forge_run_argv(command: str) -> tuple[dict[str, str], list[str]] | None:
    """``(env, argv)`` for a plain ``[VAR=value ...] forge-run ...`` command, else None."""
    if any(c in command for c in "|&;<>`$()"):
        return None
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return (env, words[1:]) if words and words[0] == "forge-run" else None


def play_here(markdown: str, project: Path, where: str) -> None:
    """Execute every runnable block of ``markdown`` in ``project``, in order. Python
    blocks and ``forge-run`` commands run in this process (``forge-run`` is
    ``forge_core.cli:main``); other commands run with bash."""
    from forge_core import cli

    os.chdir(project)
    sys.path.insert(0, str(project))
    os.environ["PYTHONPATH"] = str(project)  # for the commands run with bash
    for name in setup_chapters(markdown):
        # The packages of earlier chapters, as their reader would have them installed.
        for block in code_blocks((GUIDE / name).read_text()):
            if block.runnable and "file" in block.options:
                (project / block.options["file"]).parent.mkdir(parents=True, exist_ok=True)
                (project / block.options["file"]).write_text(block.text)
        emulate_pip_install(project)
    for block in code_blocks(markdown):
        if not block.runnable:
            continue
        at = f"{where}:{block.line}"
        if "file" in block.options:
            target = project / block.options["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
            _forget_modules_under(project)
        elif block.lang == "python":
            code = compile(block.text, at, "exec")
            rc, output = _in_process(lambda: exec(code, {"__name__": "__main__"}))  # noqa: S102
            assert rc == 0, f"{at}: python block failed:\n{output}"
        elif block.lang == "console":
            expected_rc = int(block.options.get("exit", "0"))
            for command, shown in console_steps(block.text):
                forge = _forge_run_argv(command)
                if re.fullmatch(r"pip install (-e )?\.", command):
                    rc, output = 0, emulate_pip_install(project)
                elif forge is not None:
                    rc, output = _in_process(lambda: cli.main(forge[1]), forge[0])
                elif command.startswith("python -m pytest "):
                    # In process too (this process already imported torch).
                    args = shlex.split(command)[3:]
                    rc, output = _in_process(lambda: int(pytest.main(args)))
                else:
                    done = subprocess.run(["bash", "-c", command], cwd=project, capture_output=True,
                                          text=True, timeout=600)
                    rc, output = done.returncode, done.stdout + done.stderr
                assert rc == expected_rc, f"{at}: `{command}` exited {rc}, expected {expected_rc}:\n{output}"
                for line in shown:
                    if line.strip() and not line.strip().startswith("..."):
                        assert _squash(line) in _squash(output), (
                            f"{at}: `{command}` did not print {line.strip()!r}; it printed:\n{output}"
                        )
        else:
            raise AssertionError(f"{at}: a runnable {block.lang!r} block needs file=PATH")


CHAPTERS = sorted(p.name for p in GUIDE.glob("*.md") if any(b.runnable for b in code_blocks(p.read_text())))


@pytest.fixture(scope="session")
def chapter_failures(request, tmp_path_factory):
    """Every selected chapter, played in one runner process."""
    wanted = sorted({
        item.callspec.params["chapter"] for item in request.session.items
        if getattr(item, "originalname", "") == "test_plugin_guide_chapter_runs" and hasattr(item, "callspec")
    })
    chapters = {f"docs/plugin-guide/{name}": (GUIDE / name).read_text() for name in wanted}
    return play_chapters(chapters, tmp_path_factory.mktemp("chapters"))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_plugin_guide_chapter_runs(chapter, chapter_failures):
    failure = chapter_failures[f"docs/plugin-guide/{chapter}"]
    assert failure is None, failure


def test_every_worked_chapter_has_runnable_blocks():
    expected = {"attention-backend.md", "packer.md", "parallelism.md", "rule.md", "logger.md",
                "capabilities.md", "packaging.md", "testing.md"}
    assert expected <= set(CHAPTERS), f"chapters without runnable blocks: {sorted(expected - set(CHAPTERS))}"


# The harness itself must be able to fail, or the chapter tests prove nothing.

_FAKE_CHAPTER = """
```toml runnable file=pyproject.toml
[project]
name = "forge-fake"
version = "0.3"
[project.entry-points.forge]
fake = "fake_plugin"
```

```python runnable file=fake_plugin.py
from forge_core.api import PackerSpec, hookimpl

@hookimpl
def forge_packers():
    return [PackerSpec(name="fakepack", summary="Fake", impl="fake_plugin:Nothing")]
```

```console runnable
$ pip install -e .
$ forge-run plugins
fake  (forge-fake 0.3, third-party, fake_plugin)
    packer       fakepack       Fake
```
"""


def test_harness_installs_and_checks_output(tmp_path):
    play(_FAKE_CHAPTER, tmp_path, "fake")


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("packer       fakepack       Fake", "packer fakepack Something else", "did not print"),
        ("```console runnable", "```console runnable exit=2", "expected 2"),
        ("return [PackerSpec", "assert False\n    return [PackerSpec", "exited 2, expected 0"),
    ],
)
def test_harness_fails_when_the_doc_is_wrong(tmp_path, old, new, complaint):
    with pytest.raises(AssertionError, match=complaint):
        play(_FAKE_CHAPTER.replace(old, new), tmp_path, "fake")


def test_console_steps_parse_commands_continuations_and_output():
    steps = console_steps("$ forge-run check a.yaml \\\n    x=1\nerror: boom\n...\n$ ls\nout\n")
    assert steps == [("forge-run check a.yaml x=1", ["error: boom", "..."]), ("ls", ["out"])]


# --- hook reference -----------------------------------------------------------------


def _hookspecs():
    return {f.__name__: f for f in docgen.hookspec_functions()}


def test_hookspec_discovery_finds_every_forge_hook():
    from forge_core import hookspecs

    declared = {n for n, o in vars(hookspecs).items() if n.startswith("forge_") and callable(o)}
    assert set(_hookspecs()) == declared and len(declared) >= 14


def hook_doc_problems(text: str, specs: dict) -> list[str]:
    """Differences between the hooks documented in ``text`` and the hookspecs."""
    documented = dict(re.findall(r"^def (forge_\w+)(\(.*\) -> .*): \.\.\.$", text, re.M))
    problems = []
    for name, func in specs.items():
        expected = str(inspect.signature(func)).replace("'", "")
        if name not in documented:
            problems.append(f"hook {name} is missing")
        elif documented[name] != expected:
            problems.append(f"shows {name}{documented[name]} but the hookspec is {name}{expected}")
    problems += [f"documents {name}, which is not a hook" for name in sorted(set(documented) - set(specs))]
    return problems


def test_every_hookspec_is_documented_with_its_exact_signature():
    problems = hook_doc_problems((DOCS / "hooks.md").read_text(), _hookspecs())
    assert not problems, f"docs/hooks.md: {'; '.join(problems)}. Run `{docgen.REGENERATE}`."


def test_signature_check_catches_a_renamed_hook_and_a_new_argument():
    text = (DOCS / "hooks.md").read_text()
    specs = _hookspecs()

    def forge_step_end(run: "RunContext", step: "int", metrics: "dict[str, Any]", extra: "int") -> "None":  # noqa: F821
        """A new argument."""

    changed = {**specs, "forge_step_end": forge_step_end}
    assert any("forge_step_end" in p and "extra" in p for p in hook_doc_problems(text, changed))
    renamed = {("forge_step_finished" if n == "forge_step_end" else n): f for n, f in specs.items()}
    problems = hook_doc_problems(text, renamed)
    assert "hook forge_step_finished is missing" in problems
    assert "documents forge_step_end, which is not a hook" in problems


def test_every_hook_docstring_is_in_the_hook_reference():
    text = _squash((DOCS / "hooks.md").read_text())
    for name, func in _hookspecs().items():
        doc = _squash(docgen.rst_to_markdown(inspect.getdoc(func)).split("Example:")[0])
        assert doc in text, f"the docstring of {name} differs from docs/hooks.md; run `{docgen.REGENERATE}`"


def test_rst_to_markdown_converts_roles_literals_and_examples():
    text = "Return :class:`~forge_core.specs.PackerSpec` or ``None``.\n\nExample::\n\n    x = 1\n    y = 2\n\nAfter."
    assert docgen.rst_to_markdown(text) == (
        "Return `PackerSpec` or `None`.\n\nExample:\n\n```python\nx = 1\ny = 2\n```\n\nAfter."
    )


# --- generated pages ----------------------------------------------------------------


def test_generated_pages_are_current():
    stale = docgen.stale_pages(DOCS)
    assert not stale, (
        f"these generated pages differ from the code: {', '.join('docs/' + s for s in stale)}. "
        f"Regenerate them with `{docgen.REGENERATE}` and commit the result."
    )


def test_stale_check_notices_an_edit(tmp_path):
    for rel, text in docgen.generated_pages().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert docgen.stale_pages(tmp_path) == []
    (tmp_path / "reference/rules.md").write_text("# Compatibility rules\n")
    assert docgen.stale_pages(tmp_path) == ["reference/rules.md"]


def test_reference_pages_equal_the_cli_markdown_output():
    env = {k: v for k, v in os.environ.items() if k != "FORGE_BLOCK_PLUGINS"}
    env["FORGE_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for command, page in (("plugins", "components.md"), ("rules", "rules.md")):
        done = subprocess.run([sys.executable, "-m", "forge_core.cli", command, "--markdown"],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == (DOCS / "reference" / page).read_text(), (
            f"`forge-run {command} --markdown` differs from docs/reference/{page}; run `{docgen.REGENERATE}`"
        )


def test_every_config_key_is_documented():
    text = (DOCS / "configuration.md").read_text()
    keys = docgen.config_keys()
    assert "train.nonfinite.policy" in keys and "run.out_dir" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"config keys missing from docs/configuration.md: {missing}; run `{docgen.REGENERATE}`"


def test_every_builtin_component_option_is_documented():
    text = (DOCS / "configuration.md").read_text()
    keys = docgen.component_option_keys(docgen.builtin_registries())
    assert "attention.options.block_size" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"component options missing from docs/configuration.md: {missing}"


def test_every_cli_command_is_documented():
    text = (DOCS / "cli.md").read_text()
    commands = docgen.subcommands(build_parser())
    assert set(commands) == set(COMMANDS)
    for name, parser in commands.items():
        assert f"## `forge-run {name}`" in text, f"forge-run {name} is missing from docs/cli.md"
        for action in parser._actions:  # noqa: SLF001
            for flag in action.option_strings:
                assert flag in text, f"forge-run {name} {flag} is missing from docs/cli.md"


def test_architecture_names_every_kind_of_component():
    from forge_core.registry import KINDS

    text = (DOCS / "architecture.md").read_text()
    for kind in KINDS:
        row = f"| `{kind.name}` | `{kind.hook}` | `{kind.spec_cls.__name__}` |"
        assert row in text, f"docs/architecture.md lacks the row {row}"


def test_docgen_imports_no_torch():
    code = ("import sys, forge_core.docgen as d; d.generated_pages(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- every page ---------------------------------------------------------------------


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_yaml_configs_in_the_docs_are_valid():
    """Every ```yaml block (unless marked ``fragment``) is a config that structures
    against the schema; outside the plugin guide, whose chapters name their own
    components (and are run), its components and their options must be built-in ones."""
    registries = docgen.builtin_registries()
    checked = 0
    for page in _pages():
        for block in code_blocks(page.read_text()):
            if block.lang != "yaml" or "fragment" in block.flags:
                continue
            where = f"{page.relative_to(REPO)}:{block.line}"
            config, issues = structure(parse_yaml(block.text, "$"), ForgeConfig)
            assert not issues, f"{where}: {issues}"
            if page.parent != GUIDE:
                _, issues = resolve_components(config, registries)
                assert not issues, f"{where}: {issues}"
            checked += 1
    assert checked >= 8


def _anchors(page: Path) -> set[str]:
    """Heading ids as GitHub and MkDocs make them (outside code blocks)."""
    text = _FENCE.sub("", page.read_text())
    return {docgen._anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_relative_links_and_anchors_resolve():
    for page in _pages():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (page.parent / target).resolve() if target else page
            where = f"{page.relative_to(REPO)} links to {target}#{anchor}"
            assert resolved.exists(), f"{where}: no such file"
            if anchor and resolved.suffix == ".md" and resolved.is_relative_to(DOCS):
                assert anchor in _anchors(resolved), f"{where}: no such heading"


def test_index_links_every_page():
    index = (DOCS / "index.md").read_text()
    for page in _pages():
        rel = page.relative_to(DOCS).as_posix()
        if rel != "index.md":
            assert f"({rel})" in index or f"({rel}#" in index, f"docs/index.md does not link {rel}"


def test_mkdocs_nav_lists_every_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def flatten(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from flatten(value) if isinstance(value, list) else [value]

    assert set(flatten(config["nav"])) == {p.relative_to(DOCS).as_posix() for p in _pages()}


if __name__ == "__main__" and sys.argv[1:2] == ["--play"]:
    _play_all_here(Path(sys.argv[2]))
