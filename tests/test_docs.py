"""Tests that keep the documentation true.

- The generated pages (hooks, configuration, CLI, component and rule references, the
  example package's page) equal what ``python -m forge_core.docgen`` produces now, and
  every template under ``docs/templates/`` is filled exactly.
- What the generator produces is complete: every hookspec (the set pluggy registers) with
  its exact signature and docstring, every config key of the schema (recursively) and
  every built-in component option, every ``forge-run`` command and option. The table of
  kinds in ``docs/architecture.md`` is :data:`forge_core.kinds.KINDS`.
- Every code block of the plugin-author guide marked runnable is executed: each chapter
  is played in its own temporary project directory, as a reader would (the grammar and
  the runner are in ``doc_chapters.py``), and the runner is shown to fail when a chapter
  is wrong.
- Every fence renders as code on a code host and in MkDocs; every YAML config shown in
  the docs is a valid config; every relative link stays inside ``docs/`` and resolves,
  anchors included; the index and the MkDocs nav list every page.

The built site itself (``mkdocs build --strict``, the pages in a browser) is checked in
``test_site.py``.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from doc_chapters import (
    GUIDE,
    DocSyntaxError,
    Setting,
    code_blocks,
    console_steps,
    forge_run_argv,
    play,
    play_chapters,
    squash,
    trains,
    without_code,
)

from forge_core import docgen
from forge_core.cli.main import COMMANDS, build_parser
from forge_core.config.blocks import resolve_components
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.config.yaml_reader import parse_yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

# --- the plugin guide's chapters -------------------------------------------------

CHAPTERS = sorted(
    p.name for p in GUIDE.glob("*.md") if any(b.runnable for b in code_blocks(p.read_text(), p.name))
)


@pytest.fixture(scope="session")
def chapter_failures(request, tmp_path_factory):
    """Every selected chapter, and getting started if its test is selected, played in
    one runner process (torch and Forge imported once for all of them)."""
    selected = {getattr(item, "originalname", "") for item in request.session.items}
    wanted = sorted(
        {
            item.callspec.params["chapter"]
            for item in request.session.items
            if getattr(item, "originalname", "") == "test_plugin_guide_chapter_runs"
            and hasattr(item, "callspec")
        }
    )
    chapters, settings = {}, {}
    if "test_getting_started_commands_run_as_pasted" in selected:
        chapters[GETTING_STARTED] = (REPO / GETTING_STARTED).read_text()
        settings[GETTING_STARTED] = Setting(links=("configs",), train_overrides=SMALL)
    chapters.update({f"docs/plugin-guide/{name}": (GUIDE / name).read_text() for name in wanted})
    return play_chapters(chapters, tmp_path_factory.mktemp("chapters"), settings)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_plugin_guide_chapter_runs(chapter, chapter_failures):
    failure = chapter_failures[f"docs/plugin-guide/{chapter}"]
    assert failure is None, failure


def test_every_worked_chapter_has_runnable_blocks():
    expected = {
        "attention-backend.md",
        "packer.md",
        "parallelism.md",
        "rule.md",
        "logger.md",
        "capabilities.md",
        "packaging.md",
        "testing.md",
        "model.md",
        "hf-export.md",
        "source.md",
        "tokenizer.md",
        "optimizer.md",
        "schedule.md",
        "objective.md",
        "transform.md",
    }
    assert expected <= set(CHAPTERS), f"chapters without runnable blocks: {sorted(expected - set(CHAPTERS))}"


# --- getting started, as pasted ----------------------------------------------------

GETTING_STARTED = "docs/getting-started.md"
#: Appended to every training command of the page when the test plays it: the reader's
#: commands, for 4 steps of a model and a corpus small enough for a test (every shipped
#: config the page trains takes them; tp=2 and pp=2 divide them). A resume with more
#: steps is the train tests' to prove; here the command must run as pasted.
SMALL = (
    "train.steps=4",
    "train.warmup_steps=1",
    "checkpoint.every=2",
    "train.batch_size=4",
    "model.options.dim=16",
    "model.options.n_layers=2",
    "model.options.n_heads=2",
    "model.options.n_kv_heads=2",
    "model.options.max_seq_len=16",
    "data.seq_len=16",
    "data.source_options.max_bytes=20000",
    # The quickstart holds out 5%: of the few documents in 20 kB that can be none.
    "data.heldout.fraction=0.3",
    "data.cache.dir=cache",
    # Every process would time CPU matmuls for its MFU peak (test_peak.py tests that).
    "train.peak_tflops=1.0",
)


def test_every_getting_started_command_is_run():
    """Every ``forge-run`` command on the page is in a block the test below runs, but
    the installation's (it makes the environment the test runs in)."""
    blocks = code_blocks((REPO / GETTING_STARTED).read_text(), GETTING_STARTED)
    unrun = [
        f"{GETTING_STARTED}:{b.line}"
        for b in blocks
        if b.lang == "console" and "$ forge-run" in b.text and not b.runnable and "pip install" not in b.text
    ]
    assert not unrun, f"console blocks with forge-run commands not marked <!-- runnable -->: {unrun}"
    assert sum(b.runnable for b in blocks) >= 9


@pytest.mark.slow
@pytest.mark.distributed
def test_getting_started_commands_run_as_pasted(chapter_failures):
    """The page's commands, from a checkout's root (``configs/`` linked in), each
    training command with :data:`SMALL` appended (played with the plugin guide's
    chapters, in their runner process)."""
    assert chapter_failures[GETTING_STARTED] is None, chapter_failures[GETTING_STARTED]


# The harness itself must be able to fail, or the chapter tests prove nothing.

_FAKE_CHAPTER = """
<!-- runnable file=pyproject.toml -->
```toml
[project]
name = "forge-fake"
version = "0.3"
[project.entry-points.forge]
fake = "fake_plugin"
```

<!-- runnable file=fake_plugin.py -->
```python
from forge_core.api import PackerSpec, hookimpl

@hookimpl
def forge_packers():
    return [PackerSpec(name="fakepack", summary="Fake", impl="fake_plugin:Nothing")]
```

<!-- runnable -->
```console
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
        ("<!-- runnable -->\n```console", "<!-- runnable exit=2 -->\n```console", "expected 2"),
        # The old form, which MkDocs renders as a paragraph, is refused with the new one named.
        (
            "<!-- runnable file=fake_plugin.py -->\n```python",
            "```python runnable file=fake_plugin.py",
            "write `<!-- runnable file=fake_plugin.py -->` on the line before a plain ```python fence",
        ),
        ("return [PackerSpec", "assert False\n    return [PackerSpec", "exited 2, expected 0"),
    ],
)
def test_harness_fails_when_the_doc_is_wrong(tmp_path, old, new, complaint):
    with pytest.raises(AssertionError, match=complaint):
        play(_FAKE_CHAPTER.replace(old, new), tmp_path, "fake")


def test_markers_give_flags_and_options_to_the_fence_below():
    blocks = code_blocks(
        "<!-- runnable exit=2 -->\n```console\n$ ls\n```\n\n```python\nx = 1\n```\n"
        "<!-- fragment -->\n```yaml\na: 1\n```\n"
    )
    assert [(b.lang, b.runnable, b.options, b.flags, b.line) for b in blocks] == [
        ("console", True, {"exit": "2"}, frozenset({"runnable"}), 2),
        ("python", False, {}, frozenset(), 6),
        ("yaml", False, {}, frozenset({"fragment"}), 10),
    ]
    assert blocks[0].text == "$ ls\n"


@pytest.mark.parametrize(
    ("markdown", "complaint"),
    [
        (
            "<!-- runnable -->\n\n```python\nx = 1\n```\n",
            r"page.md:1: `<!-- runnable -->` is not on the line right",
        ),
        ("Text.\n<!-- runnable file=a.py -->\nMore text.\n", r"page.md:2: `<!-- runnable file=a.py -->`"),
        ("```yaml fragment\na: 1\n```\n", r"page.md:1: the fence ```yaml fragment is not rendered as code"),
    ],
)
def test_a_marker_that_marks_nothing_or_a_long_info_string_is_refused(markdown, complaint):
    with pytest.raises(DocSyntaxError, match=complaint):
        code_blocks(markdown, "page.md")


def test_a_marker_shown_inside_a_code_block_is_text():
    (block,) = code_blocks("```markdown\n<!-- runnable -->\n\ntext\n```\n")
    assert not block.runnable and "<!-- runnable -->" in block.text


def test_console_steps_parse_commands_continuations_and_output():
    steps = console_steps("$ forge-run check a.yaml \\\n    x=1\nerror: boom\n...\n$ ls\nout\n")
    assert steps == [("forge-run check a.yaml x=1", ["error: boom", "..."]), ("ls", ["out"])]


def test_a_forge_run_command_drops_its_comment_and_training_is_recognised():
    assert forge_run_argv("forge-run show a.yaml x=1   # the config") == ({}, ["show", "a.yaml", "x=1"])
    assert forge_run_argv('forge-run sample r --prompt "# x"') == ({}, ["sample", "r", "--prompt", "# x"])
    assert trains(["a.yaml", "x=1"]) and trains(["--nproc", "2", "configs/q.yml"])
    assert not trains(["show", "a.yaml"]) and not trains(["export-hf", "runs/q", "hf-out"])


# --- hook reference -----------------------------------------------------------------


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """What the generator writes now: the completeness checks below look at it, not at
    the committed pages (whether those are current is one test of its own)."""
    return docgen.generated_pages()


def _hookspecs():
    return {f.__name__: f for f in docgen.hookspec_functions()}


def _listed_under(text: str, caption: str) -> list[str]:
    """The names of the link list right after the line ``caption``."""
    block = text.split(f"\n{caption}\n\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^- \[`(\w+)`\]", block, re.M)


def test_hookspec_discovery_finds_every_forge_hook(pages):
    """The hooks docgen finds are the ones pluggy registers from the hookspec module;
    the registration hooks are exactly one per kind of component plus ``forge_rules``,
    each implemented by a built-in plugin, and the page lists them in those two groups."""
    import pluggy

    from forge_core import hookspecs
    from forge_core.api.hooks import PROJECT
    from forge_core.kinds import KINDS

    found = set(_hookspecs())
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(hookspecs)
    assert found == {name for name in vars(manager.hook) if not name.startswith("_")}
    registration = {kind.hook for kind in KINDS} | {"forge_rules"}
    assert registration < found
    text = pages["hooks.md"]
    assert set(_listed_under(text, "Registration hooks:")) == registration
    lifecycle = _listed_under(
        text, "Lifecycle hooks (implemented by loggers, see [the logger chapter](plugin-guide/logger.md)):"
    )
    assert set(lifecycle) == found - registration
    implemented = docgen.builtin_registries().plugins.pm.hook
    assert [h for h in sorted(registration) if not getattr(implemented, h).get_hookimpls()] == []


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


def test_every_hookspec_is_documented_with_its_exact_signature(pages):
    problems = hook_doc_problems(pages["hooks.md"], _hookspecs())
    assert not problems, f"the hook reference: {'; '.join(problems)}"


def test_signature_check_catches_a_renamed_hook_and_a_new_argument(pages):
    text = pages["hooks.md"]
    specs = _hookspecs()

    def forge_step_end(run: "RunContext", step: "int", metrics: "dict[str, Any]", extra: "int") -> "None":  # noqa: F821
        """A new argument."""

    changed = {**specs, "forge_step_end": forge_step_end}
    assert any("forge_step_end" in p and "extra" in p for p in hook_doc_problems(text, changed))
    renamed = {("forge_step_finished" if n == "forge_step_end" else n): f for n, f in specs.items()}
    problems = hook_doc_problems(text, renamed)
    assert "hook forge_step_finished is missing" in problems
    assert "documents forge_step_end, which is not a hook" in problems


def test_every_hook_docstring_is_in_the_hook_reference(pages):
    text = squash(pages["hooks.md"])
    for name, func in _hookspecs().items():
        doc = squash(docgen.rst_to_markdown(inspect.getdoc(func)).split("Example:")[0])
        assert doc in text, f"the docstring of {name} is not in the hook reference"


def test_rst_to_markdown_converts_roles_literals_and_examples():
    text = (
        "Return :class:`~forge_core.api.PackerSpec` or ``None``.\n\n"
        "Example::\n\n    x = 1\n    y = 2\n\nAfter."
    )
    assert docgen.rst_to_markdown(text) == (
        "Return `PackerSpec` or `None`.\n\nExample:\n\n```python\nx = 1\ny = 2\n```\n\nAfter."
    )
    assert docgen.rst_to_markdown("See :mod:`forge_core.api`, :func:`~a.b`.") == "See `forge_core.api`, `b`."
    assert docgen.rst_to_markdown("(`the gradient\nconvention <a.md#b>`_, ``x <y>``)") == (
        "([the gradient\nconvention](a.md#b), `x <y>`)"
    )


# --- generated pages ----------------------------------------------------------------


def test_generated_pages_are_current():
    stale = docgen.stale_pages(DOCS)
    assert not stale, (
        f"these generated pages differ from the code: {', '.join('docs/' + s for s in stale)}. "
        f"Regenerate them with `{docgen.REGENERATE}` and commit the result."
    )


def test_stale_check_notices_an_edit(tmp_path, pages):
    for rel, text in pages.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert docgen.stale_pages(tmp_path) == []
    (tmp_path / "reference/rules.md").write_text("# Compatibility rules\n")
    assert docgen.stale_pages(tmp_path) == ["reference/rules.md"]


def test_every_template_is_the_prose_of_a_generated_page(pages):
    templates = {
        p.relative_to(docgen.TEMPLATES_DIR).as_posix() for p in docgen.TEMPLATES_DIR.rglob("*") if p.is_file()
    }
    assert templates == {"hooks.md", "configuration.md", "cli.md", "coming-from.md", docgen.EXAMPLE_PAGE}
    assert templates < set(pages)


def test_a_template_must_use_exactly_the_placeholders_given(tmp_path, monkeypatch):
    monkeypatch.setattr(docgen, "DOCS_DIR", tmp_path / "docs")
    monkeypatch.setattr(docgen, "TEMPLATES_DIR", tmp_path / "docs" / "templates")
    template = tmp_path / "docs" / "templates" / "page.md"
    template.parent.mkdir(parents=True)
    template.write_text("{{notice}}\n\n$ forge-run {a: 1} `$.x`\n\n{{help:export-hf}}\n")
    assert docgen.fill("page.md", {"help:export-hf": "usage"}) == (
        f"<!-- Generated by `{docgen.REGENERATE}` from docs/templates/page.md; do not edit by hand. -->\n\n"
        "$ forge-run {a: 1} `$.x`\n\nusage\n"
    )
    with pytest.raises(ValueError, match=r"^docs/templates/page.md: add the placeholders \{\{help:eval\}\}$"):
        docgen.fill("page.md", {"help:export-hf": "usage", "help:eval": "usage"})
    with pytest.raises(ValueError, match=r"^docs/templates/page.md: nothing fills \{\{help:export-hf\}\}$"):
        docgen.fill("page.md", {})
    template.write_text("{{notice}} {{ spaced }}\n")
    with pytest.raises(ValueError, match="Invalid placeholder in string: line 1, col 13"):
        docgen.fill("page.md", {})


def test_reference_pages_equal_the_cli_markdown_output(pages):
    env = {k: v for k, v in os.environ.items() if k != "FORGE_BLOCK_PLUGINS"}
    env["FORGE_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for command, page in (("plugins", "components.md"), ("rules", "rules.md")):
        done = subprocess.run(
            [sys.executable, "-m", "forge_core.cli", command, "--markdown"],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == pages[f"reference/{page}"], (
            f"`forge-run {command} --markdown` differs from what docgen writes to docs/reference/{page}"
        )


def test_every_config_key_is_documented(pages):
    text = pages["configuration.md"]
    keys = docgen.config_keys()
    assert "train.nonfinite.policy" in keys and "run.out_dir" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"config keys missing from the configuration reference: {missing}"


def test_every_builtin_component_option_is_documented(pages):
    text = pages["configuration.md"]
    keys = docgen.component_option_keys(docgen.builtin_registries())
    assert "attention.options.block_size" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"component options missing from the configuration reference: {missing}"


def test_every_cli_command_is_documented(pages):
    text = pages["cli.md"]
    commands = docgen.subcommands(build_parser())
    assert set(commands) == set(COMMANDS)
    for name, parser in commands.items():
        assert f"## `forge-run {name}`" in text, f"forge-run {name} is missing from the CLI reference"
        for action in parser._actions:  # noqa: SLF001
            for flag in action.option_strings:
                assert flag in text, f"forge-run {name} {flag} is missing from the CLI reference"


def test_architecture_table_is_the_kinds_of_component():
    """The table of docs/architecture.md lists exactly the kinds, in their order, each
    with its hook, its spec class and the config key that chooses it."""
    from forge_core.kinds import KINDS

    text = (DOCS / "architecture.md").read_text()
    header = "| kind | hook | spec | chosen by |\n| --- | --- | --- | --- |\n"
    table = text.split(header, 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in table.splitlines()]
    assert [row[:3] for row in rows] == [
        [f"`{kind.name}`", f"`{kind.hook}`", f"`{kind.spec_cls.__name__}`"] for kind in KINDS
    ], "the table of docs/architecture.md differs from forge_core/kinds.py"
    for row, kind in zip(rows, KINDS):
        assert f"`{kind.name_path}`" in row[3], f"architecture.md: {kind.name} is chosen by {kind.name_path}"


def test_every_kind_is_chosen_and_configured_by_keys_of_the_schema():
    from forge_core.kinds import KINDS

    keys = set(docgen.config_keys())
    assert [(k.name_path, k.options_path) for k in KINDS if not {k.name_path, k.options_path} <= keys] == []


def test_the_formatter_leaves_exactly_the_generated_pages_alone():
    """ruff formats the code blocks of Markdown pages: the generated ones are excluded,
    so that the formatter and the generator never disagree on them."""
    import tomllib

    settings = tomllib.loads((REPO / "pyproject.toml").read_text())
    excluded = settings["tool"]["ruff"]["format"]["exclude"]
    assert sorted(excluded) == sorted(f"docs/{name}" for name in docgen.generated_pages())


# --- every page ---------------------------------------------------------------------


def _pages() -> list[Path]:
    """The pages of the site: every Markdown file of docs/ but the templates of the
    generated ones (mkdocs.yml excludes them; their output is checked instead)."""
    return sorted(p for p in DOCS.rglob("*.md") if not p.is_relative_to(docgen.TEMPLATES_DIR))


def test_yaml_configs_in_the_docs_are_valid():
    """Every ```yaml block (unless marked ``fragment``) is a config that structures
    against the schema; outside the plugin guide, whose chapters name their own
    components (and are run), its components and their options must be built-in ones."""
    registries = docgen.builtin_registries()
    checked = 0
    for page in _pages():
        for block in code_blocks(page.read_text(), str(page.relative_to(REPO))):
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


def test_every_fence_renders_as_code_on_both_hosts():
    """A fence whose info string is more than a language renders as a paragraph in
    MkDocs, and a marker with no fence right after it marks nothing: both are refused."""
    problems = []
    for page in _pages():
        try:
            code_blocks(page.read_text(), str(page.relative_to(REPO)))
        except DocSyntaxError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)


_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def _anchors(page: Path) -> set[str]:
    """Heading ids that both GitHub and MkDocs give the headings of ``page``."""
    from markdown.extensions.toc import slugify

    headings = re.findall(r"^#+ (.*?)[ #]*$", without_code(page.read_text()), re.M)
    return {docgen._anchor(h) for h in headings} & {slugify(h.replace("`", ""), "-") for h in headings}


def link_problems(page: Path, docs: Path = DOCS) -> list[str]:
    """Relative links of ``page`` that leave ``docs`` (MkDocs cannot serve the target),
    name no file, or name a heading the target does not have."""
    problems = []
    prose = re.sub(r"`[^`\n]*`", "", without_code(page.read_text()))
    for target, anchor in _LINK.findall(prose):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (page.parent / target).resolve() if target else page
        where = f"{page.relative_to(docs.parent)} links to {target}{'#' + anchor if anchor else ''}"
        if not resolved.is_relative_to(docs.resolve()):
            problems.append(f"{where}: outside {docs.name}/, which the site cannot serve")
        elif not resolved.is_file():
            problems.append(f"{where}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            problems.append(f"{where}: no such heading")
    return problems


def test_relative_links_stay_in_the_docs_and_resolve_with_their_anchors():
    problems = [problem for page in _pages() for problem in link_problems(page)]
    assert not problems, "\n".join(problems)


def test_link_check_notices_what_breaks_a_link(tmp_path):
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "guide" / "a.md").write_text(
        "# A page\n\n## Its limits, as rules\n\n```text\n# Not a heading\n```\n"
    )
    page = docs / "guide" / "b.md"
    page.write_text(
        "[fine](a.md#its-limits-as-rules) [also fine](#b) `[code](nowhere.md)`\n\n# B\n\n"
        "[outside](../../README.md) [missing](c.md) [no heading](a.md#not-a-heading) [web](https://x.org/y)\n"
    )
    (tmp_path / "README.md").write_text("# R\n")
    assert link_problems(page, docs) == [
        "docs/guide/b.md links to ../../README.md: outside docs/, which the site cannot serve",
        "docs/guide/b.md links to c.md: no such file",
        "docs/guide/b.md links to a.md#not-a-heading: no such heading",
    ]


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


def test_mkdocs_publishes_the_pages_and_not_the_templates():
    """What MkDocs itself takes for pages (``exclude_docs`` applied): the templates would
    otherwise be published, as a strict build only notes a page missing from the nav."""
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    published = {f.src_uri for f in get_files(load_config(str(REPO / "mkdocs.yml"))).documentation_pages()}
    assert published == {p.relative_to(DOCS).as_posix() for p in _pages()}


# --- the founding rule, as every page tells it ----------------------------------------

METADATA_RULE = "parallel.metadata-reaches-layers"


def _metadata_rule():
    (entry,) = [e for e in docgen.builtin_registries().rules if e.rule.id == METADATA_RULE]
    return entry.rule


def metadata_rule_verdicts(extra_plugins=()) -> dict[str, tuple[object, bool]]:
    """``{strategy: (spec, refused?)}``: the founding rule's own verdict on every
    registered strategy switched on (degree 2, or as a wrapper) beside the quickstart's
    document-isolating ``concat``. Only that rule's findings count."""
    from forge_core.judge import judge

    config = str(REPO / "configs/quickstart.yaml")
    verdicts = {}
    for name, entry in judge(config, extra_plugins=extra_plugins).registries["parallelism"].entries.items():
        on = f"parallel.{entry.spec.mesh_dim}=2" if entry.spec.mesh_dim else f"parallel.wrappers=[{name}]"
        judged = judge(config, [on], 2, extra_plugins)
        assert judged.plan.emitted, (
            "the quickstart's packer must emit metadata for this test to mean anything"
        )
        verdicts[name] = (entry.spec, any(v.rule_id == METADATA_RULE for v in judged.violations))
    return verdicts


def contradiction_finder(rule, verdicts: dict[str, tuple[object, bool]]) -> "re.Pattern":
    """Claims the rule's verdicts forbid: a clause naming a strategy the rule lets
    through together with the metadata (or packing) the rule is about and the rule's
    words for losing it or refusing it ("drops", "refused", not "reach"; "forward",
    "carry" and "pass" are the prose's words for reaching).

    The words come from the rule's summary (a new wording makes this fail, not pass
    silently); the strategies' names come from their specs: the name (`pp`), the
    degree (`parallel.pp`) and the summary's leading noun ("Pipeline parallelism")."""
    summary = rule.summary.lower()
    for word in ("drops", "refused", "must reach", "metadata", "packing"):
        assert word in summary, f"the summary of {rule.id} no longer says {word!r}: update this test"
    keys = re.search(r"\(([^)]*)\)", rule.summary).group(1).split(", ")  # "(doc_ids, positions)"
    objects = [
        *map(re.escape, keys),
        *(k.replace("_", " ") for k in keys),
        "document ids",
        "metadata",
        "pack\\w*",
    ]
    verbs = (
        r"\bdrop(?:s|ped|ping)?\b|\brefus(?:e|es|ed|ing)\b"
        r"|\b(?:not|cannot|never)\s+(?:\w+\s+)?(?:reach|forward|carry|pass)\w*"
    )
    names = []
    for name, (spec, refused) in verdicts.items():
        if refused:
            continue
        names.append(rf"`{re.escape(name)}`")
        if spec.mesh_dim:
            names.append(re.escape(f"parallel.{spec.mesh_dim}"))
        noun = re.match(r"(\w+) parallelism\b", spec.summary)
        if noun:
            names.append(rf"\b{noun.group(1)}\b")
    return re.compile(
        rf"(?=.*(?:{'|'.join(names)}))(?=.*(?:{'|'.join(objects)}))(?=.*(?:{verbs}))", re.I | re.S
    )


def _clauses(markdown: str) -> list[str]:
    """The prose of a page, one clause at a time (code blocks out, lines of a paragraph
    joined, a table row on its own; a clause ends at ``.``, ``;``, ``:`` or a blank line)."""
    prose = re.sub(r"\n(?![\n|])", " ", without_code(markdown)).replace("\n|", "\n\n|")
    return [c.strip() for c in re.split(r"[.;:!?](?:\s|$)|\n\s*\n", prose) if c.strip()]


def contradictions(finder, markdown: str) -> list[str]:
    return [clause for clause in _clauses(markdown) if finder.search(clause)]


@pytest.fixture(scope="module")
def founding_rule_finder():
    verdicts = metadata_rule_verdicts()
    # What the README and the reference say: the built-in pipeline passes.
    assert verdicts["pp"][1] is False, verdicts
    return contradiction_finder(_metadata_rule(), verdicts)


def test_no_page_contradicts_the_founding_rule(founding_rule_finder):
    """No page (nor the README) says a strategy drops the metadata, or is refused with
    packing, when the rule itself lets it through."""
    problems = [
        f"{page.relative_to(REPO)}: {clause[:200]!r}"
        for page in [*_pages(), REPO / "README.md"]
        for clause in contradictions(founding_rule_finder, page.read_text())
    ]
    assert not problems, f"these contradict rule {METADATA_RULE}:\n" + "\n".join(problems)


def test_the_contradiction_check_sees_the_old_claims(founding_rule_finder):
    old = (
        "- The spec's `emits` is a promise the rule engine acts on: a packer that emits\n"
        "  `doc_ids` is refused together with pipeline parallelism, which cannot carry them to\n"
        "  every layer.\n\n"
        "Two stages (`data.packer=none`: the built-in pipeline does not carry document ids to later\n"
        "stages, and `forge-run check` refuses the default `concat` packer with it).\n"
    )
    assert len(contradictions(founding_rule_finder, old)) == 2
    # The README's sentence says what holds, though it names both the pipeline and refusal.
    readme = (
        "Pipeline parallelism, the case that\nmotivated it, carries them: every stage gets its "
        "microbatch's `doc_ids` and `positions`; the rule\nstill refuses any strategy that declares "
        "it drops them.\n"
    )
    assert contradictions(founding_rule_finder, readme) == []


def test_the_contradiction_check_follows_the_rules_verdict():
    """A strategy that declares it drops the metadata is refused by the rule, and then
    saying so is no contradiction: the forbidden claims come from the verdicts."""
    from forge_core.api import ParallelismSpec, hookimpl

    class Dropper:
        @hookimpl
        def forge_parallelisms(self):
            return [
                ParallelismSpec(
                    name="relay",
                    summary="Relay parallelism: hands later layers hidden states only",
                    impl="nowhere:Relay",
                    order=150,
                    forwards=frozenset(),
                    drops_metadata_because="Later layers get hidden states only.",
                )
            ]

    verdicts = metadata_rule_verdicts((("dropper", Dropper()),))
    assert verdicts["relay"][1] is True and verdicts["pp"][1] is False
    finder = contradiction_finder(_metadata_rule(), verdicts)
    assert contradictions(finder, "Relay parallelism drops `doc_ids`, so packing is refused with it.\n") == []
    assert contradictions(finder, "Pipeline parallelism drops `doc_ids`, so packing is refused with it.\n")
