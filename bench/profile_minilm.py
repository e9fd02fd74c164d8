"""Where the time of all-MiniLM-L6-v2's ``SentenceEncoder.encode`` goes: a per-op profile.

Usage::

    .venv/bin/python bench/profile_minilm.py                 # 1,000 sentences, batch 32, 2 threads
    .venv/bin/python bench/profile_minilm.py --sentences 1 --batch 1 --repeats 200   # one sentence

How: the encode is cut into its stages, each timed on the same batches as ``encode`` makes
them (sorted by length, batch 32):

* tokenization (``Tokenizer.encode_batch``); mean pooling, the rows put back in the order given
  and the L2 normalisation, as ``encode`` does them (Python, numpy);
* the model's forward (``BertModel.forward``, one C++ call per batch);
* inside the forward, each op replayed alone through ``transformer_core.functional`` on the
  shapes that batch gives it (packed rows = real tokens only; attention over each sentence's own
  rows of one packed qkv array, ``functional.varlen_attention``, as the layer runs it): the QKV /
  out-proj / FFN linear products, attention, the two residual + LayerNorms. FFN1 is replayed with
  its GELU fused into the product's tiles, as the layer runs it: the compiled ``linear_f32`` call
  that ``functional.linear`` makes, given the activation (``functional.linear`` takes none). GELU
  alone is also timed, to show its share, and left out of the sum (FFN1's row holds it). The
  replayed ops pay a Python call each (~5-20 µs) which the C++ forward does not; the difference
  between the forward and the sum of its replayed ops is "glue" (embeddings, packing/scatter
  copies, workspace, masks) minus that Python overhead.

The script waits for a quiet machine (1-minute load below ``--quiet-load``) before it times, and
prints the load it ran under, marked BUSY when it was above the number of CPUs + 0.5 (as in
``bench/run.py``), whatever ``--quiet-load`` is. Times are the median of ``--repeats`` passes over
all the batches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (  # noqa: E402
    MAX_THREADS,
    cpu_isa,
    cpu_name,
    float_in,
    int_in,
    load_sentences,
    machine_busy,
    max_sentences,
    sentence_count,
)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=sentence_count, default=1000,
                   help=f"sentences (1: one short sentence), 1 to {max_sentences()} (default 1000)")
    p.add_argument("--batch", type=int_in(1), default=32, help="batch size (default 32)")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), default=2, help=f"1 to {MAX_THREADS} (default 2)")
    p.add_argument("--repeats", type=int_in(1), default=5, help="timed passes of each stage (default 5)")
    p.add_argument("--quiet-load", type=float_in(0, above=True), default=1.5,
                   help="wait for a 1-minute load average below this (default 1.5)")
    p.add_argument("--max-wait", type=float_in(0), default=1800, help="seconds to wait for it (default 1800)")
    args = p.parse_args(argv)

    import transformer_core as tc
    from transformer_core import functional as F

    tc.set_num_threads(args.threads)
    enc = tc.SentenceEncoder.from_pretrained("all-MiniLM-L6-v2")
    model, tok = enc.model, enc.tokenizer
    cfg = model.config
    sd = model.state_dict()
    H, heads = cfg.hidden_size, cfg.num_attention_heads
    D = H // heads
    if args.sentences == 1:
        sentences = ["A man is playing a guitar."]
    else:
        sentences = load_sentences(args.sentences)
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    batches = [[sentences[i] for i in order[s:s + args.batch]] for s in range(0, len(sentences), args.batch)]
    encoded = [tok.encode_batch(b) for b in batches]

    # The weights of one layer (all six have the same shapes; layer 0's are used for every layer).
    pre = "encoder.layer.0."
    w_qkv = np.concatenate([sd[pre + f"attention.self.{n}.weight"] for n in ("query", "key", "value")])
    b_qkv = np.concatenate([sd[pre + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
    w_o, b_o = sd[pre + "attention.output.dense.weight"], sd[pre + "attention.output.dense.bias"]
    w_1, b_1 = sd[pre + "intermediate.dense.weight"], sd[pre + "intermediate.dense.bias"]
    w_2, b_2 = sd[pre + "output.dense.weight"], sd[pre + "output.dense.bias"]
    ln_w, ln_b = sd[pre + "output.LayerNorm.weight"], sd[pre + "output.LayerNorm.bias"]
    rng = np.random.default_rng(0)

    per_batch = []
    for e in encoded:
        mask = e["attention_mask"].astype(bool)
        N, L = mask.shape
        T = int(mask.sum())
        x = rng.standard_normal((T, H), dtype=np.float32)
        x_f = rng.standard_normal((T, 4 * H), dtype=np.float32)
        qkv = rng.standard_normal((T, 3 * H), dtype=np.float32)  # the layer's packed projections
        q, k, v = (qkv[:, i * H:(i + 1) * H].reshape(T, heads, D) for i in range(3))
        cu = np.concatenate([[0], np.cumsum(mask.sum(axis=1))]).astype(np.int64)
        per_batch.append(dict(mask=mask, N=N, L=L, T=T, x=x, x_f=x_f, q=q, k=k, v=v, cu=cu))

    layers = cfg.num_hidden_layers
    ops = {
        "QKV linear (T×384 → 1152)": lambda b: F.linear(b["x"], w_qkv, b_qkv),
        "attention over each sentence's tokens (T, 12, 32)": lambda b: F.varlen_attention(
            b["q"], b["k"], b["v"], b["cu"]),
        "out-proj linear (384 → 384)": lambda b: F.linear(b["x"], w_o, b_o),
        "residual + LayerNorm (×2)": lambda b: (F.layer_norm(b["x"] + b["x"], ln_w, ln_b, 1e-12),
                                                F.layer_norm(b["x"] + b["x"], ln_w, ln_b, 1e-12)),
        # the layer's FFN1: GELU fused into the product's tiles (functional.linear has no activation)
        "FFN1 linear + fused GELU (384 → 1536)": lambda b: tc._core.linear_f32(b["x"], w_1, b_1, cfg.hidden_act),
        "GELU alone (T×1536; inside FFN1's row, not summed)": lambda b: F.gelu(b["x_f"]),
        "FFN2 linear (1536 → 384)": lambda b: F.linear(b["x_f"], w_2, b_2),
    }

    def over_batches(fn):
        return lambda: [fn(b) for b in per_batch]

    stages = {
        "tokenization": over_batches_raw(lambda i: tok.encode_batch(batches[i]), len(batches)),
        "model forward (C++)": over_batches_raw(
            lambda i: model(encoded[i]["input_ids"], encoded[i]["attention_mask"], encoded[i]["token_type_ids"]),
            len(batches)),
        "encode() total": lambda: enc.encode(sentences, batch_size=args.batch, progress=False),
    }
    hidden = [model(e["input_ids"], e["attention_mask"], e["token_type_ids"]).last_hidden_state for e in encoded]

    def pool_and_normalise() -> np.ndarray:
        """encode's steps after the forward, for all-MiniLM-L6-v2 (mean pooling, normalize=True): each
        batch's masked mean (the plain sum over L: the model leaves zeros at padding positions) put
        into the rows of its sentences, then every row L2-normalised."""
        out = np.zeros((len(sentences), H), dtype=np.float32)
        for start, h, e in zip(range(0, len(sentences), args.batch), hidden, encoded):
            counts = np.maximum(e["attention_mask"].sum(axis=1, keepdims=True), 1).astype(h.dtype)
            out[order[start:start + args.batch]] = h.sum(axis=1) / counts
        out /= np.maximum(np.sqrt(np.add.reduce(out * out, axis=1, keepdims=True)), 1e-12)
        return out

    stages["mean pooling + normalisation"] = pool_and_normalise
    # the stage must be encode's work: its result is encode's embeddings
    diff = float(np.max(np.abs(pool_and_normalise() - enc.encode(sentences, batch_size=args.batch, progress=False))))
    if diff > 1e-6:
        raise SystemExit(f"the pooling stage gives embeddings {diff:.1e} away from encode's; expected encode's work")

    load0 = wait_quiet(args.quiet_load, args.max_wait)
    res_stage = {k: median_ms(f, args.repeats) for k, f in stages.items()}
    res_ops = {k: median_ms(over_batches(f), args.repeats) * layers for k, f in ops.items()}
    load1 = os.getloadavg()[0]

    tokens = sum(b["T"] for b in per_batch)
    padded = sum(b["N"] * b["L"] for b in per_batch)
    cpu = cpu_name()
    total = res_stage["encode() total"]
    fwd = res_stage["model forward (C++)"]
    print(f"# MiniLM-L6 encode profile: {len(sentences)} sentences, batch {args.batch}, {args.threads} threads")
    print(f"- {cpu}, {cpu_isa()}; transformer_core {tc.__version__}; load {load0:.2f} -> {load1:.2f}"
          f"{' (BUSY: noisy)' if machine_busy(load0, load1) else ' (QUIET)'}")
    print(f"- {len(batches)} batches, {tokens} real tokens, {padded} padded positions "
          f"({100 * (padded - tokens) / padded:.0f}% padding)")
    print()
    print("| stage / op | ms | % of encode |")
    print("|---|---|---|")
    for k, v in res_stage.items():
        print(f"| {k} | {v:.1f} | {100 * v / total:.0f}% |")
    op_sum = 0.0
    for k, v in res_ops.items():
        print(f"| &nbsp;&nbsp;{k}, {layers} layers | {v:.1f} | {100 * v / total:.0f}% |")
        if not k.startswith("GELU"):
            op_sum += v
    print(f"| &nbsp;&nbsp;sum of the replayed ops (GELU inside FFN1's fused row) | {op_sum:.1f} | "
          f"{100 * op_sum / total:.0f}% |")
    print(f"| &nbsp;&nbsp;forward − replayed ops (glue, embeddings; Python calls of the replay subtract) | "
          f"{fwd - op_sum:.1f} | {100 * (fwd - op_sum) / total:.0f}% |")
    rest = total - fwd - res_stage["tokenization"] - res_stage["mean pooling + normalisation"]
    print(f"| encode − forward − tokenization − pooling (Python: sort, batching, copies) | {rest:.1f} | "
          f"{100 * rest / total:.0f}% |")
    gflop = sum(2 * b["T"] * H * (3 * H + H + 8 * H) for b in per_batch) * layers / 1e9
    lengths = [np.diff(b["cu"]) for b in per_batch]  # each sentence attends over its own tokens
    gflop_attn = sum(4 * heads * D * float((n.astype(np.float64) ** 2).sum()) for n in lengths) * layers / 1e9
    print()
    print(f"- linear GFLOP per encode {gflop:.2f} (attention {gflop_attn:.2f}); "
          f"the forward runs at {(gflop + gflop_attn) / fwd * 1e3:.0f} GFLOP/s; "
          f"encode: {len(sentences) / total * 1e3:.0f} sentences/s")
    return 0


def over_batches_raw(fn, n):
    return lambda: [fn(i) for i in range(n)]


def wait_quiet(limit: float, max_wait: float) -> float:
    deadline = time.time() + max_wait
    while os.getloadavg()[0] >= limit and time.time() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


if __name__ == "__main__":
    sys.exit(main())
