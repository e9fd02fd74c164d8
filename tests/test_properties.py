"""The property suite (tests/properties/): every public function and class called with hostile and
valid arguments drawn by hypothesis; each case must raise a TypeError / ValueError that names the
argument, or return the reference's values (see tests/properties/harness.py).

Each target runs in a worker process (``python -m tests.properties.run --serve``), so a segfault or
a hang fails that target's test with its output instead of killing the run: a target that takes
longer than ``TC_PROPERTY_TIMEOUT`` seconds (default 300) is a hang, the worker is killed and the
next target gets a fresh one. Two workers run the targets in parallel (``TC_PROPERTY_WORKERS``).

The cases are reproducible (fixed seed). More cases locally::

    TC_PROPERTY_EXAMPLES=500 pytest tests/test_properties.py        # per target of weight 1; CI: 40
    TC_PROPERTY_SEED=7 pytest tests/test_properties.py              # other cases
    python -m tests.properties.run functional.softmax --examples 2000  # one target, in this process
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.properties.run import default_examples, default_seed  # noqa: E402
from tests.properties.targets import TARGETS  # noqa: E402

TIMEOUT = float(os.environ.get("TC_PROPERTY_TIMEOUT", "300"))
WORKERS = int(os.environ.get("TC_PROPERTY_WORKERS", str(min(2, os.cpu_count() or 1))))
#: The CI run must try at least this many cases in all.
MIN_TOTAL_CASES = 2000


class Worker:
    """One ``run --serve`` process; its stderr goes to a file (the output shown on a crash)."""

    def __init__(self):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        # the transformer_core this process imported (installed in CI, the source tree in a development
        # build), or another build's package
        package = os.environ.get("TC_PROPERTY_PACKAGE", str(Path(importlib.util.find_spec("transformer_core").origin)
                                                            .parent.parent))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package, str(ROOT),
                                                                        os.environ.get("PYTHONPATH")])),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.properties.run", "--serve"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)  # EOF: the process died

    def output_tail(self, n=4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-n:]

    def run(self, name: str, examples: int, seed: int) -> dict:
        self.proc.stdin.write(json.dumps({"target": name, "examples": examples, "seed": seed}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.answers.get(timeout=TIMEOUT)
        except queue.Empty:
            self.kill()
            return {"target": name, "cases": 0, "failed": 1, "by_kind": {"hang": 1}, "failures": [
                f"hang: no answer after {TIMEOUT:.0f} s\n{self.output_tail()}"]}
        if line is None:
            code = self.proc.wait()
            return {"target": name, "cases": 0, "failed": 1, "by_kind": {"crash": 1}, "failures": [
                f"crash: the worker died (exit code {code})\n{self.output_tail()}"]}
        return json.loads(line)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None


class Pool:
    """Runs every target once, on WORKERS workers, as soon as the first test asks; each test then
    waits for its own target's result."""

    def __init__(self, names):
        self.results: dict[str, dict] = {}
        self.done = {n: threading.Event() for n in names}
        self.todo: queue.Queue = queue.Queue()
        for n in names:
            self.todo.put(n)
        self.examples, self.seed = default_examples(), default_seed()
        self.start = time.perf_counter()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(WORKERS)]
        for th in self.threads:
            th.start()

    def _loop(self):
        worker = None
        while True:
            try:
                name = self.todo.get_nowait()
            except queue.Empty:
                break
            if worker is None or not worker.alive():
                worker = Worker()
            self.results[name] = worker.run(name, self.examples, self.seed)
            self.done[name].set()
        if worker is not None:
            worker.proc.stdin.close()
            worker.kill()

    def result(self, name: str) -> dict:
        self.done[name].wait()
        return self.results[name]


_POOL: Pool | None = None


def _pool() -> Pool:
    global _POOL
    if _POOL is None:
        _POOL = Pool(list(TARGETS))
    return _POOL


@pytest.mark.parametrize("name", list(TARGETS))
def test_property_target(name):
    r = _pool().result(name)
    if r["failed"]:
        shown = "\n".join(r["failures"][:10])
        pytest.fail(f"{name}: {r['failed']} of {r['cases']} cases broke the contract {r['by_kind']}\n{shown}",
                    pytrace=False)
    assert r["cases"] > 0


def test_property_totals():
    """Every target ran, and together they tried at least MIN_TOTAL_CASES cases (in CI)."""
    pool = _pool()
    results = [pool.result(n) for n in TARGETS]
    total = sum(r["cases"] for r in results)
    failed = sum(r["failed"] for r in results)
    print(f"\nproperty suite: {len(results)} targets, {total} cases, {failed} failed, "
          f"{time.perf_counter() - pool.start:.0f} s")
    if pool.examples >= 40:
        assert total >= MIN_TOTAL_CASES, f"only {total} cases were tried"
