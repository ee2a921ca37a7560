"""The documentation site: ``mkdocs build --strict`` with the repository's ``mkdocs.yml``,
and the built plugin-guide pages opened in headless Chromium.

In the browser every fenced block of a chapter must be a code block (``<pre><code>``
holding exactly the block's text), and no fence or marker text may be visible as prose:
a fence that Python-Markdown does not recognise renders as a paragraph, and the prose
after it as code, which a Markdown-level check cannot see. ``coming-from.md``, whose
tables are its content, is read the same way, and every Markdown table of these pages
must be a table on the page; every block marked ``file=PATH`` shows ``PATH`` as its title.
Every page of the site is measured at 1280 px (and the widest tables' page at 1600 px):
no table or code block is wider than the column it is in, and the top navigation is one
row. Screenshots of two pages are kept under ``$CI_ARTIFACTS/screenshots/`` (default
``.ci/artifacts/screenshots/``).

Without Chromium the browser tests skip, except under CI (``CI`` set), where they fail:
``.ci/run`` installs it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from browser import INSTALL_HINT, Browser, find_chromium
from doc_chapters import code_blocks

REPO = Path(__file__).resolve().parent.parent
SCREENSHOT_PAGES = ("plugin-guide/attention-backend.md", "plugin-guide/packaging.md")

# Text that is visible outside code only when a fence or its marker failed to render.
_FENCE_TEXT = re.compile(
    r"```|~~~|<!--|\brunnable (?:file|exit)=|\b(?:python|console|toml|yaml|text|bash) runnable\b"
)

# Every code block's text (``pre > code``), then the page's visible text outside them.
_RENDERED = """(() => {
  const main = document.querySelector('[role="main"]') || document.body;
  const pres = [...main.querySelectorAll('pre')];
  const codes = pres.map(pre => pre.querySelector(':scope > code')).filter(Boolean).map(c => c.textContent);
  pres.forEach(pre => pre.remove());
  return {codes: codes, prose: main.innerText};
})()"""


def artifacts_dir() -> Path:
    """Where CI keeps what a run leaves for people to look at."""
    return Path(os.environ.get("CI_ARTIFACTS") or REPO / ".ci" / "artifacts")


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        capture_output=True,
        text=True,
        cwd=config.parent,
        timeout=300,
    )


def repo_config() -> dict:
    """The repository's mkdocs.yml, for a site built elsewhere: its hooks by absolute path."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["hooks"] = [str(REPO / hook) for hook in config.get("hooks", [])]
    return config


def built_page(site: Path, page: str) -> Path:
    """The HTML MkDocs writes for ``page`` (``a/b.md`` -> ``a/b/index.html``)."""
    stem = page.removesuffix(".md")
    return site / ("index.html" if stem == "index" else f"{stem.removesuffix('/index')}/index.html")


def rendering_problems(
    browser: Browser, html: Path, markdown: str, where: str, screenshot: Path | None = None
) -> list[str]:
    """How the page the browser shows differs from the Markdown's code blocks; the page
    as shown goes to ``screenshot`` first, if given (looking takes the code blocks out)."""
    browser.open(html.as_uri())
    if screenshot is not None:
        browser.screenshot(screenshot)
    rendered = browser.evaluate(_RENDERED)
    codes = [text.rstrip("\n") for text in rendered["codes"]]
    problems = []
    blocks = code_blocks(markdown, where)
    for block in blocks:
        if block.text.rstrip("\n") not in codes:
            kind = "runnable " if block.runnable else ""
            problems.append(
                f"{where}:{block.line}: the {kind}```{block.lang} block is not shown as a code block"
            )
    if len(codes) != len(blocks):
        problems.append(
            f"{where}: {len(blocks)} fenced blocks in the Markdown, {len(codes)} code blocks on the page"
        )
    for line in rendered["prose"].splitlines():
        if _FENCE_TEXT.search(line):
            problems.append(f"{where}: fence text shown as prose: {line.strip()[:120]!r}")
    return problems


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        message = f"chromium is not installed ({INSTALL_HINT}; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must run the browser check")
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    done = build_site(REPO / "mkdocs.yml", site)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return site


def test_the_site_builds_strictly(site):
    assert built_page(site, "plugin-guide/attention-backend.md").is_file()


def test_a_strict_build_fails_on_a_link_outside_the_docs(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the example](../examples/README.md).\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "README.md").write_text("# Example\n")
    config = repo_config()
    config["nav"] = ["index.md"]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "../examples/README.md" in done.stdout + done.stderr


#: Pages outside the plugin guide that the browser check also reads: their tables carry
#: what the page is for.
TABLE_PAGES = ("coming-from.md",)
_TABLES = "(document.querySelector('[role=\"main\"]') || document.body).querySelectorAll('table').length"


def test_plugin_guide_pages_show_every_block_as_code(site, chromium):
    pages = sorted(
        p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs" / "plugin-guide").glob("*.md")
    )
    problems, runnable = [], 0
    shots = artifacts_dir() / "screenshots"
    with Browser(chromium) as browser:
        for page in [*pages, *TABLE_PAGES]:
            markdown = (REPO / "docs" / page).read_text()
            runnable += sum(block.runnable for block in code_blocks(markdown, page))
            shot = (
                shots / f"{page.removesuffix('.md').replace('/', '-')}.png"
                if page in SCREENSHOT_PAGES
                else None
            )
            problems += rendering_problems(browser, built_page(site, page), markdown, f"docs/{page}", shot)
            tables = len(re.findall(r"^\|[ :]*-{3,}", markdown, re.M))
            shown = browser.evaluate(_TABLES)
            if shown != tables:
                problems.append(f"docs/{page}: {tables} tables in the Markdown, {shown} on the page")
    assert not problems, "\n".join(problems)
    assert runnable >= 150, f"only {runnable} runnable blocks on the plugin-guide pages"
    for page in SCREENSHOT_PAGES:
        shot = shots / f"{page.removesuffix('.md').replace('/', '-')}.png"
        assert shot.stat().st_size > 10_000, f"{shot} is too small to show the page"
        # A whole page with its code: far taller than the window.
        assert int.from_bytes(shot.read_bytes()[20:24], "big") > 2 * 900, (
            f"{shot} shows less than the whole page"
        )


def test_the_browser_check_sees_a_fence_that_renders_as_prose(tmp_path, chromium):
    """The old fence syntax is the negative control: MkDocs renders it as a paragraph."""
    page = (
        '# Broken\n\nIntro.\n\n```python runnable file=pkg/__init__.py\n"""pkg."""\n```\n\n'
        "Prose after it.\n\n```console\n$ ls\n```\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page)
    config = repo_config()
    config["nav"] = ["index.md"]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    # Read as the page's Markdown would be with a plain fence: what the reader expects.
    expected = page.replace(
        "```python runnable file=pkg/__init__.py", "<!-- runnable file=pkg/__init__.py -->\n```python"
    )
    with Browser(chromium) as browser:
        problems = rendering_problems(
            browser, built_page(tmp_path / "site", "index.md"), expected, "index.md"
        )
    assert "index.md:6: the runnable ```python block is not shown as a code block" in problems, problems
    assert "index.md:12: the ```console block is not shown as a code block" in problems, problems
    # The fence line became a paragraph (``__init__`` turned into a bold "init").
    assert any(
        p.startswith("index.md: fence text shown as prose: '```python runnable file=pkg/") for p in problems
    )


def test_screenshots_go_where_ci_keeps_artifacts(monkeypatch, tmp_path):
    monkeypatch.setenv("CI_ARTIFACTS", str(tmp_path))
    assert artifacts_dir() == tmp_path
    monkeypatch.delenv("CI_ARTIFACTS")
    assert artifacts_dir() == REPO / ".ci" / "artifacts"
    assert ".ci/artifacts/" in (REPO / ".gitignore").read_text().splitlines()


# --- layout: what fits at a laptop's width -------------------------------------------

#: Every table and code block (``pre``) of the page's main column wider than its own box
#: (its content scrolls or is cut off) or reaching past the column; and the rows the
#: top navigation takes (its visible items, one ``offsetTop`` per row).
_LAYOUT = """(() => {
  const main = document.querySelector('[role="main"]');
  const right = main.getBoundingClientRect().right;
  const wide = [...main.querySelectorAll('table, pre')]
    .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > right + 1)
    .map(e => `${e.tagName.toLowerCase()} ${e.scrollWidth} px wide in ${e.clientWidth} px: `
              + e.textContent.trim().replace(/\\s+/g, ' ').slice(0, 60));
  const items = [...document.querySelectorAll('.navbar-nav > li')].filter(li => li.offsetParent);
  return {wide: wide, nav: items.length, rows: new Set(items.map(li => li.offsetTop)).size};
})()"""

#: The page whose tables are widest, measured at a wider screen too.
WIDE_PAGES = {1600: ("coming-from.md",)}


def layout_problems(browser: Browser, html: Path, where: str, width: int) -> list[str]:
    browser.open(html.as_uri())
    shown = browser.evaluate(_LAYOUT)
    problems = [f"{where} at {width} px: {wide}" for wide in shown["wide"]]
    if shown["rows"] != 1:
        problems.append(
            f"{where} at {width} px: the navigation's {shown['nav']} items take {shown['rows']} rows"
        )
    return problems


def _site_pages() -> list[str]:
    """Every page MkDocs publishes, as it finds them."""
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    return sorted(f.src_uri for f in get_files(load_config(str(REPO / "mkdocs.yml"))).documentation_pages())


def test_every_page_fits_its_column_and_the_navigation_one_row(site, chromium):
    problems = []
    with Browser(chromium, width=1280) as browser:
        for page in _site_pages():
            problems += layout_problems(browser, built_page(site, page), f"docs/{page}", 1280)
    for width, pages in WIDE_PAGES.items():
        with Browser(chromium, width=width) as browser:
            for page in pages:
                problems += layout_problems(browser, built_page(site, page), f"docs/{page}", width)
    assert not problems, "\n".join(problems)


def test_the_layout_check_sees_a_wide_table_a_wide_block_and_a_crowded_navigation(tmp_path, chromium):
    """The negative control: without the stylesheet a table of long keys and a long
    command overflow, and thirteen top entries wrap."""
    words = f"`{'per_device_train_batch_size.' * 12}`"  # one word: no space to wrap at
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(
        f"# Wide\n\n| key | note |\n| --- | --- |\n| {words} | x |\n\n"
        f"```console\n$ forge-run {'x' * 300}\n```\n"
    )
    config = repo_config()
    del config["extra_css"]
    config["nav"] = [{f"Entry number {i}": "index.md"} for i in range(13)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    with Browser(chromium, width=1280) as browser:
        problems = layout_problems(browser, built_page(tmp_path / "site", "index.md"), "index.md", 1280)
    assert any(p.startswith("index.md at 1280 px: table ") for p in problems), problems
    assert any(p.startswith("index.md at 1280 px: pre ") for p in problems), problems
    assert any("the navigation's" in p and "1 rows" not in p for p in problems), problems


# --- the file a plugin-guide block belongs to ----------------------------------------


def _file_titles_hook():
    """mkdocs_hooks/file_titles.py, loaded by path as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location("file_titles", REPO / "mkdocs_hooks" / "file_titles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hook_titles_exactly_the_file_blocks():
    titled = _file_titles_hook().titled(
        "<!-- runnable file=pkg/a_b.py -->\n```python\nx = 1\n```\n\n"
        "<!-- runnable exit=2 -->\n```console\n$ ls\n```\n\n"
        "Text.\n<!-- runnable file=stray.py -->\nMore text.\n\n"
        "```markdown\n<!-- runnable file=shown.py -->\n```\n"
    )
    assert titled.count('class="code-title"') == 1
    assert '<p class="code-title"><code>pkg/a_b.py</code></p>\n\n```python\nx = 1' in titled
    assert "<!-- runnable exit=2 -->\n```console" in titled


#: For every code block, the title shown right above it (or null).
_TITLES = """(() => {
  const main = document.querySelector('[role="main"]');
  return [...main.querySelectorAll('pre > code')].map(code => {
    const pre = code.parentElement;
    const box = pre.parentElement.classList.contains('codehilite') ? pre.parentElement : pre;
    const title = box.previousElementSibling;
    return [title && title.matches('p.code-title') ? title.textContent : null, code.textContent];
  });
})()"""


def test_plugin_guide_blocks_show_the_file_they_belong_to(site, chromium):
    problems, titled = [], 0
    with Browser(chromium) as browser:
        for path in sorted((REPO / "docs" / "plugin-guide").glob("*.md")):
            page = path.relative_to(REPO / "docs").as_posix()
            browser.open(built_page(site, page).as_uri())
            shown = {code.rstrip("\n"): title for title, code in browser.evaluate(_TITLES)}
            for block in code_blocks(path.read_text(), page):
                expected = block.options.get("file") if block.runnable else None
                got = shown.get(block.text.rstrip("\n"), "(block not found)")
                if got != expected:
                    problems.append(f"docs/{page}:{block.line}: titled {got!r}, expected {expected!r}")
                titled += expected is not None
    assert not problems, "\n".join(problems)
    assert titled >= 80, f"only {titled} blocks with a file title"
