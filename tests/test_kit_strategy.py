"""The kit's strategy check (forge_core.testing.check_strategy): the built-in strategies
pass it at degree 1 in one process, and third-party strategies that break the contract
(renamed parameters, a batch transform that drops a key, an attention wrapper that
changes the output, a mesh dimension on tp's place, an unloadable attention wrapper)
fail it with a message naming the strategy and the fix.
Logits shifted by a constant, which the loss cannot see, fail it too."""

from __future__ import annotations

import attrs
import pytest
import torch

from forge_core.api import DOC_IDS, MeshDim, ParallelismSpec
from forge_core.testing import check_strategy

APPLIED = ("declaration", "options", "impl", "names", "forward", "gradients", "evaluate")


@pytest.mark.parametrize("name", ["pp", "tp", "fsdp", "ddp", "act_ckpt", "ep"])
def test_the_built_in_strategies_pass_at_degree_1(name):
    report = check_strategy(name)
    assert report.checked == APPLIED and report.skipped == {}
    assert max(report.worst.values()) < 1
    assert report.dims == ("pp", "dp_replicate", "dp_shard", "ep", "cp", "tp")


def test_context_parallelism_passes_with_its_batch_transform_and_attention_wrapper():
    report = check_strategy("cp")
    assert {"attention", "batch_transform"} <= set(report.checked)
    assert max(report.worst.values()) < 1


# --- hostile third-party strategies, built here ----------------------------------------


class Renames:
    """Wraps the final norm in a Sequential: the forward is unchanged, its name is not."""

    def __init__(self, options):
        pass

    def apply(self, model, ctx):
        model.norm = torch.nn.Sequential(model.norm)
        return model


class DropsDocIds:
    def __init__(self, options):
        pass

    def apply(self, model, ctx):
        return model

    def batch_transform(self, ctx):
        return lambda batch: {k: v for k, v in batch.items() if k != DOC_IDS}


class TransformRaises(DropsDocIds):
    def batch_transform(self, ctx):
        def transform(batch):
            raise ValueError("unknown balancer")

        return transform


class ShiftsLogits:
    """Adds 1 to every logit: softmax, so the loss and the gradients, cannot see it."""

    def __init__(self, options):
        pass

    def apply(self, model, ctx):
        model.register_forward_hook(lambda module, args, output: output + 1.0)
        return model


class Unchanged:
    def __init__(self, options):
        pass

    def apply(self, model, ctx):
        return model


class _Louder:
    def __init__(self, inner):
        self.inner = inner

    def prepare(self, doc_ids, seq_len, device):
        return self.inner.prepare(doc_ids, seq_len, device)

    def attend(self, q, k, v, prepared):
        return 1.01 * self.inner.attend(q, k, v, prepared)


def louder(backend, ctx):
    assert (ctx.rank, ctx.size, ctx.group) == (0, 1, None)  # what the kit hands a wrapper
    return _Louder(backend)


@attrs.frozen
class NoDefault:
    width: int = attrs.field()


def wrapper(name, impl, **more):
    return ParallelismSpec(name=name, summary="t", impl=f"test_kit_strategy:{impl}", **more)


def with_dim(**dim):
    dim = {"name": "ep", "place": 450, "summary": "Expert-parallel degree.", **dim}
    return wrapper("ep", "Unchanged", mesh_dim=dim["name"], dim=MeshDim(**dim))


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            wrapper("renamer", "Renames"),
            r"strategy 'renamer': after apply the model parts name their parameters differently: "
            r"lost \['norm.weight'\], new \['norm.0.weight'\]. Checkpoints are keyed by parameter names",
        ),
        (
            wrapper("dropper", "DropsDocIds"),
            r"strategy 'dropper': its batch transform #0 \(batch_transform\(ctx\)\) dropped \['doc_ids'\] "
            r"of \['doc_ids', 'input_ids', 'labels', 'positions'\] on packed rows: every key it is given "
            "must come back",
        ),
        (
            wrapper("raiser", "TransformRaises"),
            r"strategy 'raiser': its batch transform #0 \(batch_transform\(ctx\)\) raised ValueError: "
            r"unknown balancer on packed rows",
        ),
        (
            wrapper("shifter", "ShiftsLogits"),
            r"strategy 'shifter': the logits on packed rows differ from the model's alone",
        ),
        (
            wrapper("louder", "Unchanged", attention="test_kit_strategy:louder"),
            r"strategy 'louder': its attention wrapper 'test_kit_strategy:louder', given an "
            r"AttentionContext of size 1, changes the loss on packed rows",
        ),
        (
            wrapper("absent", "Unchanged", attention="test_kit_strategy:no_such_wrapper"),
            r"strategy 'absent': its attention wrapper 'test_kit_strategy:no_such_wrapper' "
            r"\(ParallelismSpec.attention\) cannot be loaded",
        ),
        (
            with_dim(place=500),
            r"strategy 'ep': its mesh dimension cannot be declared beside those of the registered "
            r"strategies: mesh dimension 'tp' of strategy 'tp' \(plugin 'parallel'\) has the place 500 of "
            r"'ep', declared by strategy 'ep'",
        ),
        (
            with_dim(fills_world=True),
            r"strategy 'ep': .*more than one mesh dimension fills the world size \(-1\): ep, dp_shard",
        ),
        (
            with_dim(shards_with="dq"),
            r"strategy 'ep': .*shards with 'dq', which no strategy declares",
        ),
        (
            with_dim(default=0),
            r"strategy 'ep': its mesh dimension 'ep' declares default=0, which its own degree check refuses",
        ),
        (
            wrapper("strict", "Unchanged", options=NoDefault),
            r"strategy 'strict': its options class NoDefault does not structure an empty block "
            r"\(\$.parallel.options.strict.width: .*\)",
        ),
        (
            wrapper("missing", "NoSuchClass"),
            r"strategy 'missing': its impl 'test_kit_strategy:NoSuchClass' cannot be loaded",
        ),
    ],
    ids=[
        "renames-parameters",
        "transform-drops-a-key",
        "transform-raises",
        "shifts-logits",
        "attention-wrapper-changes-output",
        "attention-wrapper-absent",
        "place-of-tp",
        "second-world-filler",
        "shards-with-nothing",
        "default-0",
        "option-without-default",
        "impl-absent",
    ],
)
def test_a_strategy_that_breaks_the_contract_fails_naming_it(spec, says):
    with pytest.raises(AssertionError, match=says):
        check_strategy(spec)


def test_a_third_party_dimension_that_holds_passes_and_joins_the_mesh_in_order():
    report = check_strategy(with_dim())
    assert report.dims == ("pp", "dp_replicate", "dp_shard", "cp", "ep", "tp")
    assert report.checked == APPLIED


def test_a_strategy_the_model_cannot_take_is_skipped_with_the_reason():
    spec = wrapper("needs", "Unchanged", requires={"something_new"})
    report = check_strategy(spec)
    assert report.checked == ("declaration", "options", "impl")
    assert report.skipped["forward"] == (
        "the model 'llama' does not supply ['something_new'], which the strategy requires"
    )


def test_misuse_is_a_value_error():
    with pytest.raises(ValueError, match="unknown parallelism strategy 'fsdq'"):
        check_strategy("fsdq")
    with pytest.raises(ValueError, match="takes a registered strategy's name or a ParallelismSpec"):
        check_strategy(Unchanged)
