"""Alternated timing for the benches: the sides of a comparison run in turns (A B A B ...,
or A B C A B C ...), so that the load of a shared machine falls on every side alike.

A round runs every side once; a ratio is the median over the rounds of the ratio within
each round (both sides of it saw about the same load), never a ratio of medians taken
at different moments. Every timing gives wall seconds (``time.perf_counter``) and CPU
seconds of this process (``time.process_time``): on a machine shared with other work the
CPU column is the one to read, wall time also measures the neighbours. ``sync`` (for
CUDA, ``torch.cuda.synchronize``) runs before a timing starts and before it stops, so
queued kernels are counted where they ran.

Two ways to give a side: a step to call (:func:`rounds` times ``steps`` calls of it in
this process), or a measurement that returns its own ``(wall, cpu)`` (:func:`measured`:
a fresh process per call, or a timing taken across several processes). A bench imports
this file as ``alternate`` (run as a script, ``bench/`` is on the path; loaded by file
path, the bench puts it there). :func:`status_kib` reads this process's memory figures
for the benches that measure peak memory beside time.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

#: ``{side: {"wall": [seconds per round], "cpu": [...]}}``, in the order sides ran.
Times = dict[str, dict[str, list[float]]]


def _noop() -> None:
    return None


def timed(step: Callable[[], Any], steps: int = 1, sync: Callable[[], Any] = _noop) -> tuple[float, float]:
    """Wall and CPU seconds of one call of ``step``, averaged over ``steps`` calls."""
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def measured(sides: dict[str, Callable[[], tuple[float, float]]], pairs: int) -> Times:
    """``pairs`` rounds of every side's own ``(wall, cpu)`` measurement, in turns."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs}")
    out: Times = {name: {"wall": [], "cpu": []} for name in sides}
    for _ in range(pairs):
        for name, measure in sides.items():
            wall, cpu = measure()
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def rounds(
    sides: dict[str, Callable[[], Any]],
    pairs: int,
    steps: int = 1,
    warmup: int = 1,
    sync: Callable[[], Any] = _noop,
) -> Times:
    """``warmup`` untimed calls of each side, then ``pairs`` rounds of ``steps`` timed
    calls of each side in turns (see :func:`timed`)."""
    for _ in range(warmup):
        for step in sides.values():
            step()
    return measured({name: lambda step=step: timed(step, steps, sync) for name, step in sides.items()}, pairs)


def ratio(times: Times, a: str, b: str, kind: str = "cpu") -> float:
    """Median over the rounds of ``a``'s time over ``b``'s (``kind``: ``wall`` or ``cpu``)."""
    return statistics.median(x / y for x, y in zip(times[a][kind], times[b][kind]))


def compare(name: str, times: Times, a: str, b: str, tokens: int) -> dict[str, Any]:
    """A table row for ``a`` against ``b``: each side's median wall and CPU seconds, the
    per-round ratios' medians, tokens/s over each side's median wall time."""
    median = statistics.median
    return {
        "comparison": name,
        "a_wall": median(times[a]["wall"]),
        "b_wall": median(times[b]["wall"]),
        "a_cpu": median(times[a]["cpu"]),
        "b_cpu": median(times[b]["cpu"]),
        "wall_ratio": ratio(times, a, b, "wall"),
        "cpu_ratio": ratio(times, a, b, "cpu"),
        "a_tokens_s": tokens / median(times[a]["wall"]),
        "b_tokens_s": tokens / median(times[b]["wall"]),
        "pairs": len(times[a]["wall"]),
    }


def table(rows: list[dict[str, Any]], first: str = "A vs B") -> str:
    """:func:`compare` rows as a fixed-width table (milliseconds, tokens/s)."""
    width = max([22, len(first) + 2] + [len(r["comparison"]) + 2 for r in rows])
    head = (
        f"{first:<{width}}{'A ms':>9}{'B ms':>9}{'A/B wall':>10}{'A CPU ms':>10}{'B CPU ms':>10}"
        f"{'A/B CPU':>9}{'A tok/s':>10}{'B tok/s':>10}{'pairs':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['comparison']:<{width}}{1e3 * r['a_wall']:>9.1f}{1e3 * r['b_wall']:>9.1f}"
            f"{r['wall_ratio']:>10.2f}{1e3 * r['a_cpu']:>10.1f}{1e3 * r['b_cpu']:>10.1f}"
            f"{r['cpu_ratio']:>9.2f}{r['a_tokens_s']:>10.0f}{r['b_tokens_s']:>10.0f}{r['pairs']:>7}"
        )
    return "\n".join(lines)


def load_line() -> str:
    """The load averages (1, 5, 15 minutes) and the core count, for a bench's header."""
    try:
        loads = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # not every platform has one
        loads = "unknown"
    return f"load average {loads} on {os.cpu_count()} cores"


def status_kib(field: str) -> int | None:
    """A figure of ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``, ``RssAnon``);
    ``None`` where there is no such file or field (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
