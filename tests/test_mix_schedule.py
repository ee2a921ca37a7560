"""Mixture schedules (``data.phases``): the closed form against a slot-by-slot simulation
of the stated rule (exact fractions), the anneal's realized share against its linear
target, exact and elastic resume at a phase boundary and in the middle of an anneal,
which schedule changes a resume accepts, the config's errors at their paths, the
summary's phase lines, and a run that stops and resumes across a phase boundary and
logs each phase's realized mixture."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from forge_core.api import ForgeError
from forge_core.data.loader import StatefulLoader
from forge_core.data.mix_schedule import MixtureSchedule, Phase
from forge_core.data.mixture import PERIOD, MixedRows, MixturePlan, shares
from forge_core.data.packed_rows import ArrayRows

LABELS = ["a", "b", "c"]
#: Sources' weights, then: a 3-step anneal from step 4 to weights without ``a``, a
#: switch at step 10 to ``a`` alone, a 5-step anneal from step 12 to all three equal
#: that lasts exactly its phase, and a last anneal that runs to the end.
PHASES = [
    Phase(0, (3.0, 1.0, 1.0)),
    Phase(4, (0.0, 1.0, 2.0), anneal=3),
    Phase(10, (1.0, 0.0, 0.0)),
    Phase(12, (1.0, 1.0, 1.0), anneal=5),
    Phase(17, (0.0, 5.0, 1.0), anneal=4),
]


def simulate(phases, step_slots, slots):
    """Slot by slot, with running counters: the rule the module docstring states (an
    anneal's step ``j`` gives a share ``(2j + 1) / 2A`` to the new weights' pattern, its
    slots where the rounded running sum of those shares grows)."""
    plans = [MixturePlan(list(p.weights), LABELS) for p in phases]
    given = [0] * len(LABELS)
    sources, indices = [], []
    segment, counters = None, None
    for n in range(slots):
        step = n // step_slots
        i = max(k for k, p in enumerate(phases) if p.start <= step)
        phase = phases[i]
        annealing = phase.anneal and step < phase.start + phase.anneal
        if segment != (i, annealing):
            segment, counters = (i, annealing), {"p": 0, "q": 0, "sum": Fraction(0), "round": 0}
        if annealing:
            j = step - phase.start
            counters["sum"] += Fraction(2 * j + 1, 2 * phase.anneal)
            rounded = math.floor(counters["sum"] + Fraction(1, 2))
            late = rounded > counters["round"]
            counters["round"] = rounded
            plan, key = (plans[i], "q") if late else (plans[i - 1], "p")
        else:
            plan, key = plans[i], "q"
        source = int(plan.pattern[counters[key] % PERIOD])
        counters[key] += 1
        sources.append(source)
        indices.append(given[source])
        given[source] += 1
    return np.asarray(sources), np.asarray(indices)


def test_the_closed_form_is_the_simulated_schedule_on_every_slot():
    step_slots, slots = 7, 7 * 26
    schedule = MixtureSchedule(PHASES, LABELS, step_slots)
    sources, indices = simulate(PHASES, step_slots, slots)
    got = schedule.slots(0, slots)
    assert np.array_equal(got[0], sources) and np.array_equal(got[1], indices)
    for first, count in [(3, 40), (27, 1), (69, 50), (118, 64)]:  # any window, as a rank reads it
        window = schedule.slots(first, count)
        assert np.array_equal(window[0], sources[first : first + count])
        assert np.array_equal(window[1], indices[first : first + count])
    for n in range(slots + 1):
        assert schedule.taken(n).tolist() == np.bincount(sources[:n], minlength=3).tolist(), n
    # A source left out of a phase is not read in it once its anneal is over.
    assert not np.isin(sources[7 * 7 : 7 * 10], [0]).any() and set(sources[70:84].tolist()) == {0}


def test_an_anneal_follows_its_linear_target_and_meets_it_halfway():
    b, a = 50, 20
    schedule = MixtureSchedule([Phase(0, (1.0, 0.0)), Phase(0, (0.0, 1.0), anneal=a)], ["p", "q"], b)
    sources, _ = schedule.slots(0, a * b)
    late = np.cumsum(sources.reshape(a, b).sum(axis=1))  # the new weights' slots, by step
    target = b * np.cumsum((2 * np.arange(a) + 1) / (2 * a))
    assert np.all(np.abs(late - target) <= 0.5) and late[-1] == a * b // 2
    assert np.all(np.diff(sources.reshape(a, b).sum(axis=1)) >= 0)  # more of the new each step
    assert (schedule.slots(a * b, b)[0] == 1).all()  # then the new weights alone


def test_a_positive_weight_too_small_to_count_names_its_phase():
    with pytest.raises(ForgeError, match=r"^data.phases\[0\].weights.b: weight 1e-09 is less than 1/65536"):
        MixtureSchedule(
            [
                Phase(0, (1.0, 1.0)),
                Phase(2, (1.0, 1e-9), where=("data.phases[0].weights.a", "data.phases[0].weights.b")),
            ],
            ["a", "b"],
            4,
        )


def test_weights_near_the_float_maximum_mix_as_their_ratios():
    """1e308 twice sums to infinity: the shares come from the ratios all the same (the
    weights scaled by a power of two, exactly, before the sum), and ordinary weights
    give bit for bit the shares they always gave."""
    big = MixtureSchedule.of([1e308, 1e308, 5e307], LABELS, [Phase(2, (0.0, 1e308, 1e308), anneal=2)], 4)
    small = MixtureSchedule.of([2.0, 2.0, 1.0], LABELS, [Phase(2, (0.0, 1.0, 1.0), anneal=2)], 4)
    for got, want in zip(big.slots(0, 4 * PERIOD), small.slots(0, 4 * PERIOD)):
        np.testing.assert_array_equal(got, want)
    assert big.describe() == small.describe()
    np.testing.assert_allclose(shares([1e308, 1e308, 5e307]), [0.4, 0.4, 0.2], rtol=4 * np.finfo(float).eps)
    w = np.array([0.1, 0.7, 0.2, 3e-5])
    assert np.array_equal(shares(w), w / w.sum())


def part(source, n):
    ids = np.stack([np.full(n, source), np.arange(n)], axis=1).astype(np.int64)
    return ArrayRows({"input_ids": ids, "labels": ids})


def phased(phases=PHASES[1:], sizes=(7, 40, 11)):
    schedule = MixtureSchedule.of([3, 1, 1], LABELS, list(phases), 6)
    return MixedRows([part(i, n) for i, n in enumerate(sizes)], LABELS, schedule)


def batches(loader, n):
    return [b["input_ids"].numpy() for b in itertools.islice(loader, n)]


@pytest.mark.parametrize("stop", [4, 10, 6, 14])  # at two phase boundaries, in two anneals
def test_resume_at_a_phase_boundary_or_mid_anneal_is_exact_and_elastic(stop):
    rows = phased()
    reference = batches(StatefulLoader(rows, 6, seed=5), 24)
    # The rows follow the schedule, each source through its own seeded epochs.
    sources = np.concatenate([r[:, 0] for r in reference])
    assert np.array_equal(sources, rows.schedule.slots(0, 6 * 24)[0])
    first = StatefulLoader(rows, 6, seed=5)
    got = batches(first, stop)
    state = json.loads(json.dumps(first.state_dict()))
    # Two data-parallel ranks of 3 rows resume what one rank of 6 saved.
    halves = []
    for rank in (0, 1):
        resumed = StatefulLoader(phased(), 3, dp_rank=rank, dp_size=2, seed=5)
        resumed.load_state_dict(state)
        halves.append(batches(resumed, 24 - stop))
    got += [np.concatenate(pair) for pair in zip(*halves)]
    assert len(got) == 24 and all(np.array_equal(x, y) for x, y in zip(got, reference))


def test_a_resume_accepts_new_later_phases_and_refuses_changes_to_steps_read():
    loader = StatefulLoader(phased(), 6, seed=5)
    batches(loader, 9)  # into the steady part of the phase from step 4
    state = loader.state_dict()
    for later in (
        [*PHASES[1:], Phase(26, (1.0, 1.0, 0.0))],  # a phase added after the others
        [PHASES[1], Phase(11, (1.0, 0.0, 0.0)), *PHASES[3:]],  # a later phase moved
        [PHASES[1], Phase(9, (1.0, 0.0, 0.0))],  # one starting at the very step read next
    ):
        reference = batches(StatefulLoader(phased(later), 6, seed=5), 10)[9]
        resumed = StatefulLoader(phased(later), 6, seed=5)
        resumed.load_state_dict(state)
        assert np.array_equal(batches(resumed, 1)[0], reference)
    for changed in (
        [Phase(4, (0.0, 1.0, 2.0), anneal=2), *PHASES[2:]],  # the anneal already read
        [Phase(4, (0.0, 1.0, 3.0), anneal=3), *PHASES[2:]],  # the weights being read
        [PHASES[1], Phase(8, (1.0, 0.0, 0.0))],  # a phase moved into the steps read
    ):
        with pytest.raises(ForgeError, match="has read 9 steps of a mixture whose weights over those steps"):
            StatefulLoader(phased(changed), 6, seed=5).load_state_dict(state)
    # A checkpoint written before phases existed (its one plan's slot counts) resumes.
    plain = StatefulLoader(phased(()), 6, seed=5)
    batches(plain, 2)
    old = plain.state_dict()
    old["mixture"]["slots_per_period"] = old["mixture"].pop("schedule")[0]["counts"]
    resumed = StatefulLoader(phased(()), 6, seed=5)
    resumed.load_state_dict(old)
    assert np.array_equal(batches(resumed, 1)[0], batches(plain, 1)[0])


# --- through the config and the trainer -------------------------------------------------


def _errors(result):
    assert result.code == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "bug in Forge" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def test_check_names_every_phase_problem_at_its_path(forge_config, forge_run):
    sources = "[{name: stdlib, label: web}, {name: stdlib, label: code, weight: 2}]"
    phases = (
        "[{start_step: 0, weights: {web: 1, code: 1}},"
        " {start_step: 0, weights: {webb: 1, code: -1}, anneal_steps: 3},"
        " {start_step: 4, weights: {web: 0, code: 0}, anneal_steps: 9},"
        " {start_step: 12, weights: {web: .nan, code: 1}}]"
    )
    config = forge_config({"train": {"steps": 10}})
    errors = _errors(forge_run(["check", config, f"data.sources={sources}", f"data.phases={phases}"]))
    assert errors == [
        "error: $.data.phases[1].weights.webb: unknown source label 'webb'. Did you mean 'web'? "
        "Available: code, web.",
        "error: $.data.phases[1].weights.code: must be at least 0, got -1 (0 leaves it out)",
        "error: $.data.phases[1].weights: no weight for web: give every source of the mixture a weight "
        "in each phase (0 leaves it out of the phase)",
        "error: $.data.phases[1].start_step: 0 is not after data.phases[0].start_step (0): list the "
        "phases in the order they start",
        "error: $.data.phases[2].weights: every weight is 0: give at least one source a weight above 0",
        "error: $.data.phases[2].anneal_steps: 9 is longer than the phase (8 steps, to "
        "data.phases[3].start_step 12): anneal over at most that many",
        "error: $.data.phases[3].weights.web: expected a finite number, got nan",
    ]
    one = _errors(forge_run(["check", config, "data.phases=[{weights: {stdlib: 1}}]"]))
    assert one == [
        "error: $.data.phases: phases change the weights of a mixture, and the config reads one "
        "source: give two or more data.sources, or remove data.phases"
    ]
    fine = "data.phases=[{start_step: 3, weights: {web: 0, code: 1}, anneal_steps: 7}]"
    assert forge_run(["check", config, f"data.sources={sources}", fine]).code == 0


@pytest.fixture
def two_corpora(tmp_path):
    from train_helpers import write_corpus

    return write_corpus(tmp_path / "a", docs=30, seed=1), write_corpus(
        tmp_path / "b", docs=30, seed=2, short=True
    )


#: Steps 1-2 at the sources' 3:1, steps 3-4 annealing to 1:3, 5-6 the second source alone.
CONFIG_PHASES = [
    {"start_step": 2, "weights": {"prose": 1, "text#1": 3}, "anneal_steps": 2},
    {"start_step": 4, "weights": {"prose": 0, "text#1": 1}},
]


def phased_config(tmp_path, name, a, b):
    from train_helpers import tiny_config

    cfg = tiny_config(tmp_path, name=name, train={"steps": 6, "batch_size": 4})
    data = cfg["data"]
    del data["source"], data["source_options"]
    data["sources"] = [
        {"name": "text", "weight": 3, "options": {"paths": [a]}, "label": "prose"},
        {"name": "text", "weight": 1, "options": {"paths": [b]}},
    ]
    data["phases"] = CONFIG_PHASES
    cfg["logging"] = {"loggers": ["jsonl"]}
    return cfg


def test_the_summary_has_a_line_per_phase(tmp_path, two_corpora):
    from train_helpers import write_config

    from forge_core.data.build import build_training_data
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved
    from forge_plugins.tokenizers.byte import ByteTokenizer

    cfg, registries = load_resolved(
        write_config(tmp_path / "m.yaml", phased_config(tmp_path, "m", *two_corpora))
    )
    data = build_training_data(
        make_plan(cfg, registries, 1), registries, ByteTokenizer(), report=lambda m: None
    )
    lines = data.summary.splitlines()
    # 24 rows: 6 + 2 at 3:1 (steps 1-2); the anneal's 8 slots, 4 by each weights' pattern
    # (3 + 1 by 3:1, 1 + 3 by 1:3); 8 of text#1 alone.
    assert lines[0].endswith(
        "mixture over the run's 24 rows: prose 41.7% (weight 75.0%), text#1 58.3% (weight 25.0%)"
    )
    assert lines[1:4] == [
        "  data.sources: steps 1-2: prose 75.0% (weight 75.0%), text#1 25.0% (weight 25.0%)",
        "  data.phases[0]: steps 3-4, weights annealed over its first 2 steps: prose 50.0% (weight 25.0%), "
        "text#1 50.0% (weight 75.0%)",
        "  data.phases[1]: steps 5-6: prose 0.0% (weight 0.0%), text#1 100.0% (weight 100.0%)",
    ]


def test_a_phased_run_resumes_exactly_across_a_phase_boundary_and_logs_each_phase(
    tmp_path, two_corpora, capsys, forge_run
):
    from train_helpers import SignalAt, read_metrics, write_config

    from forge_core.cli.train import train

    train(write_config(tmp_path / "s.yaml", phased_config(tmp_path, "straight", *two_corpora)), [])
    out = capsys.readouterr().out
    cut = write_config(tmp_path / "c.yaml", phased_config(tmp_path, "cut", *two_corpora))
    assert train(cut, [], extra_plugins=(("stop", SignalAt(3)),)) == "interrupted"  # mid-anneal
    # The rest through the command line: resumed mid-anneal, across the boundary at step 4.
    assert forge_run(["train", cut]).code == 0
    records = {r["step"]: r for r in read_metrics(tmp_path / "straight")}
    cut_records = {r["step"]: r for r in read_metrics(tmp_path / "cut")}
    assert sorted(cut_records) == sorted(records) == [1, 2, 3, 4, 5, 6]
    for step in records:
        assert _trained(cut_records[step]) == _trained(records[step]), step
    # Each phase's share is its own steps' tokens, counted exactly.
    labels = ("prose", "text#1")
    phase_of = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2}
    for step, r in records.items():
        mine = [s for s in records if phase_of[s] == phase_of[step] and s <= step]
        tokens = {s: sum(records[t][f"data/{s}/tokens"] for t in mine) for s in labels}
        assert {s: r[f"data/{s}/phase_share"] for s in labels} == {
            s: n / sum(tokens.values()) for s, n in tokens.items()
        }
    assert records[6]["data/prose/phase_share"] == 0 and records[2]["data/prose/phase_share"] > 0.5
    ended = [line for line in out.splitlines() if " ended at step " in line]
    assert [line.split(":")[2] for line in ended] == [
        " data.sources ended at step 2",
        " data.phases[0] ended at step 4",
        " data.phases[1] ended at step 6",
    ]
    tokens = [sum(records[t][f"data/{s}/tokens"] for t in (5, 6)) for s in labels]
    assert ended[2] == (
        f"forge: data: data.phases[1] ended at step 6: {sum(tokens):,} labelled tokens since step 5: "
        "prose 0.0% (weight 0.0%), text#1 100.0% (weight 100.0%)"
    )


def _trained(record):
    """What a metrics record says about the training itself (not its timings)."""
    return {
        k: v for k, v in record.items() if k in ("loss", "grad_norm", "tokens", "lr") or k.startswith("data/")
    }
