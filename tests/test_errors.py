"""Errors from plugin code, at build and at run time, come out of ``forge-run`` as one
clean message naming the component, the plugin and the original error, with exit 2; the
kernel's own failures as one line with exit 1 (the traceback with FORGE_TRACEBACK=1);
KeyboardInterrupt and SystemExit are never wrapped. In process, through ``cli.main``,
with the components registered by an installed (fake) distribution."""

from __future__ import annotations

import json

import pytest
from conftest import make_distribution
from train_helpers import tiny_config, write_config

from forge_core.cli import main

FAULTS = """
import os

from forge_core.api import LoggerSpec, ModelSpec, OptimizerSpec, SourceSpec, hookimpl

ACCEPTS = {"doc_ids", "positions"}


class MissingFileSource:
    def __init__(self, options):
        open("/nonexistent/forge-corpus.txt")


def model_raises(options, vocab_size, attention):
    raise ValueError("dim 30 does not split into 4 heads")


def model_old_signature(options):
    return None


def model_exits(options, vocab_size, attention):
    raise SystemExit(7)


def model_interrupted(options, vocab_size, attention):
    raise KeyboardInterrupt


def stock_sparse_adam(named_params, lr, options):
    import torch

    # torch's own class: the failure at step() is in torch's code, not in this package
    return torch.optim.SparseAdam([p.param for p in named_params], lr=lr)


class BombLogger:
    def __init__(self, options):
        pass

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if step == 2:
            raise ValueError("cannot reach the dashboard")


@hookimpl
def forge_sources():
    return [SourceSpec(name="missing", summary="Reads a file that is not there",
                       impl="forge_faults:MissingFileSource")]


@hookimpl
def forge_models():
    spec = dict(max_seq_len_option=None, accepts=ACCEPTS)
    return [
        ModelSpec(name="raises", summary="Refuses its options", impl="forge_faults:model_raises", **spec),
        ModelSpec(name="oldsig", summary="Old constructor signature",
                  impl="forge_faults:model_old_signature", **spec),
        ModelSpec(name="exits", summary="Calls sys.exit", impl="forge_faults:model_exits", **spec),
        ModelSpec(name="ctrlc", summary="Interrupted", impl="forge_faults:model_interrupted", **spec),
        ModelSpec(name="absent", summary="Its module is missing", impl="forge_faults_gone:build", **spec),
    ]


@hookimpl
def forge_loggers():
    return [LoggerSpec(name="bomb", summary="Raises at step 2", impl="forge_faults:BombLogger")]


@hookimpl
def forge_optimizers():
    return [OptimizerSpec(name="sparse", summary="Dense gradients refused at step()",
                          impl="forge_faults:stock_sparse_adam")]
"""


@pytest.fixture
def faults(tmp_path, monkeypatch):
    site = make_distribution(
        tmp_path / "site", "forge-faults", "0.1", {"forge_faults": FAULTS}, {"faults": "forge_faults"}
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("FORGE_TRACEBACK", raising=False)

    def config(**sections) -> str:
        return write_config(tmp_path / "c.yaml", tiny_config(tmp_path, "run", **sections))

    return config


def error_line(err: str) -> str:
    """The report's error line (progress notes such as the token cache's come before it)."""
    return next(line for line in err.splitlines() if line.startswith("error:"))


def run(capsys, path: str) -> tuple[int, str]:
    code = main([path])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "model, original",
    [
        ("raises", "ValueError: dim 30 does not split into 4 heads"),
        ("oldsig", "TypeError: model_old_signature() got an unexpected keyword argument"),
    ],
)
def test_a_component_that_fails_to_build_names_itself_and_its_plugin(faults, capsys, model, original):
    code, err = run(capsys, faults(model={"name": model, "options": {}}))
    assert code == 2
    assert error_line(err).startswith(
        f"error: building model {model!r} (plugin 'faults') failed: {original}"
    ), err
    assert "Traceback" not in err


def test_file_errors_and_missing_modules_of_components_exit_2(faults, capsys, tmp_path):
    code, err = run(capsys, faults(data={"source": "missing", "source_options": {}}))
    assert code == 2 and "Traceback" not in err
    assert "building data source 'missing' (plugin 'faults') failed: FileNotFoundError:" in err
    assert "/nonexistent/forge-corpus.txt" in err
    code, err = run(capsys, faults(model={"name": "absent", "options": {}}))
    assert code == 2
    # The check that precedes every run looks the module up without importing it.
    assert "[component.implementation-found]" in err
    assert "model 'absent' (plugin 'faults', from" in err and "'forge_faults_gone:build'" in err
    assert (
        "module 'forge_faults_gone' cannot be found" in err
        and not (tmp_path / "run" / "checkpoints").exists()
    )


def test_a_component_failing_while_training_is_named(faults, capsys):
    code, err = run(capsys, faults(logging={"loggers": ["bomb"]}))
    assert code == 2 and "Traceback" not in err
    assert error_line(err).startswith(
        "error: logger 'bomb' (plugin 'faults') failed: ValueError: cannot reach the dashboard"
    ), err
    assert "forge_faults.py" in err and "in forge_step_end" in err


def test_a_stock_torch_optimizer_failing_at_its_step_is_named_with_its_plugin(faults, capsys):
    code, err = run(capsys, faults(train={"steps": 2, "batch_size": 4, "optimizer": "sparse"}))
    assert code == 2 and "Traceback" not in err, err
    assert error_line(err).startswith(
        "error: optimizer 'sparse' (plugin 'faults') failed: RuntimeError: SparseAdam does not "
        "support dense gradients"
    ), err
    assert "bug in Forge" not in err


def test_culprit_names_a_built_component_by_its_own_methods_not_by_the_torch_machinery_around_it():
    """A frame whose ``self`` is a built component names it when the frame runs a method
    of the component's class (torch's ``SparseAdam.step``); ``Module.__call__`` around a
    model, where FSDP's hooks run, is machinery and names nobody."""
    import torch

    from forge_core.components import blame

    optimizer = torch.optim.SparseAdam([torch.nn.Parameter(torch.ones(2))])
    module = torch.nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda mod, args: json.loads("{"))
    blame.remember(optimizer, "optimizer 'sparse' (plugin 'faults')")
    blame.remember(module, "model 'linear' (plugin 'faults')")
    optimizer.param_groups[0]["params"][0].grad = torch.ones(2)
    with pytest.raises(RuntimeError) as stepped:
        optimizer.step()
    assert blame.built_culprit(stepped.value) == "optimizer 'sparse' (plugin 'faults')"
    with pytest.raises(ValueError) as hooked:
        module(torch.ones(2))
    assert blame.built_culprit(hooked.value) is None


def test_culprit_names_torchs_adafactor_failing_on_a_sharded_parameter():
    """The reported case: torch's Adafactor (whose class torch files under another
    ``__module__`` than the one its code is in) on an FSDP-sharded parameter."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from forge_core.components import blame
    from forge_core.testing.optimizer import one_process_group

    with one_process_group():
        mesh = init_device_mesh("cpu", (1,))
        param = torch.nn.Parameter(distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)]))
        optimizer = torch.optim.Adafactor([param])
        blame.remember(optimizer, "optimizer 'adafactor' (plugin 'mine')")
        param.grad = distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)])
        with pytest.raises(
            RuntimeError, match="in-place operations that require placement changes"
        ) as caught:
            optimizer.step()
    assert blame.built_culprit(caught.value) == "optimizer 'adafactor' (plugin 'mine')"
    message = str(blame.failure(caught.value, "optimizer 'adafactor' (plugin 'mine')"))
    assert message.startswith("optimizer 'adafactor' (plugin 'mine') failed: RuntimeError: aten.pow_.Scalar")
    assert "forge_core.testing.check_optimizer shows this on one process" in message


def test_a_kernel_failure_is_one_line_and_the_traceback_is_opt_in(faults, capsys, monkeypatch):
    from forge_core.train.trainer import Trainer

    def broken(self):
        raise RuntimeError("internal invariant broken")

    monkeypatch.setattr(Trainer, "prepare_run_dir", broken)
    path = faults()
    code, err = run(capsys, path)
    assert code == 1
    assert error_line(err).startswith("error: unexpected RuntimeError: internal invariant broken (at ")
    assert "FORGE_TRACEBACK=1 shows the traceback" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("FORGE_TRACEBACK", "1")
    code, err = run(capsys, path)
    assert code == 1 and "Traceback (most recent call last)" in err and "in broken" in err


def test_system_exit_and_keyboard_interrupt_from_plugins_are_not_wrapped(faults, capsys):
    with pytest.raises(SystemExit) as caught:
        main([faults(model={"name": "exits", "options": {}})])
    assert caught.value.code == 7
    assert main([faults(model={"name": "ctrlc", "options": {}})]) == 130


def test_culprit_without_a_component():
    """A helper module of a plugin that no component names is the plugin's; code of no
    plugin (the kernel, the standard library) is nobody's."""
    from forge_core.components import culprit
    from forge_core.registry import load_registries
    from forge_plugins.models import rotary

    registries = load_registries()
    with pytest.raises(TypeError) as caught:
        rotary.rotary_table("eight", 8, 10000.0)  # a helper of the 'models' plugin, given garbage
    assert culprit(caught.value, registries) == "plugin 'models'"
    with pytest.raises(ValueError) as caught:
        json.loads("{")
    assert culprit(caught.value, registries) is None


def test_init_from_hf_folder_that_needs_its_own_code_is_refused(tmp_path):
    from forge_plugins.models.hf_folder import read_hf_config

    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
        )
    )
    with pytest.raises(ValueError, match="names custom model code .*never runs code from model folders"):
        read_hf_config(tmp_path)
