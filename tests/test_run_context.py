"""RunContext.should_log: the logging.every cadence every logger shares."""

import attrs
import pytest

from forge_core.api import RunContext
from forge_core.config.schema import EvalSection, ForgeConfig, LoggingSection


def test_should_log_every_n_steps_and_the_last():
    config = attrs.evolve(ForgeConfig(), logging=LoggingSection(every=3))
    run = RunContext(config=config, out_dir="x", start_step=0, total_steps=10)
    assert [s for s in range(1, 11) if run.should_log(s)] == [3, 6, 9, 10]
    config = attrs.evolve(ForgeConfig(), logging=LoggingSection(every=1))
    assert RunContext(config=config, out_dir="x", start_step=0, total_steps=4).should_log(1)
    # 0 has no meaning as a cadence: the schema refuses it.
    with pytest.raises(ValueError, match="must be at least 1, got 0"):
        LoggingSection(every=0)


def test_every_step_that_evaluates_is_logged_whatever_logging_every_says():
    """The loop evaluates on EvalSection.due and should_log asks the same question, so
    no evaluation's metrics go unlogged."""
    ev = EvalSection(enabled=True, every=4, at_end=False)
    config = attrs.evolve(ForgeConfig(), logging=LoggingSection(every=3), eval=ev)
    run = RunContext(config=config, out_dir="x", start_step=0, total_steps=10)
    assert [s for s in range(1, 11) if ev.due(s, 10)] == [4, 8]
    assert [s for s in range(1, 11) if run.should_log(s)] == [3, 4, 6, 8, 9, 10]
    off = attrs.evolve(config, eval=attrs.evolve(ev, enabled=False))
    assert [
        s
        for s in range(1, 11)
        if RunContext(config=off, out_dir="x", start_step=0, total_steps=10).should_log(s)
    ] == [3, 6, 9, 10]
