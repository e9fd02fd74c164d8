"""Corpus embedding throughput: one process vs a local Dask cluster of 1 and 2 workers.

Usage::

    .venv/bin/python bench/distributed.py                       # 2,000 sentences, all-MiniLM-L6-v2
    .venv/bin/python bench/distributed.py --sentences 500 --workers 1,2,4 --chunk-size 100

Each run embeds the same sentences (``bench/sentences.txt`` and pairs of them, as ``bench/run.py``'s
MiniLM case) into a fresh ``.parquet`` output and reports:

* ``wall s``: the whole call (for the clusters: starting them, loading the model in every worker);
* ``sentences/s``: the steady rate, without the start-up: with W workers (1 for the single-process
  rows) the first W chunks run at once and complete about together, so the rate counts from the W-th
  completion to the last, ``(sentences of completions W+1 … last) / (t_last - t_W)``, which is
  ``(N - W · chunk) / (t_last - t_W)`` when those first W chunks are whole (:class:`Timer`);
* ``vs 1 worker``: that rate over the 1-worker cluster's.

The single-process rows run ``corpus.embed_file`` in this process with 1 and with all cores' C++
threads; the cluster rows run ``distributed.embed_corpus`` with single-threaded workers (one C++
thread each), so 2 workers use 2 cores. The machine, load average and versions head the table:
on a busy machine the figures are noise.

Needs the ``distributed`` extra (``dask[distributed]`` and ``pyarrow``): without it the script
stops before anything runs, with argparse's usage error naming ``pip install
'transformer_core[distributed]'``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import transformer_core as tc
from transformer_core import corpus

BENCH_DIR = Path(__file__).resolve().parent
MAX_WORKERS = 1024  # transformer_core.distributed.MAX_WORKERS (importing that module needs dask)
# This script is named distributed.py: with its folder on sys.path, `import distributed` (Dask's,
# in the workers too) would find the script. Its folder goes; run.py is loaded by path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]


def _bench_run():
    """bench/run.py, loaded by path once."""
    if "bench_run" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_run", BENCH_DIR / "run.py")
        module = sys.modules["bench_run"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["bench_run"]


def load_sentences(n: int) -> list[str]:
    """bench/run.py's MiniLM sentences (the base list, then pairs of them)."""
    return _bench_run().load_sentences(n)


class Timer:
    """Records when each chunk completes (the ``on_chunk`` callback: the chunk's index) and computes
    the steady rate of ``workers`` workers on ``n`` sentences cut into chunks of ``chunk_size``."""

    def __init__(self, chunk_size: int, n: int, workers: int = 1):
        self.chunk_size, self.n, self.workers = chunk_size, n, workers
        self.times: list[float] = []
        self.sizes: list[int] = []  # sentences of each completed chunk, in completion order

    def __call__(self, index: int, done: int) -> None:
        self.times.append(time.perf_counter())
        # chunk i holds sentences [i * chunk_size, (i + 1) * chunk_size), the last one fewer
        self.sizes.append(min(self.chunk_size, self.n - index * self.chunk_size))

    def rate(self) -> float:
        """Sentences/s after the start-up: ``sum(sizes[W:]) / (t[-1] - t[W - 1])``, W = ``workers``.

        The W workers start their first chunks together, so the first W completions come about
        together, after the start-up; the chunks completed after the W-th were computed between it and
        the last completion. With whole first chunks that is ``(n - W · chunk_size) / (t[-1] - t[W - 1])``.
        (Counting from the first completion would put W - 1 start-up chunks into the steady window:
        up to W - 1 chunks too many.) NaN when no chunk completed after the W-th."""
        w = self.workers
        if len(self.times) <= w:
            return float("nan")
        return sum(self.sizes[w:]) / (self.times[-1] - self.times[w - 1])


def run_single(path: Path, out: Path, threads: int, chunk_size: int, model: str) -> tuple[float, float]:
    """embed_file in this process; the per-chunk times come from wrapping the writer's commit."""
    tc.set_num_threads(threads)
    timer = Timer(chunk_size, sum(1 for _ in open(path)), workers=1)
    original = corpus.EmbedJob.commit

    def commit(self, index, **extra):
        original(self, index, **extra)
        timer(index, len(self.completed))

    corpus.EmbedJob.commit = commit
    try:
        t0 = time.perf_counter()
        corpus.embed_file(path, out, model=model, chunk_size=chunk_size)
        return time.perf_counter() - t0, timer.rate()
    finally:
        corpus.EmbedJob.commit = original


def run_cluster(path: Path, out: Path, workers: int, chunk_size: int, model: str) -> tuple[float, float]:
    from transformer_core.distributed import embed_corpus

    timer = Timer(chunk_size, sum(1 for _ in open(path)), workers=workers)
    t0 = time.perf_counter()
    embed_corpus(path, out, model=model, workers=workers, threads_per_worker=1, chunk_size=chunk_size,
                 on_chunk=timer)
    return time.perf_counter() - t0, timer.rate()


# The modules of the `distributed` extra (pyproject.toml) that the runs import.
EXTRA_MODULES = ("dask", "distributed", "pyarrow")


def missing_extras() -> list[str]:
    """The modules of :data:`EXTRA_MODULES` that cannot be imported: not installed
    (``importlib.util.find_spec`` finds none) or failing to import; "name (the error)" for the latter."""
    missing = []
    for name in EXTRA_MODULES:
        if importlib.util.find_spec(name) is None:
            missing.append(name)
            continue
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing.append(f"{name} ({e})")
    return missing


def model_name(text: str) -> str:
    """An argparse ``type`` for ``--model``: an embedded model's name or a model directory, as
    ``transformer_core.hub.resolve_model_dir`` takes them; a name or path that resolves to a file (a
    GGUF checkpoint: no sentence encoder) is refused here, with argparse's usage error naming
    ``--model``, before any cluster starts."""
    from transformer_core.hub import resolve_model_dir

    try:
        resolve_model_dir(text, argument="--model")
    except (FileNotFoundError, ValueError) as e:
        # argparse puts "argument --model: " in front: the message's own "--model: " would repeat it
        raise argparse.ArgumentTypeError(str(e).removeprefix("--model: ")) from None
    return text


def main(argv=None) -> int:
    run = _bench_run()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=run.sentence_count, default=2000,
                   help=f"sentences to embed, 1 to {run.max_sentences()} (default 2000)")
    p.add_argument("--chunk-size", type=run.int_in(1), default=100, help="sentences per chunk (default 100)")
    p.add_argument("--workers", type=run.int_list(1, MAX_WORKERS), default=[1, 2],
                   help=f"cluster sizes, comma-separated, 1 to {MAX_WORKERS} (default 1,2)")
    p.add_argument("--model", type=model_name, default="all-MiniLM-L6-v2",
                   help="an embedded model's name or a model directory (default all-MiniLM-L6-v2)")
    p.add_argument("--no-single", action="store_true", help="skip the single-process rows")
    args = p.parse_args(argv)
    missing = missing_extras()
    if missing:  # before any run: a missing module would otherwise end the script after the single-process rows
        p.error(f"needs dask[distributed] and pyarrow, not importable: {', '.join(missing)}; "
                "pip install 'transformer_core[distributed]'")
    sizes = args.workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "corpus.txt"
        path.write_text("\n".join(load_sentences(args.sentences)) + "\n", encoding="utf-8")
        if not args.no_single:
            for threads in sorted({1, cores}):
                wall, rate = run_single(path, Path(d) / f"single{threads}.parquet", threads, args.chunk_size,
                                        args.model)
                rows.append((f"one process, {threads} thread{'s' if threads > 1 else ''}", wall, rate))
        for w in sizes:
            wall, rate = run_cluster(path, Path(d) / f"cluster{w}.parquet", w, args.chunk_size, args.model)
            rows.append((f"Dask, {w} worker{'s' if w > 1 else ''} x 1 thread", wall, rate))
        # The outputs agree (the same chunks, whoever computed them).
        import pyarrow.parquet as pq

        outs = sorted(Path(d).glob("*.parquet"))
        embs = [pq.read_table(o).sort_by("id").column("embedding").combine_chunks().flatten().to_numpy()
                for o in outs]
        max_diff = max(float(np.abs(e - embs[0]).max()) for e in embs)

    base = next((r for _, _, r in [(n, w, r) for n, w, r in rows if n.startswith("Dask, 1 worker ")]), None)
    print(f"# corpus embedding: {args.sentences} sentences, chunks of {args.chunk_size}, {args.model}")
    print(f"# {run.cpu_name()}, {cores} cores, {run.cpu_isa()}, load average {os.getloadavg()[0]:.2f} at the end; "
          f"transformer_core {tc.__version__}, Python {platform.python_version()}")
    print(f"# outputs agree: max |difference| between runs {max_diff:.2e}")
    print(f"| {'run':<30} | {'wall s':>7} | {'sentences/s':>11} | {'vs 1 worker':>11} |")
    print(f"|{'-' * 32}|{'-' * 9}|{'-' * 13}|{'-' * 13}|")
    for name, wall, rate in rows:
        rel = f"{rate / base:.2f}x" if base and name.startswith("Dask") else ""
        print(f"| {name:<30} | {wall:7.1f} | {rate:11.1f} | {rel:>11} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
