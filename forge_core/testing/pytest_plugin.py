"""pytest plugin of the conformance kit, registered as ``forge`` in the ``pytest11``
entry-point group, so any test suite in an environment with Forge installed gets:

- ``forge_conformance``: the kit (:mod:`forge_core.testing`):
  ``forge_conformance.check_attention_backend(...)``, ``.check_packer(...)``,
  ``.check_rule(...)``;
- ``forge_devices``: the devices to run attention checks on, from ``--forge-devices``
  (``cpu`` by default; ``auto`` adds CUDA when a GPU is visible);
- ``forge_registries``: the registries of every installed plugin (session-scoped);
- ``forge_config``: writes a config mapping to a YAML file under ``tmp_path`` and
  returns its path;
- ``forge_run``: ``forge_run(argv, env=..., paths=..., cwd=...)`` runs a ``forge-run``
  command in the test's process and returns its exit status and output
  (:func:`forge_core.testing.forge_run`).

Importing this module imports neither Forge's registries nor torch: pytest loads it in
every session of the environment, so it must stay cheap.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("forge", "Forge conformance kit")
    group.addoption(
        "--forge-devices",
        default="cpu",
        help="comma-separated devices for forge_devices (e.g. cpu,cuda); 'auto' means every available one",
    )


@pytest.fixture
def forge_conformance() -> Any:
    """The conformance kit, :mod:`forge_core.testing`."""
    import forge_core.testing

    return forge_core.testing


@pytest.fixture(scope="session")
def forge_devices(pytestconfig: Any) -> tuple[str, ...]:
    """Devices named by ``--forge-devices`` (``auto``: every available device)."""
    value = pytestconfig.getoption("forge_devices")
    if value.strip() == "auto":
        from forge_core.testing import available_devices

        return available_devices()
    return tuple(name.strip() for name in value.split(",") if name.strip())


@pytest.fixture(scope="session")
def forge_registries() -> Any:
    """Registries built from every installed plugin (built-ins and entry points)."""
    from forge_core.registry import load_registries

    return load_registries()


@pytest.fixture
def forge_config(tmp_path: Any) -> Any:
    """``forge_config(mapping) -> path``: write a (partial) config to a YAML file."""
    import itertools

    import yaml

    counter = itertools.count()

    def write(data: dict) -> str:
        path = tmp_path / f"forge-config-{next(counter)}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return str(path)

    return write


@pytest.fixture
def forge_run() -> Any:
    """``forge_run(argv, env=None, paths=(), cwd=None) -> CliResult(code, stdout, stderr)``:
    ``forge-run *argv`` in this process (:func:`forge_core.testing.forge_run`)."""
    from forge_core.testing.cli_runner import forge_run

    return forge_run
