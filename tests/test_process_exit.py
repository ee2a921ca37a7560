"""The processes ``forge-run`` starts (the console script, ``python -m forge_core.cli``,
each torchrun worker)
end through :func:`forge_core.cli.exiting.exit_process`: with their exit status, their
output flushed and their atexit handlers run, and with the garbage collector's objects
frozen, so the interpreter's shutdown does not walk everything torch created."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Registered before the module runs, so it is the last atexit handler: it sees the
# state the interpreter shuts down in.
PROBE = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("frozen objects:", gc.get_freeze_count(), flush=True))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("module", "args", "code", "says"),
    [
        ("forge_core.cli", ["plugins"], 0, "llama"),
        ("forge_core.cli", ["missing.yaml"], 2, "config file 'missing.yaml' does not exist"),
        ("forge_core.cli.worker", [], 2, "usage: python -m forge_core.cli.worker"),
    ],
)
def test_a_process_ends_with_its_status_and_its_objects_frozen(module, args, code, says):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stderr[-3000:]
    assert says in done.stdout + done.stderr
    frozen = [line for line in done.stdout.splitlines() if line.startswith("frozen objects:")]
    assert frozen and int(frozen[-1].split(":")[1]) > 0, done.stdout[-3000:]


def test_the_console_script_ends_through_exit_process():
    # What pip writes into bin/forge-run: import the entry point, sys.exit(it()).
    from importlib.metadata import entry_points

    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "forge-run"]
    assert script.value == "forge_core.cli.exiting:console"
    probe = PROBE.replace(
        'runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)',
        "from forge_core.cli.exiting import console\nsys.exit(console())",
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "forge-run", "plugins"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    frozen = [line for line in done.stdout.splitlines() if line.startswith("frozen objects:")]
    assert frozen and int(frozen[-1].split(":")[1]) > 0, done.stdout[-3000:]
