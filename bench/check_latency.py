"""Cold wall time of `forge-run check configs/quickstart.yaml` beside `import torch`.

Each measurement is a fresh interpreter; the two commands alternate so machine noise
hits both alike. Prints medians and the ratio (target: check under 1/3 of the import).

    python bench/check_latency.py [--runs 7] [--config C] [check arguments ...]

Arguments after the options go to ``forge-run check`` (``parallel.cp=2 --world-size 2``
judges a layout with context parallelism and its rules).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    args, extra = parser.parse_known_args()
    check = [sys.executable, "-m", "forge_core.cli", "check", args.config, *extra]
    torch_import = [sys.executable, "-c", "import torch"]
    wall(check), wall(torch_import)  # warm the OS file cache for both
    checks, imports = [], []
    for _ in range(args.runs):
        checks.append(wall(check))
        imports.append(wall(torch_import))
    c, t = statistics.median(checks), statistics.median(imports)
    print(
        f"forge-run check {' '.join([args.config, *extra])}: median {c * 1000:.0f} ms over {args.runs} runs"
    )
    print(f"python -c 'import torch':        median {t * 1000:.0f} ms over {args.runs} runs")
    print(f"ratio check / import torch: {c / t:.3f}  (target < 0.333)")


if __name__ == "__main__":
    main()
