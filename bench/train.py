"""One training step of a GPT-2-small-shaped model, ours against PyTorch, fp32, the same threads.

Usage::

    .venv/bin/python bench/train.py                          # 2 threads, 1 warm-up + 3 timed steps
    .venv/bin/python bench/train.py --threads 2 --steps 5 --layers 4 --batch 8 --context 256

The model: GPT-2 small's shapes (768 wide, 12 heads, 3072 feed-forward, vocabulary 50257, context
256) with 4 layers; the batch 8 × 256 tokens, labels = the inputs (Hugging Face's shifted causal-LM
loss). One step is forward + loss + backward + AdamW (lr 3e-4, weight decay 0.1) + zero_grad:

    ours   tc.GPT2LMHeadModel: model.loss(ids, labels); model.backward(); AdamW.step(); zero_grad()
           (LM head fused with the cross-entropy, chunked; FlashAttention-2 backward)
    torch  transformers.GPT2LMHeadModel (sdpa attention, dropout 0): model(ids, labels=ids).loss
           .backward(); torch.optim.AdamW.step(); zero_grad()

Each side runs in its own interpreter (so that neither's memory counts for the other); the parent
alternates them step by step (ours, torch, ours, ...), so both see the same load on a shared machine.
Reported: the median step time of the timed steps, each process's peak resident set (VmHWM, whole
process: interpreter, libraries, model, optimizer state, activations), and the peak above the resident
set once the model, the optimizer and the batch existed (the training itself). The step's loss is
printed beside (both start from their library's random initialisation, so the losses differ a
little: ~ln 50257 = 10.8). The machine is shared: figures are noisy; the CPU is named in the header.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from run import MAX_THREADS, cpu_isa, cpu_name, int_in

ROOT = Path(__file__).resolve().parents[1]


def _status_kib(field: str) -> int:
    m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def run_side(side: str, args) -> None:
    """The subprocess: builds the model and the batch, then answers the parent on stdin/stdout, one
    JSON line per command: "step" runs one training step (its seconds and loss), "done" reports the
    peak resident set and exits. The parent alternates the two sides step by step, so that both see the
    same machine load."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50257, (args.batch, args.context))
    cfg = dict(vocab_size=50257, n_positions=args.context, n_embd=768, n_layer=args.layers, n_head=12,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if side == "ours":
        import transformer_core as tc  # the installed package (the source tree has no compiled _core)

        tc.set_num_threads(args.threads)
        model = tc.GPT2LMHeadModel(tc.GPT2Config(**cfg)).train()
        opt = tc.optim.AdamW(model.named_parameters(), lr=3e-4, weight_decay=0.1)

        def step():
            loss = model.loss(ids, ids)
            model.backward()
            opt.step()
            model.zero_grad()
            return loss
    else:
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        config = transformers.GPT2Config(**cfg, attn_implementation="sdpa")
        model = transformers.GPT2LMHeadModel(config).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        tids = torch.from_numpy(ids)

        def step():
            loss = model(tids, labels=tids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()

    baseline = _status_kib("VmRSS")  # model, optimizer (no moments yet: both create them at step 1), batch
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "step":
            t0 = time.perf_counter()
            loss = step()
            print(json.dumps({"seconds": time.perf_counter() - t0, "loss": loss}), flush=True)
        else:
            peak = _status_kib("VmHWM")
            print(json.dumps({"peak_mib": peak / 1024, "train_peak_mib": (peak - baseline) / 1024}), flush=True)
            return


class Worker:
    """One side's subprocess (see run_side)."""

    def __init__(self, side: str, args, env):
        cmd = [sys.executable, __file__, "--side", side] + [f"--{k}={getattr(args, k)}" for k in
                                                           ("threads", "layers", "batch", "context")]
        self.side = side
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            sys.exit(f"{self.side} failed (exit code {self.proc.returncode})")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # every value checked here, before either model is built
    ap.add_argument("--threads", type=int_in(1, MAX_THREADS), default=2, help=f"1 to {MAX_THREADS} (default 2)")
    ap.add_argument("--steps", type=int_in(1), default=3, help="timed steps of each side (after the warm-up ones)")
    ap.add_argument("--warmup", type=int_in(0), default=1)
    ap.add_argument("--layers", type=int_in(1), default=4)
    ap.add_argument("--batch", type=int_in(1), default=8)
    ap.add_argument("--context", type=int_in(1), default=256, help="tokens per row (the model's n_positions)")
    ap.add_argument("--side", choices=["ours", "torch"], help=argparse.SUPPRESS)  # the subprocess
    args = ap.parse_args(argv)
    if args.side:
        run_side(args.side, args)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    # one side at a time in memory would be kinder, but alternating steps is what makes the times
    # comparable on a shared machine; each process's peak is its own either way
    workers = {side: Worker(side, args, env) for side in ("ours", "torch")}
    times = {side: [] for side in workers}
    losses = {}
    for i in range(args.warmup + args.steps):
        for side, w in workers.items():
            r = w.ask("step")
            losses.setdefault(side, r["loss"])
            if i >= args.warmup:
                times[side].append(r["seconds"])
    results = {}
    for side, w in workers.items():
        results[side] = dict(w.ask("done"), median_s=statistics.median(times[side]), times_s=times[side],
                             loss=losses[side])
        w.proc.wait()
    o, t = results["ours"], results["torch"]
    speedup = t["median_s"] / o["median_s"]
    lines = [
        f"# Training step: GPT-2-small shapes, {args.layers} layers, batch {args.batch} x {args.context}, fp32",
        "",
        f"CPU: {cpu_name()}, {cpu_isa()}; threads: {args.threads}; load average: {os.getloadavg()[0]:.1f} "
        f"(on {os.cpu_count()} CPUs); timed steps: {args.steps} after {args.warmup} warm-up",
        "",
        "| | ours | torch | torch/ours | target | met? |",
        "|---|---|---|---|---|---|",
        f"| step time, median (s) | {o['median_s']:.2f} | {t['median_s']:.2f} | {speedup:.2f} | >= 1.3 | "
        f"{'yes' if speedup >= 1.3 else 'NO'} |",
        f"| peak RSS, whole process (MiB) | {o['peak_mib']:.0f} | {t['peak_mib']:.0f} | "
        f"{t['peak_mib'] / o['peak_mib']:.2f} | ours <= torch | {'yes' if o['peak_mib'] <= t['peak_mib'] else 'NO'} |",
        f"| peak RSS above model + optimizer + batch (MiB) | {o['train_peak_mib']:.0f} | {t['train_peak_mib']:.0f} | "
        f"{t['train_peak_mib'] / max(o['train_peak_mib'], 1e-9):.2f} | report | |",
        f"| first step's loss | {o['loss']:.3f} | {t['loss']:.3f} | | | |",
        "",
        f"step times (s): ours {[round(x, 2) for x in o['times_s']]}, torch {[round(x, 2) for x in t['times_s']]}",
    ]
    text = "\n".join(lines)
    print(text)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "train.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
