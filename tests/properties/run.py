"""Runs property targets, in this process.

    python -m tests.properties.run TARGET [TARGET ...] [--examples N] [--seed S] [--show K]
    python -m tests.properties.run all --examples 500          # every target, more cases
    python -m tests.properties.run --list
    python -m tests.properties.run --serve                       # the worker of tests/test_properties.py

``--examples`` is the number of hypothesis examples of a target of weight 1 (default:
``TC_PROPERTY_EXAMPLES``, else 40); the seed makes a run reproducible (default:
``TC_PROPERTY_SEED``, else 0). It prints one line per target (cases, failures by class) and the
first ``--show`` failures, and exits 1 if any case failed. ``--serve`` reads one JSON request per
line on stdin (``{"target", "examples", "seed"}``) and answers one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time


def default_examples() -> int:
    return int(os.environ.get("TC_PROPERTY_EXAMPLES", "40"))


def default_seed() -> int:
    return int(os.environ.get("TC_PROPERTY_SEED", "0"))


def run_one(name: str, examples: int, seed: int) -> dict:
    from .harness import run_target
    from .targets import TARGETS

    target = TARGETS[name]
    n = max(1, round(examples * target.weight))
    start = time.perf_counter()
    cases, failures = run_target(target, n, seed)
    by_kind = collections.Counter(f.kind for f in failures)
    return {"target": name, "cases": cases, "failed": len(failures), "by_kind": dict(by_kind),
            "seconds": round(time.perf_counter() - start, 2),
            "failures": [f"{f.kind} {f.case}: {f.message}" for f in failures[:20]]}


def serve() -> None:
    limit = os.environ.get("TC_PROPERTY_MEMORY_LIMIT_GB")
    if limit:  # a cap on the worker's address space: a runaway allocation fails here, not on the machine
        import resource

        cap = int(float(limit) * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the targets print goes to stderr, not into the protocol
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = run_one(request["target"], request["examples"], request["seed"])
        except Exception as e:  # noqa: BLE001 - a harness error is reported, the worker goes on
            import traceback

            result = {"target": request["target"], "cases": 0, "failed": 1, "by_kind": {"harness_error": 1},
                      "seconds": 0, "failures": [f"harness_error: {e}\n{traceback.format_exc()}"]}
        out.write(json.dumps(result) + "\n")
        out.flush()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*")
    p.add_argument("--examples", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--show", type=int, default=5)
    p.add_argument("--list", action="store_true")
    p.add_argument("--serve", action="store_true")
    p.add_argument("--json", help="write the per-target results to this file")
    a = p.parse_args(argv)
    if a.serve:
        serve()
        return 0
    from .targets import TARGETS

    if a.list:
        print("\n".join(TARGETS))
        return 0
    names = list(TARGETS) if a.targets in ([], ["all"]) else a.targets
    examples = a.examples if a.examples is not None else default_examples()
    seed = a.seed if a.seed is not None else default_seed()
    total_cases = total_failed = 0
    kinds = collections.Counter()
    results = []
    for name in names:
        r = run_one(name, examples, seed)
        results.append(r)
        total_cases += r["cases"]
        total_failed += r["failed"]
        kinds.update(r["by_kind"])
        print(f"{name:50s} {r['cases']:5d} cases {r['failed']:4d} failed {r['seconds']:6.1f}s {r['by_kind'] or ''}",
              flush=True)
        for f in r["failures"][:a.show]:
            print("    " + f[:600], flush=True)
    print(f"TOTAL {total_cases} cases, {total_failed} failed {dict(kinds)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
