"""Weighted mixing: the plan's realized proportions stay within the stated bound over
every prefix; the loader's batches follow it (counted from the rows themselves),
deterministically for a seed, disjointly across data-parallel ranks, and resume exactly
mid-run with and without workers; the config form and its errors; the summary line
reports the realized mixture; check finds every entry's implementation; a mixture trains
and resumes through the trainer."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from forge_core.api import ForgeError, SourceSpec, hookimpl
from forge_core.data.loader import StatefulLoader
from forge_core.data.mix_schedule import MixtureSchedule
from forge_core.data.mixture import PERIOD, MixedRows, MixturePlan
from forge_core.data.packed_rows import ArrayRows

SEQ = 2


def part(source, n):
    """Rows whose first column is the source and second the row index: batches tell
    where every row came from."""
    ids = np.stack([np.full(n, source), np.arange(n)], axis=1).astype(np.int64)
    return ArrayRows({"input_ids": ids, "labels": ids})


def mixed(sizes=(7, 50, 13), weights=(0.5, 0.3, 0.2)):
    labels = [f"s{i}" for i in range(len(sizes))]
    return MixedRows([part(i, n) for i, n in enumerate(sizes)], labels, MixtureSchedule.of(weights, labels))


def sources_of(loader, n):
    return np.concatenate([b["input_ids"][:, 0].numpy() for b in itertools.islice(loader, n)])


@pytest.mark.parametrize("weights", [(0.7, 0.3), (1, 1, 1), (0.5, 0.3, 0.2), (5, 1e-3, 2, 0.4)])
def test_realized_counts_stay_within_the_bound_on_every_prefix(weights):
    plan = MixturePlan(list(weights), [str(i) for i in range(len(weights))])
    assert plan.counts.sum() == PERIOD
    k = len(weights)
    n = np.arange(1, 3 * PERIOD + 5000, 97)
    w = np.asarray(weights) / np.sum(weights)
    for slots in n.tolist():
        taken = plan.taken(slots)
        assert taken.sum() == slots
        assert np.all(np.abs(taken - w * slots) <= (k + 1) / 2 + slots / PERIOD), (slots, taken, w * slots)
    # slots() agrees with taken(): each source's k-th slot is its k-th row.
    source, index = plan.slots(0, 5000)
    for i in range(k):
        assert index[source == i].tolist() == list(range(int((source == i).sum())))
    assert np.array_equal(np.bincount(source, minlength=k), plan.taken(5000))


def test_a_weight_too_small_to_be_read_is_refused():
    with pytest.raises(ForgeError, match=r"data.sources\[1\] \(b\): weight 1e-09 is less than 1/65536"):
        MixturePlan([1.0, 1e-9], ["a", "b"])


def test_the_loader_draws_the_weighted_proportions_deterministically():
    rows = mixed()
    got = sources_of(StatefulLoader(rows, 10, seed=3), 100)  # 1000 rows
    counts = np.bincount(got, minlength=3)
    assert np.all(np.abs(counts - np.array([0.5, 0.3, 0.2]) * 1000) <= 2 + 1000 / PERIOD)
    assert np.array_equal(got, sources_of(StatefulLoader(rows, 10, seed=3), 100))
    # Within a source every row comes once per epoch of that source, in a seeded order.
    batches = list(itertools.islice(StatefulLoader(rows, 10, seed=3), 100))
    small = np.concatenate([b["input_ids"][b["input_ids"][:, 0] == 0][:, 1].numpy() for b in batches])
    assert sorted(small[:7].tolist()) == list(range(7)) and sorted(small[7:14].tolist()) == list(range(7))
    other = np.concatenate(
        [
            b["input_ids"][b["input_ids"][:, 0] == 0][:, 1].numpy()
            for b in itertools.islice(StatefulLoader(rows, 10, seed=4), 100)
        ]
    )
    assert not np.array_equal(small, other)


def test_ranks_read_disjoint_slices_of_the_same_global_batches():
    rows = mixed()
    whole = list(itertools.islice(StatefulLoader(rows, 8, seed=1), 20))
    halves = [
        list(itertools.islice(StatefulLoader(rows, 4, dp_rank=r, dp_size=2, seed=1), 20)) for r in (0, 1)
    ]
    for b in range(20):
        joined = np.concatenate([halves[0][b]["input_ids"].numpy(), halves[1][b]["input_ids"].numpy()])
        assert np.array_equal(joined, whole[b]["input_ids"].numpy())


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [3, 17])
def test_resume_mid_run_gives_exactly_the_uninterrupted_batches(workers, stop):
    rows = mixed()
    reference = [b["input_ids"].numpy() for b in itertools.islice(StatefulLoader(rows, 6, seed=9), 30)]
    first = StatefulLoader(rows, 6, seed=9, num_workers=workers)
    got = [b["input_ids"].numpy() for b in itertools.islice(first, stop)]
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint keeps
    next(first)
    first.close()
    resumed = StatefulLoader(rows, 6, seed=9, num_workers=workers)
    resumed.load_state_dict(state)
    got += [b["input_ids"].numpy() for b in itertools.islice(resumed, 30 - stop)]
    resumed.close()
    assert all(np.array_equal(a, b) for a, b in zip(got, reference)) and len(got) == 30


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_says_which_source_each_row_of_its_last_batch_came_from(workers):
    """``last_sources`` against the rows themselves (their first column is the source),
    on both data-parallel ranks, with workers and after a resume."""
    rows = mixed()
    for rank in (0, 1):
        loader = StatefulLoader(rows, 5, dp_rank=rank, dp_size=2, seed=2, num_workers=workers)
        for b in range(25):
            if b == 11:  # resumed: the counts go on from the restored position
                state = loader.state_dict()
                loader.close()
                loader = StatefulLoader(rows, 5, dp_rank=rank, dp_size=2, seed=2, num_workers=workers)
                loader.load_state_dict(state)
            batch = next(loader)
            assert loader.last_sources.tolist() == batch["input_ids"][:, 0].tolist(), (rank, b)
        loader.close()
    assert StatefulLoader(part(0, 20), 5).last_sources is None  # one source: nothing to say


def test_resume_refuses_another_mixture():
    loader = StatefulLoader(mixed(), 6, seed=9)
    next(loader)
    state = loader.state_dict()
    with pytest.raises(ForgeError, match="the checkpoint has read 6 steps of a mixture whose weights"):
        StatefulLoader(mixed(weights=(0.4, 0.4, 0.2)), 6, seed=9).load_state_dict(state)
    with pytest.raises(ForgeError, match="cannot resume the data loader: num_rows was"):
        StatefulLoader(mixed(sizes=(7, 51, 13)), 6, seed=9).load_state_dict(state)
    with pytest.raises(ForgeError, match="cannot resume the data loader"):
        StatefulLoader(part(0, 94), 6, seed=9).load_state_dict(state)


# --- through the config and the trainer -------------------------------------------------


@pytest.fixture
def two_corpora(tmp_path):
    from train_helpers import write_corpus

    return write_corpus(tmp_path / "a", docs=30, seed=1), write_corpus(
        tmp_path / "b", docs=30, seed=2, short=True
    )


def mixture_config(tmp_path, name, a, b, **train):
    from train_helpers import tiny_config

    cfg = tiny_config(tmp_path, name=name, train={"steps": 6, "batch_size": 4, **train})
    data = cfg["data"]
    del data["source"], data["source_options"]
    data["sources"] = [
        {"name": "text", "weight": 3, "options": {"paths": [a]}, "label": "prose"},
        {"name": "text", "weight": 1, "options": {"paths": [b]}},
    ]
    return cfg


def test_the_summary_line_reports_the_realized_mixture(tmp_path, two_corpora):
    from train_helpers import write_config

    from forge_core.data.build import build_training_data
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved
    from forge_plugins.tokenizers.byte import ByteTokenizer

    cfg, registries = load_resolved(
        write_config(tmp_path / "m.yaml", mixture_config(tmp_path, "m", *two_corpora))
    )
    data = build_training_data(
        make_plan(cfg, registries, 1), registries, ByteTokenizer(), report=lambda m: None
    )
    first = data.summary.splitlines()[0]
    assert "(prose+text#1 -> byte -> concat)" in first
    assert "mixture over the run's 24 rows: prose 75.0% (weight 75.0%), text#1 25.0% (weight 25.0%)" in first
    assert "  prose (data.sources[0]): " in data.summary and "  text#1 (data.sources[1]): " in data.summary


class _GhostSource:
    """A source whose implementation module was never shipped."""

    @hookimpl
    def forge_sources(self):
        return [SourceSpec(name="ghost", summary="s", impl="forge_ghost_source_gone:Source")]


def test_check_finds_every_mixture_entry_implementation(tmp_path, two_corpora):
    from train_helpers import write_config

    from forge_core.component_checks import IMPLEMENTATION_FOUND
    from forge_core.judge import judge

    cfg = mixture_config(tmp_path, "m", *two_corpora)
    cfg["data"]["sources"][1]["name"] = "ghost"
    del cfg["data"]["sources"][1]["options"]
    judged = judge(
        write_config(tmp_path / "m.yaml", cfg), world_size=1, extra_plugins=(("ghost", _GhostSource()),)
    )
    assert [(s.where, s.name, s.weight, s.label) for s in judged.plan.sources] == [
        ("data.sources[0]", "text", 3.0, "prose"),
        ("data.sources[1]", "ghost", 1.0, ""),
    ]
    assert judged.plan.specs["source"].name == "text"  # the first entry, not data.source's default
    (found,) = [v for v in judged.errors if v.rule_id == IMPLEMENTATION_FOUND]
    assert "data source 'ghost' (plugin 'ghost'" in found.message
    assert "module 'forge_ghost_source_gone' cannot be found" in found.message
    assert found.fields == (("data.sources[1].name", "ghost"),)
    # With the entries' implementations all there, nothing is reported.
    cfg["data"]["sources"][1] = {"name": "text", "options": {"paths": [two_corpora[1]]}}
    assert not judge(write_config(tmp_path / "ok.yaml", cfg), world_size=1).errors


def labelled_by_source(rows, batch_size, seed, batches):
    """What the loader's first ``batches`` batches hold, counted from their row keys:
    ``[{source: labelled tokens}]`` per batch (the part a key falls in is its source)."""
    loader = StatefulLoader(rows, batch_size, seed=seed)
    counts = []
    for keys in itertools.islice(loader.keys(0, 0), batches):
        labelled = (rows.read(keys)["labels"] != -100).sum(axis=1)
        part = np.searchsorted(rows.base, keys, side="right") - 1
        counts.append({rows.labels[i]: int(labelled[part == i].sum()) for i in range(len(rows.labels))})
    return counts


def test_a_mixture_trains_and_resumes_exactly_and_logs_the_realized_mixture(tmp_path, two_corpora):
    from train_helpers import Recorder, SignalAt, read_metrics, write_config

    from forge_core.cli.train import train
    from forge_core.data.build import build_training_data
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved
    from forge_plugins.tokenizers.byte import ByteTokenizer

    straight, resumed = Recorder(), Recorder()
    config = mixture_config(tmp_path, "straight", *two_corpora, grad_accum=2)
    config["logging"] = {"loggers": ["jsonl"]}
    train(write_config(tmp_path / "s.yaml", config), [], extra_plugins=(("rec", straight),))
    cut = write_config(tmp_path / "c.yaml", mixture_config(tmp_path, "cut", *two_corpora, grad_accum=2))
    assert train(cut, [], extra_plugins=(("stop", SignalAt(3)),)) == "interrupted"
    train(cut, [], extra_plugins=(("rec", resumed),))
    assert sorted(resumed.metrics) == [4, 5, 6]
    for step in (4, 5, 6):
        assert resumed.metrics[step]["loss"] == straight.metrics[step]["loss"]
        mixture = {k: v for k, v in straight.metrics[step].items() if k.startswith("data/")}
        assert mixture == {k: v for k, v in resumed.metrics[step].items() if k.startswith("data/")}
    # The logged counts are those of the rows the loader handed out: 6 steps x 2 micro-batches.
    cfg, registries = load_resolved(cut)
    rows = build_training_data(make_plan(cfg, registries, 1), registries, ByteTokenizer(), report=print).rows
    micro = labelled_by_source(rows, 2, cfg.run.seed, 12)
    records = {r["step"]: r for r in read_metrics(tmp_path / "straight")}
    assert sorted(records) == [1, 2, 3, 4, 5, 6]
    total = {"prose": 0, "text#1": 0}
    for step, r in records.items():
        expected = {s: micro[2 * step - 2][s] + micro[2 * step - 1][s] for s in total}
        assert {s: r[f"data/{s}/tokens"] for s in total} == expected, step
        assert sum(expected.values()) == r["tokens"]
        total = {s: total[s] + expected[s] for s in total}
        assert {s: r[f"data/{s}/share"] for s in total} == pytest.approx(
            {s: n / sum(total.values()) for s, n in total.items()}
        )
    assert 0 < total["text#1"] < total["prose"]  # both sources were read, the heavier more
