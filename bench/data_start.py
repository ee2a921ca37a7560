"""Second start on the token cache: 4 M, 40 M and 4 B tokens, full hash against the manifest.

What a start costs before its first batch once the corpus is in the token cache: the
source's fingerprint and opening the entry (:func:`forge_core.data.cache.cached_shards`).
Two ways, each in its own fresh process, alternated (A B A B ...) so that the load of
the shared machine falls on both alike:

- **A, full hash** (what every start did before the file manifest): SHA-256 of every
  byte of every file, at every start;
- **B, manifest**: each file's device, inode, size and mtime checked against the
  cache's file manifest; nothing read.

Corpora (``text`` source, ``byte`` tokenizer, one token per byte), under ``--root``
(default ``/tmp/forge-data-start``): 4 M and 40 M tokens of random words in 1 MB files (10^6 bytes)
(documents split on newlines), tokenized into the cache once; and 4 B tokens as 1,000
sparse 4 MB files (no disk blocks), whose cache entry is written sparse by hand (its
tokens are never read here) under the key their fingerprint gives. Reported per corpus:
the median wall and CPU seconds of each way, and B/A. The load average is printed.

Run: ``python bench/data_start.py`` (about 2 minutes, most of it writing and tokenizing
the 40 M corpus once and hashing the 4 B one; ``--pairs 3``; ``--sizes 4e6,4e7`` skips the
largest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FILE_BYTES = 1_000_000
SPARSE_FILE_BYTES = 4_000_000

CHILD = """
import json, sys, time
from forge_core.data import fingerprint
from forge_core.data.cache import cached_shards
from forge_plugins.sources.options import TextOptions
from forge_plugins.sources.text import TextSource
from forge_plugins.tokenizers.byte import ByteTokenizer

corpus, cache, way = sys.argv[1:4]
if way == "full":  # every byte hashed at every start: the source's own fingerprint()
    fingerprint.file_set = lambda source: None
source = TextSource(TextOptions(paths=[corpus + "/*.txt"], separator="\\n"))
tokenizer = ByteTokenizer()
w, c = time.perf_counter(), time.process_time()
shards, note = cached_shards(source, tokenizer, root=cache, wait_s=60, label="bench", progress=False)
out = {"wall": time.perf_counter() - w, "cpu": time.process_time() - c, "tokens": shards.num_tokens,
       "note": note}
print(json.dumps(out))
"""


def _child(corpus: Path, cache: Path, way: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus), str(cache), way],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"{way} on {corpus} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _age(path: Path) -> None:
    """Times an hour back: a manifest record of the file is then trusted (not racy)."""
    ns = (int(os.stat(path).st_mtime) - 3600) * 10**9
    os.utime(path, ns=(ns, ns))


def text_corpus(directory: Path, tokens: int) -> None:
    if (directory / "done").is_file():
        return
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz    \n", dtype=np.uint8)
    for i in range(max(1, tokens // FILE_BYTES)):
        body = letters[rng.integers(0, len(letters), FILE_BYTES)]
        body[0] = ord("x")
        path = directory / f"part-{i:05d}.txt"
        path.write_bytes(body.tobytes())
        _age(path)
    (directory / "done").touch()


def sparse_corpus(directory: Path, cache: Path, tokens: int) -> None:
    """Sparse files and a sparse cache entry for them (one document per file: a sparse
    file has no newline); the fingerprint is computed once through the manifest."""
    from forge_core.data.cache import cache_key
    from forge_core.data.fingerprint import source_fingerprint
    from forge_core.data.shards import ShardWriter
    from forge_plugins.sources.options import TextOptions
    from forge_plugins.sources.text import TextSource
    from forge_plugins.tokenizers.byte import ByteTokenizer

    if (directory / "done").is_file():
        return
    directory.mkdir(parents=True, exist_ok=True)
    n = tokens // SPARSE_FILE_BYTES
    for i in range(n):
        path = directory / f"part-{i:05d}.txt"
        with open(path, "wb") as f:
            f.truncate(SPARSE_FILE_BYTES)
        _age(path)
    source = TextSource(TextOptions(paths=[str(directory / "*.txt")], separator="\n"))
    tokenizer = ByteTokenizer()
    fp = source_fingerprint(source, cache)  # hashes the 4 GB once, records the manifest
    key = cache_key(fp, tokenizer.identity)
    info = {k: getattr(tokenizer, k) for k in ("identity", "vocab_size", "eos_id", "pad_id")}
    writer = ShardWriter(cache / key, info, tmp=cache / f"{key}.partial-bench")
    # The entry tokenizing would write, without writing its 8 GB: a sparse tokens file.
    writer._tokens.truncate(n * SPARSE_FILE_BYTES * writer.dtype.itemsize)
    writer._lengths = [SPARSE_FILE_BYTES] * n
    writer._hashes = [np.arange(n, dtype="<u8")]
    writer.num_tokens = n * SPARSE_FILE_BYTES
    writer.commit(source.describe(), extra={"cache": {"key": key, "fingerprint": fp}})
    (directory / "done").touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/forge-data-start")
    parser.add_argument("--sizes", default="4e6,4e7,4e9")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    root = Path(args.root)
    cache = root / "cache"
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    corpora = {}
    for size in sizes:
        corpus = root / f"corpus-{size:.0e}"
        if size > 10**9:
            sparse_corpus(corpus, cache, size)
        else:
            text_corpus(corpus, size)
            _child(corpus, cache, "manifest")  # the first start: tokenize, record the manifest
        corpora[size] = corpus
    results: dict = {size: {"full": [], "manifest": []} for size in sizes}
    for _ in range(args.pairs):
        for size in sizes:
            for way in ("full", "manifest"):
                out = _child(corpora[size], cache, way)
                assert out["note"].startswith("cached at"), out["note"]
                results[size][way].append(out)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.pairs} A B pairs, medians")
    print(f"{'corpus':>14}  {'A full hash wall / cpu':>24}  {'B manifest wall / cpu':>23}  B/A cpu")
    for size in sizes:
        a, b = results[size]["full"], results[size]["manifest"]
        aw, ac = statistics.median(r["wall"] for r in a), statistics.median(r["cpu"] for r in a)
        bw, bc = statistics.median(r["wall"] for r in b), statistics.median(r["cpu"] for r in b)
        tokens = a[0]["tokens"]
        print(f"{tokens:>14,}  {aw:>10.3f} s / {ac:>7.3f} s  {bw:>9.3f} s / {bc:>7.3f} s  {bc / ac:7.3f}")


if __name__ == "__main__":
    main()
