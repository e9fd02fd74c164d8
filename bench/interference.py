"""Ours with torch in the same process: SDPA (8, 12, 512, 64) at 1 and 2 threads, each setting in a
fresh interpreter.

Usage::

    .venv/bin/python bench/interference.py                 # every setting, 3 rounds
    .venv/bin/python bench/interference.py --settings alone,torch-used --rounds 5

Settings (``SETTINGS``):

* ``alone``: transformer_core only;
* ``torch-imported``: ``import torch`` first (its wheel's ``libgomp.so.1`` is loaded first and, having
  the same soname, serves our OpenMP regions too), torch not used;
* ``torch-used``: as above, and a torch matmul (2 threads) runs between our timed calls, as in a
  notebook that uses both: torch's and our threads then share the same OpenMP pool;
* ``torch-used-1``: as ``torch-used`` with ``torch.set_num_threads(1)`` for torch's calls (what a
  learner can do when torch is only used for checking).

Each worker prints one JSON line (median wall and process-CPU ms of ``--repeats`` calls after warm-up,
per thread count: idle threads that spin show up as CPU time beyond the work, even on a busy machine);
the driver alternates the settings across rounds and keeps each one's best round. The load average
is recorded: on a busy machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = ["alone", "torch-imported", "torch-used", "torch-used-1"]
SHAPE = (8, 12, 512, 64)


def run_worker(setting: str, repeats: int) -> None:
    import numpy as np

    torch_step = None
    if setting != "alone":
        import torch

        a = torch.randn(256, 256)

        def torch_step():
            torch.set_num_threads(1 if setting == "torch-used-1" else 2)
            a @ a
    import transformer_core as tc

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(3))
    out = {"setting": setting, "load_start": os.getloadavg()[0]}
    for threads in (1, 2):
        times, cpu = [], []
        for i in range(repeats + 2):
            if torch_step is not None and setting.startswith("torch-used"):
                torch_step()
            tc.set_num_threads(threads)
            t0, c0 = time.perf_counter(), time.process_time()
            tc.functional.scaled_dot_product_attention(q, k, v)
            if i >= 2:
                times.append(1e3 * (time.perf_counter() - t0))
                cpu.append(1e3 * (time.process_time() - c0))
        out[str(threads)] = statistics.median(times)
        out[f"cpu{threads}"] = statistics.median(cpu)
    out["load_end"] = os.getloadavg()[0]
    print(json.dumps(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        run_worker(args.worker, args.repeats)
        return 0
    settings = [s for s in args.settings.split(",") if s]
    best: dict[str, dict] = {}
    loads: list[float] = []
    for r in range(args.rounds):
        for s in settings:
            proc = subprocess.run([sys.executable, __file__, "--worker", s, "--repeats", str(args.repeats)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{s}: failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            loads += [res["load_start"], res["load_end"]]
            print(f"round {r + 1} {s}: 1 thread {res['1']:.1f} ms, 2 threads {res['2']:.1f} ms", file=sys.stderr)
            b = best.setdefault(s, res)
            for t in ("1", "2", "cpu1", "cpu2"):
                b[t] = min(b[t], res[t])
    from run import cpu_name

    cpu = cpu_name()
    print(f"# ours, SDPA {SHAPE}, best of {args.rounds} rounds: {cpu}; load {min(loads):.2f}-{max(loads):.2f}"
          f"{' (BUSY: noisy)' if max(loads) >= 1.5 else ''}")
    print()
    print("| setting | 1 thread ms | 2 threads ms | scaling 1→2 | 2 threads vs alone | process CPU ms, 1 / 2 threads |")
    print("|---|---|---|---|---|---|")
    alone = best.get("alone", {}).get("2")
    for s, b in best.items():
        rel = f"{b['2'] / alone:.2f}×" if alone else "—"
        print(f"| {s} | {b['1']:.1f} | {b['2']:.1f} | {b['1'] / b['2']:.2f}× | {rel} | "
              f"{b['cpu1']:.0f} / {b['cpu2']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
