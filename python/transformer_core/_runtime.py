"""The compiled core's runtime, set up in one place: OpenBLAS's kernel choice (before the library
loads), the ``_core`` extension module itself, and the float32/float64 variant of a bound op or
class. Every other module imports ``_core`` through here, never directly."""

from __future__ import annotations

import os

import numpy as np


def _choose_openblas_kernels() -> None:
    """OpenBLAS 0.3.21 (Debian 12) predates AMD's AVX-512 cores (Zen 4/5) and gives them its AVX2
    "Haswell" kernels; its SkylakeX kernels are ~1.6x faster there. For a DYNAMIC_ARCH build the
    kernel set is chosen when the library loads, from ``OPENBLAS_CORETYPE``: set it to SkylakeX when
    the CPU has the AVX-512 subsets those kernels use, unless the user already chose."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags):
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


def _shorten_openmp_spin() -> None:
    """After a parallel region libgomp's idle threads spin, ``GOMP_SPINCOUNT`` turns of a wait loop
    (300,000 by default: milliseconds of a core), before they sleep. Any other thread that wants
    a core meanwhile loses it to them, and on 2 cores that is common: another program's busy
    thread (a browser, a second notebook), numpy's own OpenBLAS threads right after our call.
    Each region's end then waits for our thread that lost its core. Measured on an Emerald Rapids
    Xeon, 2 vCPUs (``bench/interference.py``, bench/README.md "A busy neighbour"), with another
    process's busy loop on one CPU: a training step of notebook 05's small GPT took 95-112 ms at
    100,000 turns against 22-23 ms at 1,000 (15 ms on one thread), a SmolLM2 decode step 50-91
    against 19.5 ms, a batch of 32 MiniLM sentences 183 against 94 ms; a one-sentence encode
    after a numpy matmul 7.1 against 5.8-6.0 ms, and the matmul after our call 7.1-7.2 against
    5.5-5.6 ms. Alone, 1,000 and 100,000 measured the same within the noise (decode 6.9-9.4 ms
    both, batch-1 1.7-2.0 ms, SDPA 25 ms): the regions of one call follow each other within the
    shorter spin too. (Beside a busy thread 3,000 and 30,000 fell between the two, and 10,000 was
    erratic: a one-sentence encode took 12.6 ms.)
    libgomp reads the variable once, when it loads: this runs before ``_core`` (which loads it) is
    imported. torch's wheel loads a libgomp of the same name: imported first, torch's load reads
    the variable without this setting, and libgomp's default then serves both libraries (import
    transformer_core first, or set the variable). A value the user set is kept."""
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")


_choose_openblas_kernels()  # before _core (and with it libopenblas) is loaded
_shorten_openmp_spin()  # before _core (and with it libgomp) is loaded

from . import _core  # noqa: E402

#: The compiled module (private): use the package's Python API.
core = _core


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def _mkl_library() -> str | None:
    """The path of MKL's single dynamic library (``libmkl_rt.so.*``) installed by pip's ``mkl``
    package in this environment, or None."""
    from importlib import metadata

    try:
        files = metadata.files("mkl") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.startswith("libmkl_rt.so"):
            path = f.locate()
            if os.path.exists(path):
                return os.path.realpath(path)
    return None


def _choose_blas() -> None:
    """Picks the BLAS of every matrix product, once, before any computation (kernels/blas.hpp).

    ``TC_BLAS=auto`` or ``openblas`` (the default): the linked OpenBLAS, on every CPU.
    ``TC_BLAS=mkl``: Intel MKL from pip's ``mkl`` package (sequential, CNR ``AUTO,STRICT``); its
    AVX-512 kernels ran our tile shapes up to 1.3x (2.4x for 7-row tiles) faster on an Intel Xeon
    (bench/README.md, "Which BLAS"), but it is opt-in: the MKL layers it loads serve torch's MKL
    symbols too, so a torch imported afterwards runs single-threaded (bench/README.md, "torch in the
    same process"). An MKL that cannot be loaded warns and keeps OpenBLAS. Results are bitwise the
    same for any thread count with either library; the two differ from each other in the last bits.
    """
    choice = os.environ.get("TC_BLAS", "auto").strip().lower() or "auto"
    if choice not in ("auto", "mkl", "openblas"):
        import warnings

        warnings.warn(f"TC_BLAS: expected 'auto', 'mkl' or 'openblas', got {choice!r}; using 'auto'",
                      RuntimeWarning, stacklevel=2)
        choice = "auto"
    if choice != "mkl":
        return
    path = _mkl_library()
    why = _core.use_mkl(path) if path else "pip's mkl package is not installed"
    if why:
        import warnings

        warnings.warn(f"TC_BLAS=mkl: {why}; using OpenBLAS", RuntimeWarning, stacklevel=2)


_choose_blas()


def dtype_suffix(dtype) -> str:
    """``"_f64"`` for float64, ``"_f32"`` for float32: the suffix of a bound op's or class's variant."""
    if dtype is np.float32 or dtype is np.float64:  # the usual arguments, without np.dtype's parsing
        return "_f64" if dtype is np.float64 else "_f32"
    return "_f64" if np.dtype(dtype) == np.float64 else "_f32"


_VARIANTS: dict = {}  # (name, dtype) -> the bound function or class: variant()'s lookups


def variant(name: str, dtype):
    """The bound function or class ``name`` for ``dtype`` (float32 or float64), e.g.
    ``variant("linear", np.float64)`` is ``_core.linear_f64``. Looked up once per ``(name,
    dtype)``: an optimizer step calls it per parameter, and the lookup (``np.dtype``'s parsing)
    took longer than the update of a small one."""
    key = (name, dtype)
    found = _VARIANTS.get(key)
    if found is None:
        found = _VARIANTS[key] = getattr(_core, name + dtype_suffix(dtype))
    return found
