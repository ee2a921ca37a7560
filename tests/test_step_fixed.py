"""The per-step path looks the model up once (:class:`forge_core.train.step.StepFixed`):
a step neither lists the parameters nor walks the modules again, still calls every
module's ``after_optimizer_step``, and trains bit for bit as the step that looks them up
itself."""

from __future__ import annotations

import torch
from train_helpers import tiny_config, write_config

from forge_core.api import hookimpl
from forge_core.distributed.parallelize import single_process
from forge_core.testing import train_in_process
from forge_core.train.step import StepFixed, optimizer_step


class Counted(torch.nn.Module):
    """Embedding + linear whose ``after_optimizer_step`` counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.out = torch.nn.Linear(4, 8)
        self.after = 0

    def forward(self, input_ids):
        return self.out(self.emb(input_ids))

    def after_optimizer_step(self) -> None:
        self.after += 1


def loss_fn(logits, labels):
    sum_ = torch.nn.functional.cross_entropy(logits.reshape(-1, 8), labels.reshape(-1), reduction="sum")
    return sum_, (labels != -100).sum()


def walks(monkeypatch) -> list[int]:
    """Counts every module walk (``modules()``, ``parameters()`` and the like all go
    through ``named_modules``)."""
    count = [0]
    original = torch.nn.Module.named_modules

    def counted(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "named_modules", counted)
    return count


def train(fixed_once: bool, monkeypatch=None) -> tuple[Counted, list[float], int]:
    torch.manual_seed(0)
    model = Counted()
    pmodel = single_process(model, loss_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, foreach=True)
    fixed = StepFixed.of(pmodel) if fixed_once else None
    count = walks(monkeypatch) if monkeypatch is not None else [0]
    batch = {"input_ids": torch.tensor([[0, 1, 2, 3]]), "labels": torch.tensor([[1, 2, 3, -100]])}
    losses = []
    for _ in range(3):
        out = optimizer_step(
            pmodel, [optimizer], [batch], 0.1, precision_name="fp32", device=torch.device("cpu"),
            slice_weight=1.0, grad_clip=0.5, stop=False, count_pairs=lambda b: 0, fixed=fixed,
        )  # fmt: skip
        losses.append(out.loss)
    return model, losses, count[0]


def test_a_step_given_what_is_fixed_walks_no_module_and_still_calls_after_optimizer_step(monkeypatch):
    model, _, walked = train(fixed_once=True, monkeypatch=monkeypatch)
    assert walked == 0 and model.after == 3
    monkeypatch.undo()
    model, _, walked = train(fixed_once=False, monkeypatch=monkeypatch)
    assert walked > 0 and model.after == 3  # what the step did every time before


def test_the_fixed_lookup_trains_bit_for_bit_as_the_lookup_per_step():
    once, losses_once, _ = train(fixed_once=True)
    each, losses_each, _ = train(fixed_once=False)
    assert losses_once == losses_each
    for a, b in zip(once.state_dict().values(), each.state_dict().values(), strict=True):
        assert torch.equal(a, b)


class WalksPerStep:
    """Module walks between the end of step 2 and the end of the last step."""

    def __init__(self, count: list[int]) -> None:
        self.count, self.at = count, {}

    @hookimpl
    def forge_step_end(self, step):
        self.at[step] = self.count[0]


def test_the_trainer_walks_the_model_at_build_not_at_every_step(tmp_path, monkeypatch):
    count = walks(monkeypatch)
    probe = WalksPerStep(count)
    cfg = tiny_config(tmp_path, "fixed", train={"steps": 4, "grad_clip": 1.0})
    path = write_config(tmp_path / "fixed.yaml", cfg)
    assert train_in_process(path, extra_plugins=(("probe", probe),)) == "completed"
    assert probe.at[4] == probe.at[2]
