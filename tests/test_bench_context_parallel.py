"""The pure parts of ``bench/context_parallel.py``: its activation-memory accounting on a
toy autograd graph, the packed rows it trains on, and its table. (The bench itself
launches torchrun per cp degree and takes about a minute even with ``--quick``.)"""

from __future__ import annotations

import torch
from conftest import load_bench

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS

bench = load_bench("context_parallel.py")


def toy_step(weight: torch.nn.Parameter, x: torch.Tensor) -> torch.Tensor:
    # x * 2 stands for an earlier layer's output: it needs a gradient, so the linear
    # layer saves the weight (a view of it) beside its input.
    h = torch.nn.functional.linear(x * 2, weight)
    t = h.tanh()  # saves its output
    return (t * t).sum()  # saves t twice: one storage


def test_saved_bytes_counts_each_saved_activation_once_and_no_weight():
    weight = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with bench.SavedBytes() as saved:
        loss = toy_step(weight, x)
    # x * 2 (5 x 4) and tanh's output (5 x 3), 8 bytes each; the weight is not an activation.
    assert saved.bytes == (5 * 4 + 5 * 3) * 8
    loss.backward()
    # The hooks hand autograd its tensors unchanged: the gradient is the one without them.
    got = (weight.grad, x.grad)
    weight.grad = x.grad = None
    toy_step(weight, x).backward()
    torch.testing.assert_close(got, (weight.grad, x.grad), rtol=0, atol=0)


def test_saved_bytes_grows_with_the_activations_not_the_weights():
    weight = torch.nn.Parameter(torch.randn(64, 4, dtype=torch.float64))
    with bench.SavedBytes() as small:
        toy_step(weight, torch.randn(5, 4, dtype=torch.float64, requires_grad=True))
    with bench.SavedBytes() as large:
        toy_step(weight, torch.randn(10, 4, dtype=torch.float64, requires_grad=True))
    assert large.bytes == 2 * small.bytes == 2 * (5 * 4 + 5 * 64) * 8


def test_packed_batch_is_what_an_isolating_packer_emits():
    batch = bench.packed_batch(rows=3, seq_len=2048)
    doc_ids, positions, labels = batch[DOC_IDS], batch[POSITIONS], batch[LABELS]
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        k: (3, 2048) for k in (INPUT_IDS, LABELS, DOC_IDS, POSITIONS)
    }
    assert bool((doc_ids.diff(dim=1) >= 0).all()) and int(doc_ids[:, -1].min()) > 0  # several documents
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    assert bool((positions[starts] == 0).all()) and bool((positions[~starts] > 0).all())
    # Each document's last token has no next token of its document to predict.
    assert bool((labels[:, :-1][starts[:, 1:]] == IGNORE_INDEX).all())
    assert int((labels == IGNORE_INDEX).sum()) == int(starts[:, 1:].sum())


def _result(cp: int, saved: float, wall: float, **more) -> dict:
    attention = "allgather" if cp > 1 else "-"
    return {
        "seq_len": 1024,
        "cp": cp,
        "attention": attention,
        "saved": saved,
        "wall": wall,
        "cpu": 2 * wall,
        **more,
    }


def test_table_reports_ratios_to_cp1_and_to_the_baseline():
    mib = bench.MIB
    rows = [
        _result(2, 5 * mib, 0.3, base_wall=0.2, base_cpu=0.4, imbalance=1.02, cuda_peak=6 * mib),
        _result(1, 10 * mib, 0.2, cuda_peak=12 * mib),
    ]
    lines = bench.table(rows).splitlines()
    assert lines[0].split() == [
        "seq_len", "cp", "attention", "saved", "MiB", "vs", "cp1", "x", "cp", "step", "ms", "1-proc", "ms",
        "vs", "1-proc", "CPU", "ms", "1-proc", "CPU", "vs", "1-proc", "imbalance",
    ]  # fmt: skip
    assert lines[1].split() == ["1024", "1", "-", "10.0", "1.00", "1.00", "200", "400"]
    assert lines[2].split() == ["1024", "2", "allgather", "5.0", "0.50", "1.00", "300", "200", "1.50"] + [
        "600", "400", "1.50", "1.020",
    ]  # fmt: skip
    cuda = bench.table(rows, cuda=True).splitlines()
    assert cuda[2].split()[6:8] == ["6.0", "0.50"]
