"""transformer_core.distributed.embed_corpus on local Dask clusters: the same rows as the
single-process run (corpus.embed_file), every row exactly once when a worker is killed mid-run,
and the CLI's --workers / --scheduler."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import MODEL_NAME, corpus_lines
from transformer_core import corpus

distributed = pytest.importorskip("distributed")  # an optional dependency: installed in the test set-up
from transformer_core.distributed import embed_corpus  # noqa: E402


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_dataset(out: Path):
    """(ids, texts, embeddings) of a Parquet output, every row as stored (no dedup, no sort)."""
    table = pq.read_table(out)
    emb = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    return table.column("id").to_numpy(), table.column("text").to_pylist(), emb


def assert_same_rows(out: Path, ref: Path):
    ids, texts, emb = read_dataset(out)
    rids, rtexts, remb = read_dataset(ref)
    assert len(ids) == len(rids) and len(np.unique(ids)) == len(ids), "a row is missing or duplicated"
    order = np.argsort(ids)
    np.testing.assert_array_equal(ids[order], np.arange(len(rids)))
    assert [texts[i] for i in order] == rtexts
    np.testing.assert_allclose(emb[order], remb[np.argsort(rids)], atol=1e-6, rtol=0)
    m = json.loads(Path(f"{out}.manifest.json").read_text())
    assert m["complete"] and m["completed"] == [[0, m["num_chunks"]]]
    assert sorted(p.name for p in out.iterdir()) == [f"part-{i:05d}.parquet" for i in range(m["num_chunks"])]
    assert not Path(f"{out}.partial").exists()


@pytest.fixture(scope="module")
def cluster():
    """A local cluster of two single-threaded worker processes (as the CI machine has 2 cores).
    Its nannies write Dask's pre-spawn variables (OMP_NUM_THREADS=1, ...) into this process's
    environment; it is restored afterwards, so the later tests' subprocesses do not inherit them."""
    saved = dict(os.environ)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as c, distributed.Client(c) as client:
        yield c, client
    os.environ.clear()
    os.environ.update(saved)


def test_embed_corpus_leaves_the_environment_as_it_was(tmp_path, tiny_model_dir):
    f = write_lines(tmp_path / "c.txt", corpus_lines(50))
    before = dict(os.environ)
    embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1, chunk_size=20)
    assert dict(os.environ) == before


def test_local_cluster_of_two_equals_single_process(tmp_path):
    """The real model, a cluster started by embed_corpus itself (workers=2): the same rows."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(240))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=MODEL_NAME, chunk_size=40)
    out = tmp_path / "out.parquet"
    seen = []
    r = embed_corpus(f, out, model=MODEL_NAME, workers=2, threads_per_worker=1, chunk_size=40,
                     on_chunk=lambda i, done: seen.append((i, done)))
    assert (r.rows, r.dim, r.chunks, r.rows_computed) == (240, 384, 6, 240)
    assert sorted(i for i, _ in seen) == list(range(6)) and [d for _, d in seen] == list(range(1, 7))
    assert_same_rows(out, ref)


def test_worker_killed_mid_run(tmp_path, tiny_model_dir, cluster):
    """SIGKILL of one worker process after 3 chunks: Dask reruns its chunks elsewhere (the nanny
    restarts it); the output has every row exactly once, equal to the single-process run."""
    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(4000))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=100)
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    killed = []

    def on_chunk(index, done):
        if done == 3 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(index)

    out = tmp_path / "out.parquet"
    r = embed_corpus(f, out, model=str(tiny_model_dir), scheduler=client, threads_per_worker=1, chunk_size=100,
                     on_chunk=on_chunk)
    assert killed and r.chunks == 40 and r.rows == 4000
    assert_same_rows(out, ref)
    with pytest.raises(ProcessLookupError):
        os.kill(victim, 0)  # it is really gone
    client.wait_for_workers(2, timeout=60)  # the nanny replaced it
    assert victim not in client.run(os.getpid).values()


def test_resume_a_single_process_run_on_the_cluster(tmp_path, tiny_model_dir, cluster):
    """An interrupted single-process run (SIGKILL) is finished by the distributed job: one layout,
    one manifest."""
    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(3000))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=100)
    out = tmp_path / "out.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "transformer_core", "embed", "--file", str(f), "--out", str(out),
                             "--model", str(tiny_model_dir), "--chunk-size", "100", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    man = Path(f"{out}.manifest.json")
    while proc.poll() is None:
        if man.exists() and len(corpus.completed_chunks(json.loads(man.read_text()))) >= 2:
            proc.kill()
            break
        time.sleep(0.002)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    done = len(corpus.completed_chunks(json.loads(man.read_text())))
    r = embed_corpus(f, out, model=str(tiny_model_dir), scheduler=client, resume=True)
    assert r.chunks_computed == 30 - done and r.rows == 3000
    assert_same_rows(out, ref)


def test_lost_cluster_is_an_oserror_that_keeps_the_chunks_done(tmp_path, tiny_model_dir, cluster):
    """The run's futures cancelled under it (as when the scheduler goes away): an OSError saying that
    the chunks done are saved (the CLI's one line), not distributed's FutureCancelledError; --resume
    then finishes the same rows."""
    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(2000))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=100)

    def on_chunk(index, done):
        if done == 2:
            keys = [k for k in list(client.futures) if str(k).startswith("transformer_core-embed-")]
            client.cancel([distributed.Future(k, client) for k in keys])

    out = tmp_path / "out.parquet"
    with pytest.raises(OSError, match=r"^lost the Dask cluster \(.*\); the chunks done are saved, --resume continues"):
        embed_corpus(f, out, model=str(tiny_model_dir), scheduler=client, chunk_size=100, max_in_flight=4,
                     on_chunk=on_chunk)
    done = corpus.completed_chunks(json.loads(Path(f"{out}.manifest.json").read_text()))
    assert 2 <= len(done) < 20
    r = embed_corpus(f, out, model=str(tiny_model_dir), scheduler=client, chunk_size=100, resume=True)
    assert r.rows == 2000
    assert_same_rows(out, ref)


def test_cli_scheduler_address(tmp_path, tiny_model_dir, cluster):
    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(500))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=60)
    out = tmp_path / "out.parquet"
    proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file", str(f), "--out", str(out),
                           "--model", str(tiny_model_dir), "--chunk-size", "60", "--scheduler", c.scheduler_address,
                           "--json", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"] == 500
    assert_same_rows(out, ref)


def test_distributed_bad_arguments(tmp_path, tiny_model_dir):
    f = write_lines(tmp_path / "c.txt", ["a", "b"])
    with pytest.raises(ValueError, match="Parquet dataset.*ending in .parquet"):
        embed_corpus(f, tmp_path / "e.npy", model=str(tiny_model_dir), workers=1)
    with pytest.raises(ValueError, match="scheduler and workers"):
        embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1, scheduler="tcp://x:1")
    with pytest.raises(ValueError, match="workers: expected an int >= 1"):
        embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=0)
    with pytest.raises(FileNotFoundError, match="no such file"):
        embed_corpus(tmp_path / "missing.txt", tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1)
    proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file", str(f), "--out",
                           str(tmp_path / "e.npy"), "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and ".parquet" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
