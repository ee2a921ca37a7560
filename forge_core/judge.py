"""Judge a config completely before anything is built: resolve it
(:mod:`forge_core.resolve`), make its plan (:mod:`forge_core.plan`), evaluate every rule
over the plan (:mod:`forge_core.rules`) and check every chosen implementation
(:mod:`forge_core.component_checks`). Shared by ``forge-run check`` and ``forge-run
train``, so a config ``check`` accepts is the config a run builds: the
:class:`~forge_core.api.Plan` judged here is what the trainer and ``parallelize`` build
from."""

from __future__ import annotations

from typing import Any

import attrs

from forge_core.api import Plan
from forge_core.api.unstable import Violation
from forge_core.component_checks import component_violations
from forge_core.config.schema import ForgeConfig
from forge_core.parallel_dims import world_size_from_env
from forge_core.plan import make_plan
from forge_core.registry import Registries
from forge_core.resolve import load_resolved
from forge_core.rules import evaluate


@attrs.frozen
class Judgement:
    config: ForgeConfig
    registries: Registries
    plan: Plan
    violations: list[Violation]

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "warning"]

    @property
    def kernel_rules(self) -> int:
        """How many of the evaluated rules are the kernel's (they cannot be blocked)."""
        return sum(entry.kernel for entry in self.registries.rules)


def judge(
    config_path: str,
    overrides: list[str] = (),
    world_size: int | None = None,
    extra_plugins: tuple[tuple[str, Any], ...] = (),
) -> Judgement:
    """Load and judge a config. Raises ConfigError (every config problem) or ForgeError
    (plugin problems); rule violations are returned, not raised."""
    return judge_config(*load_resolved(config_path, overrides, extra_plugins), world_size)


def judge_config(config: ForgeConfig, registries: Registries, world_size: int | None = None) -> Judgement:
    """Evaluate every rule over a resolved config, and look up every chosen component's
    implementation module. The world size: ``world_size``, else torchrun's, else the one
    the config states (``run.world_size``), else unknown."""
    if world_size is None:
        world_size = world_size_from_env()
    if world_size is None:  # what the config states it is made for, else unknown
        world_size = config.run.world_size
    plan = make_plan(config, registries, world_size)
    violations = evaluate(registries.rules, plan) + component_violations(plan, registries)
    return Judgement(config, registries, plan, violations)
