"""GPU readiness in one command: on one CUDA GPU, in bf16, in under 8 minutes, what needs
a GPU to be known, written to a JSON report.

    python bench/gpu_validation.py [--out gpu_validation.json]   # CUDA, bf16
    python bench/gpu_validation.py --reduced                      # CPU, fp32, tiny shapes

Sections (each with its wall seconds in the report):

1. **attention**: packed rows (documents of log-normal length, median 2048) at 8k and
   32k tokens, one attention layer (32 query / 8 key-value heads of 128) forward and
   backward: flex with its ``BlockMask`` against sdpa with the dense block-diagonal
   ``(1, 1, S, S)`` mask, in turns (``bench/alternate.py``, synchronized around every
   timing); tokens/s, the ratio, and each one's peak memory
   (``torch.cuda.max_memory_allocated`` during one step above what was allocated before).
2. **llama_1b**: a 1.1 B-parameter llama (dim 2048, 16 blocks, 32 / 8 heads, SwiGLU
   8192, vocabulary 32,768, untied; Llama 3.2 1B's blocks with a smaller vocabulary)
   training under bf16 autocast as ``train.precision: bf16`` does (parameters and AdamW
   state fp32), batch 4 x 2048 causal rows, sdpa: tokens/s, MFU (Forge's FLOP count,
   :func:`forge_core.train.flops.step_flops`, against the device-table peak,
   :func:`forge_core.train.peak.peak_flops`, whose source the report names), peak memory
   (above the weights and optimizer state, and in all).
3. **equivalence**: what only CUDA kernels can show: on a packed row in bf16, every
   document of the packed row equals that document run alone (sdpa, causal, nothing
   else in the row), within bf16's rounding for the longest sum
   (:mod:`forge_core.testing.tolerance`): one attention layer with flex and with
   dense-mask sdpa (output and the three input gradients; flex's CUDA backward is its
   own kernel), and a llama's logits with each backend (rotary positions restart at each
   document). A failure is recorded with its message and the command exits 1 after
   writing the report.

``--reduced`` runs the same sections on the CPU in fp32 at tiny shapes (seconds; a test
runs it so it cannot rot), with flex's unfused kernel (PyTorch's ``flex_attention``
uncompiled: compiling takes longer than the rest of the reduced run); the report says
which kernel ran.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import ratio, rounds  # noqa: E402
from packed_training import peak_mib  # noqa: E402

#: The shapes of a real run and of ``--reduced``.
FULL = {
    "dtype": "bf16",
    "attention": {"heads": 32, "kv_heads": 8, "head_dim": 128, "seq_lens": [8192, 32768], "median_doc": 2048},
    "llama": {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 8192},
    "llama_vocab": 32768,
    "llama_batch": [4, 2048],
    "equivalence": {"dim": 512, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4},
    "equivalence_vocab": 1024,
    "equivalence_seq_len": 4096,
    "equivalence_median_doc": 512,
    "pairs": 3,
    "steps": 3,
}
REDUCED = {
    "dtype": "fp32",
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 16, "seq_lens": [64, 128], "median_doc": 16},
    "llama": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_hidden": 64},
    "llama_vocab": 64,
    "llama_batch": [2, 32],
    "equivalence": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
    "equivalence_vocab": 64,
    "equivalence_seq_len": 64,
    "equivalence_median_doc": 16,
    "pairs": 3,
    "steps": 1,
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def doc_lengths(seq_len: int, median: float, seed: int) -> list[int]:
    from forge_core.testing import lognormal_lengths

    return lognormal_lengths(seq_len, median=median, seed=seed)


def attention_inputs(shape: dict, seq_len: int, device: torch.device, dtype: torch.dtype, seed: int):
    """``(lengths, doc_ids, q, k, v, grad)`` for one packed row, leaves in a model's layout."""
    from forge_core.testing import packed_metadata

    lengths = doc_lengths(seq_len, shape["median_doc"], seed)
    doc_ids, _ = packed_metadata([lengths], device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def leaf(heads: int) -> torch.Tensor:
        x = torch.randn(1, seq_len, heads, shape["head_dim"], generator=gen, device=device, dtype=dtype)
        return x.transpose(1, 2).requires_grad_(True)

    q, k, v = leaf(shape["heads"]), leaf(shape["kv_heads"]), leaf(shape["kv_heads"])
    grad = torch.randn(q.shape, generator=gen, device=device, dtype=dtype)
    return lengths, doc_ids, q, k, v, grad


def backends() -> dict[str, Any]:
    from forge_plugins.attention.flex import FlexAttention
    from forge_plugins.attention.options import FlexOptions, SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention

    return {"flex": FlexAttention(FlexOptions()), "sdpa": SdpaAttention(SdpaOptions())}


def attend_step(backend: Any, doc_ids, q, k, v, grad) -> Callable[[], None]:
    """prepare + attend + backward, the gradients dropped after."""

    def step() -> None:
        out = backend.attend(q, k, v, backend.prepare(doc_ids, q.shape[2], q.device))
        torch.autograd.backward(out, grad)
        for t in (q, k, v):
            t.grad = None

    return step


def section_attention(cfg: dict, device: torch.device, sync: Callable[[], None]) -> list[dict]:
    shape, dtype = cfg["attention"], DTYPES[cfg["dtype"]]
    out = []
    for seq_len in shape["seq_lens"]:
        lengths, doc_ids, q, k, v, grad = attention_inputs(shape, seq_len, device, dtype, seed=seq_len)
        steps = {name: attend_step(backend, doc_ids, q, k, v, grad) for name, backend in backends().items()}
        times = rounds(steps, cfg["pairs"], cfg["steps"], warmup=1, sync=sync)
        row: dict[str, Any] = {"seq_len": seq_len, "documents": len(lengths)}
        for name, step in steps.items():
            wall = statistics.median(times[name]["wall"])
            row[name] = {
                "tokens_s": seq_len / wall,
                "wall_s": wall,
                "cpu_s": statistics.median(times[name]["cpu"]),
                "peak_mib": peak_mib(step, str(device)),
            }
        row["flex_speedup_wall"] = ratio(times, "sdpa", "flex", "wall")
        row["flex_speedup_cpu"] = ratio(times, "sdpa", "flex", "cpu")
        out.append(row)
    return out


def llama(shape: dict, vocab: int, backend: Any, device: torch.device, max_seq_len: int) -> torch.nn.Module:
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    torch.manual_seed(0)
    return build(LlamaOptions(**shape, max_seq_len=max_seq_len), vocab, backend).to(device)


def section_llama(cfg: dict, device: torch.device, sync: Callable[[], None]) -> dict:
    """Training tokens/s, MFU and peak memory of the 1 B llama (see the module docstring)."""
    from forge_core.train import flops
    from forge_core.train.loss import loss_fn
    from forge_core.train.peak import peak_flops

    dtype = DTYPES[cfg["dtype"]]
    rows, seq_len = cfg["llama_batch"]
    shape = cfg["llama"]
    vocab = cfg["llama_vocab"]
    model = llama(shape, vocab, backends()["sdpa"], device, seq_len).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, vocab, (rows, seq_len + 1), generator=gen, device=device)
    losses: list[float] = []

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(ids[:, :-1])
        total, count = loss_fn(logits, ids[:, 1:])
        (total / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total.detach() / count)

    times = rounds({"llama": step}, cfg["pairs"], cfg["steps"], warmup=1, sync=sync)
    wall = statistics.median(times["llama"]["wall"])
    tokens = rows * seq_len
    step_flops = flops.step_flops(
        flops.active_matmul_params(model),
        shape["n_layers"] * shape["dim"],  # heads x head dim, every layer
        tokens,
        flops.attended_pairs(None, rows, seq_len),
    )
    peak = peak_flops(device, dtype)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": [rows, seq_len],
        "tokens_s": tokens / wall,
        "step_s": wall,
        "step_cpu_s": statistics.median(times["llama"]["cpu"]),
        "tflops_s": step_flops / wall / 1e12,
        "mfu": step_flops / wall / peak.flops,
        "peak_tflops": peak.flops / 1e12,
        "peak_source": peak.source,
        "peak_mib": peak_mib(step, str(device)),
        # On CUDA, everything allocated at the step's peak: weights, AdamW state, activations.
        "peak_total_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "first_loss": float(losses[0]),
        "last_loss": float(losses[-1]),
    }


def check(results: list[dict], what: str, got: torch.Tensor, want: torch.Tensor, dtype, terms: int) -> None:
    """Record whether ``got`` equals ``want`` within the rounding of ``dtype``."""
    from forge_core.testing import assert_within_rounding

    try:
        worst = assert_within_rounding(got, want, dtype=dtype, terms=terms, what=what)
        results.append({"what": what, "passed": True, "worst_ratio": worst})
    except AssertionError as exc:
        results.append({"what": what, "passed": False, "message": str(exc)})


def section_equivalence(cfg: dict, device: torch.device) -> list[dict]:
    """Every document of a packed row against the document alone (module docstring)."""
    from forge_core.api import DOC_IDS, POSITIONS
    from forge_core.testing import longest_sum, packed_metadata

    dtype = DTYPES[cfg["dtype"]]
    results: list[dict] = []
    shape = cfg["attention"] | {"median_doc": cfg["equivalence_median_doc"]}
    seq_len = cfg["equivalence_seq_len"]
    lengths, doc_ids, q, k, v, grad = attention_inputs(shape, seq_len, device, dtype, seed=1)
    spans = [(sum(lengths[:i]), n) for i, n in enumerate(lengths)]
    made = backends()
    sdpa = made["sdpa"]
    terms = max(seq_len, shape["head_dim"])
    for name, backend in made.items():
        out = backend.attend(q, k, v, backend.prepare(doc_ids, seq_len, device))
        packed = [out, *torch.autograd.grad(out, (q, k, v), grad)]
        for d, (start, n) in enumerate(spans):
            parts = [t[:, :, start : start + n].detach().requires_grad_(True) for t in (q, k, v)]
            alone_out = sdpa.attend(*parts, sdpa.prepare(None, n, device))
            alone = [alone_out, *torch.autograd.grad(alone_out, parts, grad[:, :, start : start + n])]
            for label, got, want in zip(("output", "dq", "dk", "dv"), packed, alone):
                what = f"attention {name}, document {d} ({n} tokens): {label}"
                check(results, what, got[:, :, start : start + n], want, dtype, terms)
    model_shape = cfg["equivalence"]
    doc_ids, positions = packed_metadata([doc_lengths(seq_len, cfg["equivalence_median_doc"], 2)], device)
    lengths = torch.bincount(doc_ids[0]).tolist()
    gen = torch.Generator(device=device).manual_seed(3)
    vocab = cfg["equivalence_vocab"]
    ids = torch.randint(0, vocab, (1, seq_len), generator=gen, device=device)
    reference = llama(model_shape, vocab, sdpa, device, seq_len).eval()
    terms = longest_sum(reference, seq_len)
    for name, backend in made.items():
        model = llama(model_shape, vocab, backend, device, seq_len).eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            packed = model(ids, **{DOC_IDS: doc_ids, POSITIONS: positions})
            start = 0
            for d, n in enumerate(lengths):
                alone = reference(ids[:, start : start + n])
                what = f"llama {name}, document {d} ({n} tokens): logits"
                check(results, what, packed[:, start : start + n], alone, dtype, terms)
                start += n
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every section, timed; the report."""
    cfg = REDUCED if args.reduced else FULL
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": cfg["dtype"],
        "reduced": args.reduced,
        "flex_kernel": "compiled",
        "seconds": {},
    }
    from forge_plugins.attention import flex_kernel

    kernel = flex_kernel.compiled
    if args.reduced:
        from torch.nn.attention.flex_attention import flex_attention

        flex_kernel.compiled = flex_attention  # unfused: see the module docstring
        report["flex_kernel"] = "unfused (flex_attention uncompiled)"
    start = time.perf_counter()
    try:
        for name, section in (
            ("equivalence", lambda: section_equivalence(cfg, device)),
            ("attention", lambda: section_attention(cfg, device, sync)),
            ("llama_1b", lambda: section_llama(cfg, device, sync)),
        ):
            began = time.perf_counter()
            report[name] = section()
            report["seconds"][name] = time.perf_counter() - began
            print(f"{name}: {report['seconds'][name]:.1f}s", flush=True)
    finally:
        flex_kernel.compiled = kernel
    report["seconds"]["total"] = time.perf_counter() - start
    failed = [r["what"] for r in report["equivalence"] if not r["passed"]]
    report["equivalence_passed"] = not failed
    report["equivalence_failed"] = failed
    return report


def summary(report: dict[str, Any]) -> list[str]:
    lines = [f"{report['device']}, torch {report['torch']}, {report['dtype']}, flex {report['flex_kernel']}"]
    for row in report["attention"]:
        flex, sdpa = row["flex"], row["sdpa"]
        lines.append(
            f"attention S={row['seq_len']} ({row['documents']} documents): flex {flex['tokens_s']:,.0f} "
            f"tokens/s, dense-mask sdpa {sdpa['tokens_s']:,.0f}: flex x{row['flex_speedup_wall']:.2f} "
            f"(wall); peak MiB flex {flex['peak_mib']}, sdpa {sdpa['peak_mib']}"
        )
    m = report["llama_1b"]
    lines.append(
        f"llama {m['parameters'] / 1e9:.2f} B, batch {m['batch'][0]} x {m['batch'][1]}: {m['tokens_s']:,.0f} "
        f"tokens/s, {m['tflops_s']:.1f} TFLOP/s, MFU {100 * m['mfu']:.1f}% of {m['peak_tflops']:.1f} "
        f"({m['peak_source']}); peak {m['peak_mib']} MiB above the weights and optimizer state, "
        f"{m['peak_total_mib']} MiB in all"
    )
    checks = report["equivalence"]
    worst = max((r["worst_ratio"] for r in checks if r["passed"]), default=0.0)
    lines.append(
        f"equivalence: {sum(r['passed'] for r in checks)} of {len(checks)} checks passed (worst difference "
        f"{worst:.2f} of the tolerance)" + "".join(f"\n  FAILED {w}" for w in report["equivalence_failed"])
    )
    lines.append(f"total {report['seconds']['total']:.0f}s")
    return lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_validation.json", help="the JSON report's path")
    parser.add_argument("--reduced", action="store_true", help="CPU, fp32, tiny shapes (seconds)")
    parser.add_argument("--device", help="default: cuda, or cpu with --reduced")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cpu" if args.reduced else "cuda"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here: run on a GPU, or --reduced for the CPU check")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.reduced:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32; bf16 is autocast's
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(summary(report)))
    print(f"report: {args.out}")
    return 0 if report["equivalence_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
