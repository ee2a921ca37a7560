"""The runnable documentation: how a plugin-guide chapter marks its code blocks, and the
runner that plays a chapter as a reader would, in a temporary project directory.

The grammar (one HTML comment on the line right before a plain fence; a code host and
MkDocs both hide the comment and render the fence as code):

- ``<!-- runnable file=PATH -->`` before any fence: the block's text is written to
  ``PATH`` in the project directory (Python modules, ``pyproject.toml``, YAML configs).
- ``<!-- runnable -->`` before a ```` ```python ```` fence: run as a script in the
  project directory; it must not raise (its asserts are the check).
- ``<!-- runnable [exit=N] -->`` before a ```` ```console ```` fence: each ``$ command``
  runs in the project directory and must exit ``N`` (default 0); every non-empty line
  shown after a command, except lines starting with ``...`` (elided or illustrative
  output), must occur in that command's output (spaces collapsed).
  ``$ pip install -e .`` is emulated: the ``pyproject.toml`` written earlier is read and
  a ``.dist-info`` with its ``forge`` entry points is put on the path, which is what
  importlib.metadata discovery sees after a real install.
- ``<!-- fragment -->`` before a ```` ```yaml ```` fence: a part of a config, not checked
  as a whole one.
- ``<!-- runnable-setup: a.md b.md -->`` anywhere in a chapter first writes the files of
  those chapters and installs their packages.

A fence whose info string has more than a language, or a marker with no fence right after
it, is a :class:`DocSyntaxError`: the first renders as prose on the site, the second
would silently never run.

A page outside the plugin guide can be played too (``docs/getting-started.md``): a
:class:`Setting` links the repository's folders it names (``configs/``) into the
project directory and appends reduced-size overrides to every training command
(``forge-run [--nproc N] CONFIG.yaml ...``), so the commands a reader pastes are the
ones run, on a smaller model.

All chapters are played in one runner process (this file run as a script), so torch is
imported once: ``forge-run`` commands call ``forge_core.cli.main`` (what the console
script runs), ``python -m pytest`` calls ``pytest.main``, Python blocks are executed,
all with file descriptors 1 and 2 captured; any other command runs with bash. Between
chapters the runner forgets the chapter's modules and removes it from ``sys.path``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "plugin-guide"
BIN = Path(sys.executable).parent

# --- parsing Markdown ---------------------------------------------------------------

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
# The line right before a fence that marks it: ``<!-- runnable [flag ...] [key=value ...] -->``
# (or ``<!-- fragment -->``). A code host and MkDocs both hide the comment and render the
# plain fence below it as code; words after the language in the fence itself would make
# Python-Markdown render the block as a paragraph.
_MARK = re.compile(r"^<!--[ \t]*((?:runnable|fragment)(?![-\w])[^\n]*?)[ \t]*-->[ \t]*$", re.M)


class DocSyntaxError(ValueError):
    """A code block or marker that would not render as code, or would silently not run."""


@attrs.frozen
class Setting:
    """How a page is played: the repository paths linked into its project directory,
    and the overrides appended to its training commands."""

    links: tuple[str, ...] = ()
    train_overrides: tuple[str, ...] = ()


@attrs.frozen
class Block:
    lang: str
    runnable: bool
    flags: frozenset[str]
    options: dict[str, str]
    text: str
    line: int


def code_blocks(markdown: str, where: str = "<markdown>") -> list[Block]:
    """Every fenced block of ``markdown``, with the words of the marker line before it.

    Raises :class:`DocSyntaxError` for a fence whose info string is more than a language
    (``python runnable file=x``: not code on the site) and for a marker that is not on
    the line right before a fence (its block would never run)."""
    blocks, marks = [], set()
    for m in _FENCE.finditer(markdown):
        line = markdown.count("\n", 0, m.start()) + 1
        words = m.group(1).split()
        if len(words) > 1:
            marker = " ".join(words[1:])
            raise DocSyntaxError(
                f"{where}:{line}: the fence ```{m.group(1).strip()} is not rendered as code by MkDocs "
                f"(an info string is one language word); write `<!-- {marker} -->` on the line before "
                f"a plain ```{words[0]} fence"
            )
        before = markdown[: m.start()]
        previous = before[:-1].rpartition("\n")[2] if before.endswith("\n") else ""
        mark = _MARK.fullmatch(previous)
        marked = mark.group(1).split() if mark else []
        if mark:
            marks.add(line - 1)
        options = dict(w.split("=", 1) for w in marked if "=" in w)
        flags = frozenset(w for w in marked if "=" not in w)
        blocks.append(Block(words[0] if words else "", "runnable" in flags, flags, options, m.group(2), line))
    outside = without_code(markdown)
    for m in _MARK.finditer(outside):
        line = outside.count("\n", 0, m.start()) + 1
        if line not in marks:
            raise DocSyntaxError(
                f"{where}:{line}: `<!-- {m.group(1)} -->` is not on the line right before a ``` fence, "
                "so it marks nothing; put the fence on the next line"
            )
    return blocks


def without_code(markdown: str) -> str:
    """``markdown`` with every fenced block blanked out, line numbers kept."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)


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


def squash(text: str) -> str:
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


def play_chapters(
    chapters: dict[str, str], root: Path, settings: dict[str, Setting] | None = None
) -> dict[str, str | None]:
    """Play chapters (``{where: markdown}``) in one fresh Python process, each in its own
    project directory under ``root`` (with its :class:`Setting` from ``settings``, if
    any); ``{where: failure message or None}``. One process imports torch once for every
    chapter, and nothing a chapter does leaks into the test process."""
    settings = {where: attrs.asdict(setting) for where, setting in (settings or {}).items()}
    (root / ".chapters.json").write_text(json.dumps({"chapters": chapters, "settings": settings}))
    done = subprocess.run(
        [sys.executable, __file__, "--play", str(root / ".chapters.json")],
        cwd=root,
        env=chapter_env(root),
        capture_output=True,
        text=True,
        timeout=1800,
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
    played = json.loads(spec.read_text())
    results: dict[str, str | None] = {}
    for n, (where, markdown) in enumerate(played["chapters"].items()):
        project = spec.parent / f"chapter{n}"
        project.mkdir()
        setting = played["settings"].get(where, {})
        try:
            play_here(markdown, project, where, Setting(**{k: tuple(v) for k, v in setting.items()}))
            results[where] = None
        except (AssertionError, DocSyntaxError) as exc:
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


def forge_run_argv(command: str) -> tuple[dict[str, str], list[str]] | None:
    """``(env, argv)`` for a plain ``[VAR=value ...] forge-run ...`` command, else None."""
    if any(c in command for c in "|&;<>`$()"):
        return None
    words = shlex.split(command, comments=True)  # a trailing `# what it does` is no argument
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return (env, words[1:]) if words and words[0] == "forge-run" else None


def trains(argv: list[str]) -> bool:
    """Whether a ``forge-run`` argv trains: ``[--nproc N] CONFIG.yaml ...``."""
    words = argv[2:] if argv[:1] == ["--nproc"] else argv
    return bool(words) and words[0].endswith((".yaml", ".yml"))


def play_here(markdown: str, project: Path, where: str, setting: Setting = Setting()) -> None:
    """Execute every runnable block of ``markdown`` in ``project``, in order. Python
    blocks and ``forge-run`` commands run in this process (``forge-run`` is
    ``forge_core.cli:main``); other commands run with bash."""
    from forge_core import cli

    for name in setting.links:
        (project / name).symlink_to(REPO / name)
    os.chdir(project)
    sys.path.insert(0, str(project))
    os.environ["PYTHONPATH"] = str(project)  # for the commands run with bash
    for name in setup_chapters(markdown):
        # The packages of earlier chapters, as their reader would have them installed.
        for block in code_blocks((GUIDE / name).read_text(), f"docs/plugin-guide/{name}"):
            if block.runnable and "file" in block.options:
                (project / block.options["file"]).parent.mkdir(parents=True, exist_ok=True)
                (project / block.options["file"]).write_text(block.text)
        emulate_pip_install(project)
    for block in code_blocks(markdown, where):
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
                forge = forge_run_argv(command)
                if re.fullmatch(r"pip install (-e )?\.", command):
                    rc, output = 0, emulate_pip_install(project)
                elif forge is not None:
                    argv = [*forge[1], *setting.train_overrides] if trains(forge[1]) else forge[1]
                    rc, output = _in_process(lambda: cli.main(argv), forge[0])
                elif command.startswith("python -m pytest "):
                    # In process too (this process already imported torch).
                    args = shlex.split(command)[3:]
                    rc, output = _in_process(lambda: int(pytest.main(args)))
                else:
                    done = subprocess.run(
                        ["bash", "-c", command], cwd=project, capture_output=True, text=True, timeout=600
                    )
                    rc, output = done.returncode, done.stdout + done.stderr
                assert rc == expected_rc, f"{at}: `{command}` exited {rc}, expected {expected_rc}:\n{output}"
                for line in shown:
                    if line.strip() and not line.strip().startswith("..."):
                        assert squash(line) in squash(output), (
                            f"{at}: `{command}` did not print {line.strip()!r}; it printed:\n{output}"
                        )
        else:
            raise AssertionError(f"{at}: a runnable {block.lang!r} block needs file=PATH")


if __name__ == "__main__" and sys.argv[1:2] == ["--play"]:
    from forge_core.cli.exiting import exit_process

    _play_all_here(Path(sys.argv[2]))
    exit_process(0)
