"""Single-threaded sgemm of the GEMM libraries a pip/apt install can reach, on transformer_core's own
shapes, each library in its own process.

Usage::

    .venv/bin/python bench/blas.py                      # every library found, 3 rounds
    .venv/bin/python bench/blas.py --libs mkl,openblas-debian --rounds 5 --quiet-load 1.5

Why single-threaded: every GEMM of ours runs on one thread inside our own parallel region (fixed
tiles, so results do not depend on the thread count), so the library's one-thread rate on the
shapes we give it is what counts. The "2 threads" column runs the same call on two Python threads
at once (ctypes releases the GIL), one GEMM each, as our two-thread regions do: it shows what the
two cores keep of their one-thread rate when they run together.

Shapes (row-major, C[m, n] = A[m, k] · B[n, k]ᵀ as our linear layer calls it):

* the linear layer's tiles (kernels/linear.hpp: 64 rows × up to 512 output features) for
  all-MiniLM-L6-v2 (d_model 384, FFN 1536): k = 384 and k = 1536;
* whole products of a MiniLM batch (7 … 1024 rows × 384/1152/1536);
* the attention tile products of kernels/flash_attention.hpp (128 query rows × 256 keys, head
  dimension 64; MiniLM's head dimension 32 at short lengths);
* 2048³ (the machine's peak).

Each library runs in a fresh interpreter (``--worker NAME``) with its threading off; rounds
alternate the libraries (A, B, C, A, B, C, ...) and the best round of each shape is kept. Before
each worker the script waits (sleeping, not spinning) until the 1-minute load average is below
``--quiet-load``, up to ``--max-wait`` seconds, and records the load it ran under. Whatever
``--quiet-load`` is, a run whose load went above the number of CPUs + 0.5 counts as busy (as in
``bench/run.py``): its one-thread rates are then taken by the thread's CPU time.

The table (GFLOP/s) goes to stdout and ``bench/results/blas.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from run import cpu_isa, cpu_name, float_in, int_in, int_list, machine_busy, name_list  # noqa: E402

VENV_LIB = Path(sys.prefix) / "lib"
SITE = Path(np.__file__).resolve().parent.parent

# (label, m, n, k, trans_b): C[m, n] = A[m, k] · op(B), B [n, k] when trans_b else [k, n]
SHAPES = [
    ("tile 64×512×384 (QKV, FFN1)", 64, 512, 384, True),
    ("tile 64×384×384 (out-proj)", 64, 384, 384, True),
    ("tile 64×384×1536 (FFN2)", 64, 384, 1536, True),
    ("tile 7×384×384 (one sentence)", 7, 384, 384, True),
    ("tile 32×512×384", 32, 512, 384, True),
    ("batch 1024×1152×384 (QKV)", 1024, 1152, 384, True),
    ("batch 1024×1536×384 (FFN1)", 1024, 1536, 384, True),
    ("batch 1024×384×1536 (FFN2)", 1024, 384, 1536, True),
    ("batch 256×384×384", 256, 384, 384, True),
    ("attn QKᵀ 128×256×64", 128, 256, 64, True),
    ("attn PV 128×64×256", 128, 64, 256, False),
    ("attn QKᵀ 40×40×32 (MiniLM)", 40, 40, 32, True),
    ("attn PV 40×32×40 (MiniLM)", 40, 32, 40, False),
    ("2048³", 2048, 2048, 2048, True),
]


def _lib_dirs() -> dict[str, Path]:
    return {"venv": VENV_LIB, "site": SITE}


_DEBIAN_LIB = Path(f"/usr/lib/{platform.machine()}-linux-gnu")  # Debian's multiarch folder
_DEBIAN_OPENBLAS = str(_DEBIAN_LIB / "openblas-openmp" / "libopenblas.so.0")
_SCIPY_OPENBLAS = str(SITE / "scipy_openblas32" / "lib" / "libscipy_openblas.so")
_MKL = str(VENV_LIB / "libmkl_rt.so.3")


def _find_blis() -> str:
    """Debian's BLIS (``apt install libblis4-serial``; its OpenMP and pthreads builds also do: the
    worker sets one thread), else the libblis the dynamic loader finds (``ctypes.util.find_library``:
    a soname such as "libblis.so.4"), else the serial build's path, which :func:`missing` then
    reports as not found."""
    for variant in ("blis-serial", "blis-openmp", "blis-pthread"):
        path = _DEBIAN_LIB / variant / "libblis.so.4"
        if path.exists():
            return str(path)
    return ctypes.util.find_library("blis") or str(_DEBIAN_LIB / "blis-serial" / "libblis.so.4")


LIBRARIES = {
    # name: (path, cblas symbol, setup) -- setup runs in the worker before timing
    "openblas-debian": (_DEBIAN_OPENBLAS, "cblas_sgemm", "openblas"),
    "openblas-0.3.34": (_SCIPY_OPENBLAS, "scipy_cblas_sgemm", "scipy_openblas"),
    "mkl": (_MKL, "cblas_sgemm", "mkl"),
    "mkl-cnr": (_MKL, "cblas_sgemm", "mkl"),
    # The AVX2 code paths, as AMD CPUs get them from MKL (and from OpenBLAS 0.3.21 on Zen 4/5).
    "mkl-avx2": (_MKL, "cblas_sgemm", "mkl"),
    "openblas-debian-avx2": (_DEBIAN_OPENBLAS, "cblas_sgemm", "openblas"),
    "openblas-0.3.34-avx2": (_SCIPY_OPENBLAS, "scipy_cblas_sgemm", "scipy_openblas"),
    "blis": (_find_blis(), "cblas_sgemm", "blis"),
    "onednn": (str(VENV_LIB / "libdnnl.so.3"), "dnnl_sgemm", "onednn"),
    "torch": ("", "", "torch"),
}


# --------------------------------------------------------------------------------------------
# Worker: one library, in its own process
# --------------------------------------------------------------------------------------------

# Environment of each variant (the kernels a library picks when it loads).
VARIANT_ENV = {
    "openblas-debian": {"OPENBLAS_CORETYPE": "SkylakeX"},
    "openblas-0.3.34": {},
    "mkl-cnr": {"MKL_CBWR": "AUTO,STRICT"},
    "mkl-avx2": {"MKL_CBWR": "AVX2"},
    "openblas-debian-avx2": {"OPENBLAS_CORETYPE": "Haswell"},
    "openblas-0.3.34-avx2": {"OPENBLAS_CORETYPE": "Haswell"},
}


def _env_for(name: str) -> dict[str, str]:
    setup = LIBRARIES[name][2]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               BLIS_NUM_THREADS="1", DNNL_VERBOSE="0")
    for var in ("OPENBLAS_CORETYPE", "MKL_CBWR"):
        env.pop(var, None)
    env.update(VARIANT_ENV.get(name, {}))
    if setup == "mkl":
        env.update(MKL_THREADING_LAYER="SEQUENTIAL", MKL_INTERFACE_LAYER="LP64")
    if setup == "onednn":
        env["LD_LIBRARY_PATH"] = f"{VENV_LIB}:{env.get('LD_LIBRARY_PATH', '')}"
    return env


def _sgemm_fn(name: str):
    """A callable (ta, tb, m, n, k, a, lda, b, ldb, c, ldc) for library ``name``, and a description."""
    path, symbol, setup = LIBRARIES[name]
    if setup == "torch":
        import torch

        torch.set_num_threads(1)

        def call(tb, m, n, k, a, b, c):
            ta, tbb, tc = (torch.from_numpy(x) for x in (a, b, c))
            torch.mm(ta, tbb.t() if tb else tbb, out=tc)
        return call, f"torch {torch.__version__} (torch.mm, 1 thread)"
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    desc = Path(path).name
    if setup == "openblas":
        lib.openblas_set_num_threads(1)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        desc += f" [{lib.openblas_get_config().decode()}; core {lib.openblas_get_corename().decode()}]"
    elif setup == "scipy_openblas":
        lib.scipy_openblas_set_num_threads(1)
        lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
        lib.scipy_openblas_get_config.restype = ctypes.c_char_p
        desc += f" [{lib.scipy_openblas_get_config().decode()}; core {lib.scipy_openblas_get_corename().decode()}]"
    elif setup == "mkl":
        buf = ctypes.create_string_buffer(256)
        lib.mkl_get_version_string(buf, 256)
        mode = os.environ.get("MKL_CBWR", "")
        desc += f" [{buf.value.decode().strip()}; sequential; MKL_CBWR={mode or 'unset'}]"
    elif setup == "blis":
        lib.bli_thread_set_num_threads(ctypes.c_long(1))
        version = getattr(lib, "bli_info_get_version_str", None)
        if version is not None:
            version.restype = ctypes.c_char_p
        desc += f" [BLIS {version().decode() if version else '?'}, 1 thread]"
    elif setup == "onednn":
        desc += " [dnnl_sgemm]"
    fn = getattr(lib, symbol)
    P = ctypes.c_void_p
    if setup == "onednn":
        fn.argtypes = [ctypes.c_char, ctypes.c_char, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, P,
                       ctypes.c_int64, P, ctypes.c_int64, ctypes.c_float, P, ctypes.c_int64]

        def call(tb, m, n, k, a, b, c):
            fn(b"N", b"T" if tb else b"N", m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, k if tb else n, 0.0,
               c.ctypes.data, n)
        return call, desc
    I = ctypes.c_int  # noqa: E741
    fn.argtypes = [I, I, I, I, I, I, ctypes.c_float, P, I, P, I, ctypes.c_float, P, I]
    row_major, no_trans, trans = 101, 111, 112

    def call(tb, m, n, k, a, b, c):
        fn(row_major, no_trans, trans if tb else no_trans, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data,
           k if tb else n, 0.0, c.ctypes.data, n)
    return call, desc


def _time_shape(call, m, n, k, tb, threads: int, min_s: float = 0.15) -> tuple[float, float | None]:
    """GFLOP/s of ``threads`` concurrent calls (each its own arrays), the median of 5 batches, by
    the wall clock and (one thread) by the thread's CPU time: on a busy machine the CPU-time rate
    still measures the library (less the cache lost to other processes); the wall-clock rate does
    not."""
    rng = np.random.default_rng(0)
    sets = []
    for _ in range(threads):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        sets.append((a, b, np.empty((m, n), dtype=np.float32)))
    for a, b, c in sets:
        call(tb, m, n, k, a, b, c)
    t0 = time.perf_counter()
    call(tb, m, n, k, *sets[0])
    once = max(time.perf_counter() - t0, 1e-6)
    reps = max(1, int(min_s / 5 / once))

    def loop(i):
        a, b, c = sets[i]
        for _ in range(reps):
            call(tb, m, n, k, a, b, c)

    rates, cpu_rates = [], []
    for _ in range(5):
        if threads == 1:
            t0, c0 = time.perf_counter(), time.thread_time()
            loop(0)
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            cpu_rates.append(reps * 2.0 * m * n * k / max(dc, 1e-9) / 1e9)
        else:
            ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt = time.perf_counter() - t0
        rates.append(threads * reps * 2.0 * m * n * k / dt / 1e9)
    if cpu_rates:
        return statistics.median(rates), statistics.median(cpu_rates)
    return statistics.median(rates), None


def _check(call) -> float:
    """Largest relative error of one product against float64 numpy (a wrong binding shows)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 53), dtype=np.float32)
    b = rng.standard_normal((29, 53), dtype=np.float32)
    c = np.empty((37, 29), dtype=np.float32)
    call(True, 37, 29, 53, a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    return float(np.max(np.abs(c - ref)) / np.max(np.abs(ref)))


def run_worker(name: str, shapes: list[int], two_threads: bool) -> None:
    call, desc = _sgemm_fn(name)
    out = {"desc": desc, "err": _check(call), "load": os.getloadavg()[0], "one": {}, "cpu": {}, "two": {}}
    for i in shapes:
        _, m, n, k, tb = SHAPES[i]
        out["one"][i], out["cpu"][i] = _time_shape(call, m, n, k, tb, 1)
        if two_threads and m * n * k < 2048 ** 3:
            out["two"][i] = _time_shape(call, m, n, k, tb, 2)[0]
    out["load_end"] = os.getloadavg()[0]
    print(json.dumps(out))


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

def wait_quiet(limit: float, max_wait: float) -> float:
    """Sleeps until the 1-minute load average is below ``limit`` (at most ``max_wait`` s); returns it."""
    deadline = time.time() + max_wait
    while os.getloadavg()[0] >= limit and time.time() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def missing(name: str) -> str | None:
    """Why library ``name`` cannot run here ("<path> not found", "torch not installed"), or None."""
    path, _, setup = LIBRARIES[name]
    if setup == "torch":
        import importlib.util

        return None if importlib.util.find_spec("torch") is not None else "torch not installed"
    if "/" not in path:  # a soname from ctypes.util.find_library: the loader resolves it
        return None
    return None if Path(path).exists() else f"{path} not found"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--libs", type=name_list(list(LIBRARIES)), default=list(LIBRARIES),
                   help=f"comma-separated libraries (default all): {', '.join(LIBRARIES)}")
    p.add_argument("--rounds", type=int_in(1), default=3)
    p.add_argument("--quiet-load", type=float_in(0, above=True), default=1.5,
                   help="wait for a 1-min load average below this")
    p.add_argument("--max-wait", type=float_in(0), default=1800, help="seconds to wait for a quiet machine, per worker")
    p.add_argument("--shapes", type=int_list(0, len(SHAPES) - 1), default=None,
                   help=f"comma-separated shape indices, 0 to {len(SHAPES) - 1} (default: all)")
    p.add_argument("--no-two", action="store_true", help="skip the two-thread column")
    p.add_argument("--worker", choices=list(LIBRARIES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shapes = args.shapes if args.shapes is not None else list(range(len(SHAPES)))
    if args.worker:
        run_worker(args.worker, shapes, not args.no_two)
        return 0
    libs, absent = [], {}
    for name in args.libs:
        why = missing(name)
        if why:
            absent[name] = why
            print(f"{name}: n/a ({why})", file=sys.stderr)
        else:
            libs.append(name)
    results: dict[str, list[dict]] = {n: [] for n in libs}
    for r in range(args.rounds):
        for name in libs:
            load = wait_quiet(args.quiet_load, args.max_wait)
            cmd = [sys.executable, __file__, "--worker", name, "--shapes", ",".join(map(str, shapes))]
            if args.no_two:
                cmd.append("--no-two")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_env_for(name))
            if proc.returncode != 0:
                print(f"{name}: failed: {proc.stderr.strip()[-400:]}", file=sys.stderr)
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res["load_start"] = load
            results[name].append(res)
            print(f"round {r + 1} {name}: load {load:.2f} -> {res['load_end']:.2f}", file=sys.stderr, flush=True)
    out = BENCH_DIR / "results" / "blas.md"
    if not any(results.values()):  # an empty table must not replace the last one
        print(f"no library ran: nothing measured, {out.relative_to(BENCH_DIR.parent)} left as it was",
              file=sys.stderr)
        return 1
    lines = table(results, shapes, absent)
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


def table(results: dict[str, list[dict]], shapes: list[int], absent: dict[str, str]) -> list[str]:
    """The Markdown report: a line per library (``absent``'s as "name: n/a (why)"), then the table.
    The machine was busy when a worker's load, at its start or end, was above the number of CPUs +
    0.5 (:func:`run.machine_busy`): the one-thread rates are then the CPU-time ones."""
    names = [n for n in results if results[n]]
    cpu = f"{cpu_name()}, {cpu_isa()}"
    busy = any(machine_busy(x["load_start"], x["load_end"]) for r in results.values() for x in r)
    basis = "thread CPU time (the machine was busy)" if busy else "wall clock (quiet machine)"
    lines = [f"# sgemm GFLOP/s, one thread (two threads at once in brackets), best of rounds: {cpu}", "",
             f"- one-thread rates by {basis}; two-thread rates by the wall clock" +
             (" (NOT reliable: busy)" if busy else ""), ""]
    for n in names:
        r = results[n]
        loads = [x["load_start"] for x in r] + [x["load_end"] for x in r]
        lines.append(f"- {n}: {r[0]['desc']}; max rel. err {r[0]['err']:.1e}; {len(r)} rounds, "
                     f"load {min(loads):.2f}–{max(loads):.2f}")
    lines += [f"- {n}: n/a ({why})" for n, why in absent.items()]
    lines += [f"- {n}: n/a (every worker failed)" for n in results if not results[n]]
    lines += ["", "| shape | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in shapes:
        cells = []
        for n in names:
            one = max(x["cpu" if busy else "one"][str(i)] for x in results[n])
            twos = [x["two"].get(str(i)) for x in results[n] if x["two"].get(str(i))]
            cells.append(f"{one:.0f}" + (f" ({max(twos):.0f})" if twos else ""))
        lines.append(f"| {SHAPES[i][0]} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
