"""Every parallel layout trains exactly like one process: per-step losses and gradient
norms of a few steps equal a single-process run of the same global batches.

Two torchrun launches cover everything (one with 2 CPU processes, one with 4), each
running many layouts in turn (:mod:`scenarios`); the single-process reference runs in
the same processes. The model is a tiny llama (dim 32, 4 layers, vocab 64, rows of 16),
on plain rows or on rows packed with documents (``doc_ids``/``positions``: every
pipeline schedule with the sdpa, eager and flex backends, and pp combined with tp,
fsdp and ddp),
with tied embeddings for the ``*_tied`` layouts, for ``*_moe`` mixture-of-experts
blocks (every balancing on: the batch-scope loss and the bias update sum over the data
ranks), for ``*_qknorm`` a third-party variant with per-head q/k norms its
tensor-parallel plan declares ``partial`` (:mod:`variants`), and for
``*_qwen2``/``*_qwen3`` the built-in model's qwen2 family (q/k/v biases) and qwen3
family (its own per-head q/k norms, ``partial`` in the built-in plan), ``*_olmo2`` the olmo2
family (post-norm blocks; q/k norms over the whole projection, whose sums of squares tp
all-reduces over the ranks' heads: fsdp, tp, tp with sp, fsdp x tp, packed pp, cp); each
layout is
compared with a single-process run of its own model. After training, the evaluation
loop (:mod:`eval_loop`) runs on each layout too.

The ``cp*`` layouts split every row's tokens over the context-parallel ranks (the
``documents`` balancer unless named ``zigzag``), on packed rows unless ``_plain``: both
attention modes with each backend on 2 processes, and on 4: cp = 4, cp with fsdp, hsdp,
tp (both modes; ``mha``: as many key/value heads as query heads, so Ulysses divides them)
and pp under every schedule with each backend (the README's test command runs a loop-
placed and a V-placed schedule and leaves flex, compile and the other schedules to
``pytest -m matrix``, which .ci/run runs too). ``cp2_unisolated`` is their control: the
same rows without ``doc_ids``/``positions`` must not match.

The ``*_chunked`` layouts train with the chunked loss (``train.loss.name: chunked``,
chunks of 24 tokens): under tp the head stays sharded along the vocabulary and the
log-sum-exp is combined across ranks, under pp it runs on the last stage, under
FSDP/DDP beside the data-parallel gradient sums; each is compared with the FULL-logits
single-process run.

Tolerance: everything is fp32 and the layouts compute the same sums in a different
order (a row-wise split adds partial products per rank and then across ranks; FSDP
reduces gradient shards; the pipeline adds microbatch losses). That moves results by a
few fp32 ulps (eps = 1.2e-7): measured at most 1.6e-7 relative on the losses and 1.4e-7
on the norms over three steps. ``RTOL = 1e-5`` leaves room for other CPUs' kernels while
staying far below any real mistake: a microbatch counted twice moves the loss by 25%, a
gradient averaged instead of summed halves the norm, and a lost shard or stage changes
the norm by tens of percent. Norms are compared because SGD with clipping (every step
clips) would hide a gradient scale error from the losses.
"""

from __future__ import annotations

import time

import pytest
import torch
from harness import run_scenarios
from scenarios import ATTENTION, CP_MODES, PP_SCHEDULES, VOCAB

pytestmark = pytest.mark.distributed

RTOL = 1e-5
CHUNKED_TWO = [
    "ddp_chunked",
    "fsdp_chunked",
    "tp_chunked",
    "tp_sp_chunked",
    "tp_tied_chunked",
    "pp_chunked",
    "packed_pp_zbv_chunked",
]
CHUNKED_FOUR = ["fsdp_tp_chunked", "pp_tp_chunked"]
#: LoRA (model.transforms: [lora], every projection adapted, the base frozen): only the
#: adapters train, under each strategy, act_ckpt and packed rows; compiled in the matrix.
LORA_TWO = ["lora_ddp", "lora_fsdp", "lora_fsdp_ac_packed", "lora_tp", "lora_tp_sp", "lora_pp_1f1b_ac"]
LORA_FOUR = ["lora_fsdp_tp", "lora_pp_tp"]
LORA_MATRIX = ["lora_fsdp_compile", "lora_pp_1f1b_compile"]
PACKED_PP = [f"packed_pp_{schedule}_{attention}" for schedule in PP_SCHEDULES for attention in ATTENTION]
TWO = [
    "ddp",
    "fsdp",
    "fsdp_accum",
    "tp",
    "tp_sp",
    "pp_gpipe",
    "tp_tied",
    "tp_qknorm",
    "tp_sp_qknorm",
    "tp_qwen2",
    "tp_qwen3",
    "tp_sp_qwen3",
    "fsdp_olmo2",
    "tp_olmo2",
    "tp_sp_olmo2",
    "packed_pp_olmo2",
    "packed_ddp",
    "ddp_moe",
    "fsdp_moe",
    "tp_moe",
    "tp_sp_moe",
    "packed_pp_moe",
    "packed_ddp_ac_moe",
    *PACKED_PP,
    # activation checkpointing composes with each strategy (compiled: see composition_rules)
    "fsdp_ac",
    "fsdp_ac_every2",
    "ddp_ac",
    "tp_ac",
    "tp_sp_ac",
    "pp_gpipe_ac",
    "pp_1f1b_ac",
    "pp_interleaved_ac",
    "pp_zbv_ac",
    "pp_dualpipev_ac",
    *CHUNKED_TWO,
    *LORA_TWO,
]
FOUR = [
    *CHUNKED_FOUR,
    *LORA_FOUR,
    "fsdp_tp",
    "hsdp",
    "pp_tp",
    "pp_fsdp",
    "pp_ddp",
    "pp_fsdp_zbv",
    "fsdp_tp_tied",
    "fsdp_tp_qknorm",
    "fsdp_tp_olmo2",
    "fsdp_tp_ac",
    "pp_tp_ac",
    "pp_fsdp_ac",
]
#: Context parallelism: both attention modes on packed rows, the other balancer, plain
#: rows, accumulation, activation checkpointing, the chunked loss; cp = 4, and cp with
#: fsdp, hsdp, tp (both modes) and pp (a loop-placed and a V-placed schedule).
CP_TWO = [
    "cp2_plain",
    *(f"cp2_{mode}_{attention}" for mode in CP_MODES for attention in ATTENTION if attention != "flex"),
    "cp2_zigzag",
    "cp2_accum",
    "cp2_ac",
    "cp2_chunked",
    "cp2_olmo2",
]
CP_PP = [f"cp_pp_{schedule}_{attention}" for schedule in PP_SCHEDULES for attention in ATTENTION]
CP_FOUR = [
    "cp4",
    "cp4_ulysses_plain",
    "cp_fsdp",
    "cp_hsdp",
    "cp_tp",
    "cp_tp_ulysses",
    "cp_pp_1f1b_sdpa",
    "cp_pp_zbv_zero_bubble_eager",
]
#: The rest of the matrix, in launches of their own (``pytest -m matrix``, which .ci/run
#: runs after the README's test command): flex in both modes (each compiles its
#: rectangular kernel), compiled blocks, and cp x pp under every schedule with every
#: backend.
CP_TWO_MATRIX = ["cp2_allgather_flex", "cp2_ulysses_flex", "cp2_compile"]
CP_FOUR_MATRIX = [name for name in CP_PP if name not in CP_FOUR]
REFUSED = ["tp_uncovered"]
ROLLED = ["rolled_pp_gpipe", "rolled_pp_zbv_zero_bubble"]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    began = time.perf_counter()
    names = TWO + CP_TWO + REFUSED + ROLLED + ["cp2_unisolated"]
    results = run_scenarios(2, names, out, env={"FORGE_TEST_CKPT": str(out / "run")})
    print(f"2-process launch: {time.perf_counter() - began:.0f} s")
    results["checkpoint_run"] = str(out / "run")
    return results


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    began = time.perf_counter()
    results = run_scenarios(4, FOUR + CP_FOUR, tmp_path_factory.mktemp("four"))
    print(f"4-process launch: {time.perf_counter() - began:.0f} s")
    return results


@pytest.fixture(scope="module")
def two_matrix(tmp_path_factory):
    return run_scenarios(2, CP_TWO_MATRIX + LORA_MATRIX, tmp_path_factory.mktemp("two-matrix"))


@pytest.fixture(scope="module")
def four_matrix(tmp_path_factory):
    return run_scenarios(4, CP_FOUR_MATRIX, tmp_path_factory.mktemp("four-matrix"))


def assert_matches_reference(results, name):
    got = results[name]
    ref = results[got["reference"]]  # the single-process run of the same model
    assert got["loss"] == pytest.approx(ref["loss"], rel=RTOL), name
    assert got["norm"] == pytest.approx(ref["norm"], rel=RTOL), name
    # After training, a forward-only pass (ParallelModel.evaluate) gives one process's loss.
    assert got["eval"] == pytest.approx(ref["eval"], rel=RTOL), name
    # Every process reports the same loss and norm (pipeline ranks get the loss from the
    # last stage; the norm is global on every rank).
    for rank in got["ranks"]:
        assert rank["loss"] == pytest.approx(got["loss"], rel=1e-12)
        assert rank["norm"] == pytest.approx(got["norm"], rel=1e-12)
        assert rank["eval"] == pytest.approx(got["eval"], rel=1e-12)


@pytest.mark.parametrize("name", TWO)
def test_two_process_layout_equals_one_process(two, name):
    assert_matches_reference(two, name)


@pytest.mark.parametrize("name", CP_TWO)
def test_context_parallel_on_two_processes_equals_one_process(two, name):
    assert_matches_reference(two, name)


@pytest.mark.parametrize("name", CP_FOUR)
def test_context_parallel_with_other_dimensions_equals_one_process(four, name):
    assert_matches_reference(four, name)


@pytest.mark.matrix
@pytest.mark.parametrize("name", CP_TWO_MATRIX)
def test_context_parallel_with_flex_and_compile_equals_one_process(two_matrix, name):
    assert_matches_reference(two_matrix, name)


@pytest.mark.matrix
@pytest.mark.parametrize("name", LORA_MATRIX)
def test_compiled_lora_equals_one_process(two_matrix, name):
    assert_matches_reference(two_matrix, name)


@pytest.mark.parametrize("name", LORA_TWO + LORA_FOUR)
def test_lora_layouts_start_at_the_base_model_and_train_only_the_adapters(two, four, name):
    """B starts at zero: the first loss of every LoRA layout is the plain llama's (its
    single-process reference on the same rows); then only the adapters move, so the
    losses part from those of the full model's training."""
    results = two if name in two else four
    got = results[name]
    plain = results[
        got["reference"].replace(":lora:", ":llama:").replace("reference:llama:sdpa:plain", "reference")
    ]
    assert results[got["reference"]]["loss"][0] == plain["loss"][0]  # one process: bit for bit
    assert got["loss"][0] == pytest.approx(plain["loss"][0], rel=RTOL)
    assert got["loss"][1:] != pytest.approx(plain["loss"][1:], rel=1e-4)
    assert got["norm"] != pytest.approx(plain["norm"], rel=1e-2)  # the adapters' norm, not the model's


@pytest.mark.matrix
@pytest.mark.parametrize("name", CP_FOUR_MATRIX)
def test_context_parallel_with_every_pipeline_schedule_and_backend_equals_one_process(four_matrix, name):
    assert_matches_reference(four_matrix, name)


def test_the_packed_cp_runs_would_see_documents_attending_across_boundaries(two):
    """The control of the packed cp comparisons: the same packed rows trained without
    doc_ids and positions (a packer with isolate: false) move the gradient norm by
    about 5% (measured 5.4%, 10.9%, 8.5% over the steps), thousands of times RTOL, so
    the cp runs' agreement shows isolation is honoured across the shards."""
    got = two["cp2_unisolated"]
    ref = two[got["reference"]]
    worst = max(abs(a - b) / b for a, b in zip(got["norm"], ref["norm"]))
    assert worst > 100 * RTOL


@pytest.mark.parametrize("name", ROLLED)
def test_stages_fed_a_neighbouring_microbatchs_metadata_do_not_match_one_process(two, name):
    """The negative control of the packed pipeline runs: the stages after the first get
    the doc_ids and positions of the microbatch next to theirs (one loop-placed and one
    V-placed schedule). Documents then attend across the wrong boundaries with the wrong
    rotary positions, and the comparison above must see it: the gradient norm moves by
    about 1e-2 relative (measured 2.0e-2 and 7.8e-3), a thousand times RTOL."""
    got = two[name]
    ref = two[got["reference"]]
    worst = max(abs(a - b) / b for a, b in zip(got["norm"], ref["norm"]))
    assert worst > 100 * RTOL, name


@pytest.mark.parametrize("name", FOUR)
def test_four_process_layout_equals_one_process(four, name):
    # fsdp_tp: FSDP x TP; pp_tp: the global gradient norm across stages and TP shards;
    # pp_fsdp/pp_ddp: both stages of a data-parallel replica read the same batch.
    assert_matches_reference(four, name)


@pytest.mark.parametrize("name", ["tp_qknorm", "tp_sp_qknorm", "fsdp_tp_qknorm", "tp_qwen3", "tp_sp_qwen3"])
def test_partial_parameters_train_like_one_process_on_every_rank(two, four, name):
    """The per-head q/k norms are applied to each rank's own heads; the strategy sums
    their gradients over the tensor-parallel group, so every rank holds the same bits
    and they moved as one process's did.

    Tolerance: the weights (about 1) move by about 6e-5 in three steps; each step rounds
    them to fp32, so a few ulps of the largest weight (8 x 1.2e-7 x 1.5) bound the
    difference. Without the sum each rank keeps its own heads' share of the gradient and
    the weights miss 40-70% of their move (2.5e-5 and more): measured with the sum
    switched off."""
    results = two if name in two else four
    ranks, ref = results[name]["ranks"], results[results[name]["reference"]]
    assert ranks[0]["qk_norms"] and all(r["qk_norms"] == ranks[0]["qk_norms"] for r in ranks)
    atol = 8 * torch.finfo(torch.float32).eps * max(abs(w) for w in ref["qk_norms"])
    moved = max(abs(a - b) for a, b in zip(ref["qk_norms"], ref["qk_start"]))
    assert moved > 20 * atol  # the comparison below can tell a missing sum from rounding
    assert ranks[0]["qk_norms"] == pytest.approx(ref["qk_norms"], abs=atol, rel=0)


@pytest.mark.parametrize("name", TWO + FOUR + CP_TWO + CP_FOUR)
def test_no_layout_hands_fsdp_a_view_as_the_models_output(request, name):
    """Under fsdp x tp the output head's logits were ``DTensor.to_local()``, a view, and
    FSDP warned on every rank that an in-place op on the root's output would drop its
    pre-backward hook (the gradient matching one process is asserted above). The
    head now hands on the gathered tensor itself; no layout's training warns so."""
    results = request.getfixturevalue("two" if name in TWO + CP_TWO else "four")  # one launch, not both
    for rank, got in enumerate(results[name]["ranks"]):
        assert not [w for w in got["warnings"] if "returned a view tensor" in w], (name, rank)


def test_a_parameter_outside_the_tensor_parallel_plan_is_refused_at_build(two):
    """q/k norms neither sharded nor declared: every rank would train its own copy.
    The build stops with the parameter names and the model."""
    error = two["tp_uncovered"]["error"]
    assert "model 'qknorm_undeclared'" in error
    assert "layers.0.attention.q_norm.weight" in error and "layers.3.attention.k_norm.weight" in error
    assert "replicated" in error and "partial" in error  # the fix names both ways to declare them


@pytest.mark.parametrize("name", [n for n in TWO + FOUR + CP_TWO + CP_FOUR if not n.endswith("_flex")])
def test_eval_loop_under_every_layout_equals_one_process(two, four, name):
    """The evaluation loop (forward only, 10 rows in batches of 4, the last padded) on
    the trained model gives the single-process number on every process; same
    tolerance as the training losses."""
    results = two if name in two else four
    got = results[name]["eval_loop"]
    ref = results[results[name]["reference"]]["eval_loop"]
    assert got["tokens"] == ref["tokens"] > 0
    assert got["loss"] == pytest.approx(ref["loss"], rel=RTOL)
    for rank in results[name]["ranks"]:
        assert rank["eval_loop"]["loss"] == pytest.approx(got["loss"], rel=1e-12)


@pytest.mark.parametrize("name", CHUNKED_TWO + CHUNKED_FOUR)
def test_chunked_loss_evaluates_like_the_full_loss_of_one_process(two, four, name):
    """``pmodel.evaluate`` (forward only, the model's own loss: chunked, vocabulary-
    sharded under tp) after training equals the full-logits loss of the single-process
    run; the training losses and norms are compared by the tests above. Layouts without
    a forward-only step (pipeline) record none."""
    results = two if name in two else four
    got, ref = results[name], results[results[name]["reference"]]
    # Loss parallelism: under tp each rank computes the logits of its half of the
    # vocabulary only (pp x tp: the first stage's ranks hold no head to shard).
    shards = {tuple(rank["vocab_shard"]) for rank in got["ranks"]}
    halves = {(0, VOCAB // 2), (VOCAB // 2, VOCAB // 2)}
    if "tp" not in name:
        assert shards == {(0, VOCAB)}
    else:
        assert shards == (halves | {(0, VOCAB)} if name.startswith("pp") else halves)
    assert got["eval"] == pytest.approx(ref["eval"], rel=RTOL)
    assert got["eval"] < ref["loss"][0]  # evaluated after training: a real, trained loss


def test_reference_run_really_trains(two):
    # Guards the comparisons above against a degenerate reference (no step taken).
    losses = two["reference"]["loss"]
    assert len(losses) == 3 and len(set(losses)) == 3


def test_checkpoint_saved_under_fsdp_loads_in_one_process(two):
    """Save under FSDP over 2 ranks (DCP shards), load in this single process: the
    logits equal those the sharded model computed."""
    from pathlib import Path

    from scenarios import build_model, make_plan

    from forge_core.registry import load_registries
    from forge_core.train.checkpoint import find_latest, load_model

    registries = load_registries()
    plan = make_plan(registries, {}, {})
    torch.manual_seed(99)  # any init: the checkpoint must overwrite it
    model = build_model(plan, registries)
    torch.nn.init.normal_(model.output.weight)
    probe = torch.tensor(two["fsdp"]["probe"])
    ids = torch.tensor(two["fsdp"]["probe_ids"])
    with torch.no_grad():
        assert not torch.allclose(model(ids), probe, atol=1e-3)
        path = find_latest(Path(two["checkpoint_run"]) / "checkpoints")
        assert path is not None
        load_model(path, [model])
        assert torch.allclose(model(ids), probe, atol=1e-5, rtol=1e-5)
