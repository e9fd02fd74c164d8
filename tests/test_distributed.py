"""transformer_core.distributed.embed_corpus on local Dask clusters: the same rows as the
single-process run (corpus.embed_file), every row exactly once when a worker is killed mid-run,
and the CLI's --workers / --scheduler."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import MODEL_NAME, corpus_lines
from transformer_core import SentenceEncoder, corpus

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
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=logging.ERROR) as c, distributed.Client(c) as client:
        yield c, client
    os.environ.clear()
    os.environ.update(saved)


def test_embed_corpus_leaves_the_environment_as_it_was(tmp_path, tiny_model_dir, monkeypatch):
    """The local cluster's nannies write Dask's pre-spawn variables into this process: those are
    restored. The job restored the whole environment instead, so a variable the caller set while
    it ran (here in on_chunk; another thread alike) was removed."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(50))
    monkeypatch.delenv("SET_IN_ON_CHUNK", raising=False)
    before = dict(os.environ)

    def on_chunk(index, done):
        os.environ["SET_IN_ON_CHUNK"] = str(done)

    embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1, chunk_size=20, on_chunk=on_chunk)
    assert dict(os.environ) == {**before, "SET_IN_ON_CHUNK": "3"}


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


def test_resuming_an_int8_single_process_run_names_the_single_process_path(tmp_path, tiny_model_dir, monkeypatch):
    """An interrupted embed_file(quantize="int8") output cannot be finished by the distributed job
    (float32 only): the refusal names the single-machine run that can continue it, not --quantize
    (which embed_corpus does not take), before a cluster starts and with nothing changed. That run
    then continues it."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(30))
    model = str(tiny_model_dir)
    out = tmp_path / "q.parquet"
    commit, calls = corpus.EmbedJob.commit, []

    def commit_then_stop(self, index, **kwargs):
        """EmbedJob.commit, then a KeyboardInterrupt after the second chunk: an interrupted run."""
        commit(self, index, **kwargs)
        calls.append(index)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(corpus.EmbedJob, "commit", commit_then_stop)
    with pytest.raises(KeyboardInterrupt):
        corpus.embed_file(f, out, model=model, chunk_size=10, quantize="int8")
    monkeypatch.undo()
    before = {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"^resume: .*q\.parquet was embedded with --quantize int8, and the "
                                         r"distributed job \(--workers/--scheduler\) embeds in float32 only; a "
                                         r"single-machine run continues it \(embed_file\(\.\.\., quantize='int8'\), "
                                         r"or the embed command with --quantize int8 and without "
                                         r"--workers/--scheduler\), --overwrite starts over$"):
        embed_corpus(f, out, model=model, workers=1, resume=True)
    assert time.perf_counter() - t0 < 5  # refused up front: no cluster started
    assert {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    r = corpus.embed_file(f, out, model=model, quantize="int8", resume=True)  # the remedy given works
    assert (r.rows, r.chunks, r.chunks_computed) == (30, 3, 1)


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


def read_sorted(out: Path):
    """(ids, texts, embeddings) of a Parquet output, by id."""
    ids, texts, emb = read_dataset(out)
    order = np.argsort(ids)
    return ids[order], [texts[i] for i in order], emb[order]


def cls_model(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """The tiny BERT as a sentence-transformers folder with CLS pooling and no Normalize module:
    its own encode does not L2-normalise."""
    import shutil

    d = tmp_path / "tiny_cls"
    shutil.copytree(tiny_model_dir, d)
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    return d


def test_dask_rows_are_the_local_rows_bitwise_for_a_model_without_normalize(tmp_path, tiny_model_dir, cluster):
    """The tasks L2-normalise as embed_file does (the manifest says normalize true) even for a model
    whose own setting is not to: the Dask output is bitwise the single-process one, and both are
    encode(normalize=True) of each chunk in batches of batch_size."""
    c, client = cluster
    model = str(cls_model(tmp_path, tiny_model_dir))
    encoder = SentenceEncoder.from_pretrained(model)
    assert encoder.pooling == "cls" and not encoder.normalize
    lines = corpus_lines(45)
    f = write_lines(tmp_path / "c.txt", lines)
    local, dask = tmp_path / "local.parquet", tmp_path / "dask.parquet"
    corpus.embed_file(f, local, model=model, chunk_size=10, batch_size=4)
    embed_corpus(f, dask, model=model, scheduler=client, chunk_size=10, batch_size=4)
    ref = np.concatenate([encoder.encode(lines[a:a + 10], batch_size=4, normalize=True) for a in range(0, 45, 10)])
    assert np.abs(np.linalg.norm(encoder.encode(lines[:3]), axis=1) - 1).min() > 0.1  # the model's own: not unit
    for out in (local, dask):
        ids, texts, emb = read_sorted(out)
        assert ids.tolist() == list(range(45)) and texts == lines
        np.testing.assert_array_equal(emb, ref)
        np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-6)
        assert json.loads(Path(f"{out}.manifest.json").read_text())["normalize"] is True


def test_a_stale_task_of_a_replaced_run_writes_nothing(tmp_path, tiny_model_dir, cluster, monkeypatch):
    """client.cancel does not stop a task that is already running: one of an interrupted run may end
    after another run replaced the output (overwrite=True). Such tasks, replayed here with the very
    arguments the interrupted run submitted them with, while the new run is in flight, write nothing
    (ESTALE): the new output holds exactly its own rows, bitwise the single-process run's."""
    c, client = cluster
    model = str(tiny_model_dir)
    old = write_lines(tmp_path / "old.txt", corpus_lines(400))
    new = write_lines(tmp_path / "new.txt", corpus_lines(100, 5000))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(new, ref, model=model, chunk_size=40)
    out = tmp_path / "e.parquet"
    submit = client.submit
    submitted = {}

    def recording_submit(fn, *args, **kwargs):
        submitted[kwargs.get("key")] = (fn, args)
        return submit(fn, *args, **kwargs)

    def interrupt(index, done):
        raise KeyboardInterrupt

    monkeypatch.setattr(client, "submit", recording_submit)
    with pytest.raises(KeyboardInterrupt, match="interrupted: 1 of 10 chunks"):
        embed_corpus(old, out, model=model, scheduler=client, chunk_size=40, max_in_flight=4, on_chunk=interrupt)
    stale = {int(str(key).rsplit("-", 1)[1]): task for key, task in submitted.items()}
    assert {1, 3} <= set(stale)
    replayed = []

    def replay(index, done):
        if index == 1:  # the new part-00001 is written: a stale chunk 1 would replace it, a chunk 3 be added
            replayed.extend(submit(stale[i][0], *stale[i][1], pure=False) for i in (1, 3))
            distributed.wait(replayed)

    r = embed_corpus(new, out, model=model, scheduler=client, chunk_size=40, overwrite=True, on_chunk=replay)
    assert r.rows == 100 and len(replayed) == 2
    for fut in replayed:
        err = fut.exception()
        assert isinstance(err, OSError) and err.errno == errno.ESTALE, err
        assert "not written" in str(err) and "no longer the data of run" in str(err)
    assert_same_rows(out, ref)
    ids, texts, emb = read_sorted(out)
    rids, rtexts, remb = read_sorted(ref)
    assert texts == rtexts == corpus_lines(100, 5000) and np.array_equal(emb, remb)
    assert pq.read_table(out).num_rows == 100


def test_distributed_bad_arguments(tmp_path, tiny_model_dir):
    f = write_lines(tmp_path / "c.txt", ["a", "b"])
    # The output argument is `out`, as embed_file's and the CLI's --out: its errors name it so.
    with pytest.raises(ValueError, match=r"^out: the distributed job writes a Parquet dataset, expected a path "
                                         r"ending in \.parquet, got '.*e\.npy'$"):
        embed_corpus(f, tmp_path / "e.npy", model=str(tiny_model_dir), workers=1)
    with pytest.raises(ValueError, match=r"^out: expected a path ending in \.npy or \.parquet, got '.*e\.csv'$"):
        embed_corpus(f, out=tmp_path / "e.csv", model=str(tiny_model_dir), workers=1)
    with pytest.raises(TypeError, match=r"^out: expected a str or os\.PathLike, got int$"):
        embed_corpus(f, 5, model=str(tiny_model_dir), workers=1)
    with pytest.raises(ValueError, match="scheduler and workers"):
        embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1, scheduler="tcp://x:1")
    with pytest.raises(ValueError, match=r"^workers: expected an int in \[1, 1024\], got 0$"):
        embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=0)
    with pytest.raises(FileNotFoundError, match="no such file"):
        embed_corpus(tmp_path / "missing.txt", tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1)
    proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file", str(f), "--out",
                           str(tmp_path / "e.npy"), "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "out: the distributed job writes a Parquet dataset, expected a path ending in .parquet, got " in proc.stderr
    assert "output:" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
    # Checked before anything is removed (and before a cluster starts): a complete output is kept.
    out = tmp_path / "done.parquet"
    corpus.embed_file(f, out, model=str(tiny_model_dir))
    before = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for kwargs, error, match in (({"batch_size": 0}, ValueError, "^batch_size: expected an int in \\[1, 2\\*\\*63 - 1\\], got 0$"),
                                 ({"progress": "yes"}, TypeError, "^progress: expected a bool"),
                                 ({"resume": "no"}, TypeError, "^resume: expected a bool")):
        with pytest.raises(error, match=match):
            embed_corpus(f, out, model=str(tiny_model_dir), workers=1, **{"overwrite": True, **kwargs})
    data = tmp_path / "data.parquet"
    pq.write_table(pq.read_table(out).select(["text"]), data)
    before[data.name] = data.read_bytes()
    with pytest.raises(ValueError, match=r"^out: .*data\.parquet is the input .*data\.parquet"):
        embed_corpus(data, data, model=str(tiny_model_dir), workers=1, overwrite=True)
    assert {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_bad_arguments_keep_a_complete_output_and_start_no_cluster(tmp_path, tiny_model_dir):
    """Every argument is checked before anything is removed: with overwrite=True a complete output
    stays as it was (bitwise, and still encode()'s rows), and resume=True on a complete output does
    not return success with a bad scheduler / workers. A cluster would have started with workers=1:
    none does (each call ends at once)."""
    lines = corpus_lines(30)
    f = write_lines(tmp_path / "c.txt", lines)
    model = str(tiny_model_dir)
    out = tmp_path / "done.parquet"
    corpus.embed_file(f, out, model=model, chunk_size=10)
    before = {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    bad_address = r"^scheduler: expected a scheduler address such as 'tcp://host:8786', got "
    cases = [
        ({"on_chunk": 5, "workers": 1}, TypeError, "^on_chunk: expected a callable or None, got int$"),
        ({"on_chunk": "x", "scheduler": "tcp://127.0.0.1:1"}, TypeError, "^on_chunk: expected a callable or None, got str$"),
        ({"chunk_size": 10**30, "workers": 1}, ValueError,
         r"^chunk_size: expected an int in \[1, 2\*\*63 - 1\], got 10{30}$"),
        ({"model": 5, "workers": 1}, TypeError, "^model: expected a str or path, got int$"),
        ({"model": "", "workers": 1}, ValueError, "^model: expected a model name or path, got ''$"),
        ({"scheduler": 123}, TypeError, "^scheduler: expected an address \\(str\\) or a Client, got int$"),
        ({"scheduler": "tcp://127.0.0.1:1", "workers": 2}, ValueError, "^scheduler and workers: give one"),
        ({"scheduler": ""}, ValueError, bad_address + r"'' \(missing port number in address ''\)$"),
        ({"scheduler": "localhost"}, ValueError, bad_address + "'localhost' \\(missing port number"),
        ({"scheduler": "foo://x:1"}, ValueError, bad_address + "'foo://x:1' \\(unknown address scheme 'foo'"),
        ({"scheduler": "tcp://127.0.0.1:99999"}, ValueError, bad_address + ".*port 99999 out of range"),
    ]
    for how in ({"overwrite": True}, {"resume": True}):
        for kwargs, error, match in cases:
            t0 = time.perf_counter()
            with pytest.raises(error, match=match):
                embed_corpus(f, out, **{"model": model, **how, **kwargs})
            assert time.perf_counter() - t0 < 5, (how, kwargs)  # refused up front, no cluster, no connection
            assert {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    r = embed_corpus(f, out, model=model, workers=1, resume=True)  # good arguments: complete, nothing to do
    assert (r.rows, r.chunks, r.chunks_computed) == (30, 3, 0)
    encoder = SentenceEncoder.from_pretrained(model)
    ids, texts, emb = read_sorted(out)
    ref = np.concatenate([encoder.encode(lines[a:a + 10], normalize=True) for a in (0, 10, 20)])
    assert ids.tolist() == list(range(30)) and texts == lines
    np.testing.assert_array_equal(emb, ref)


def test_a_malformed_scheduler_address_is_named_by_the_cli(tmp_path, tiny_model_dir):
    f = write_lines(tmp_path / "c.txt", ["a", "b"])
    for address in ("localhost", "foo://x:1"):
        proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file", str(f), "--out",
                               str(tmp_path / "e.parquet"), "--model", str(tiny_model_dir), "--scheduler", address,
                               "--no-progress"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"transformer_core embed: scheduler: expected a scheduler address such as "
                                      f"'tcp://host:8786', got {address!r} ("), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_an_address_dask_refuses_at_connect_names_scheduler(monkeypatch):
    """An address that passes the syntax check but that Client refuses with a ValueError: named too."""
    import transformer_core.distributed as tcd

    class Refusing(distributed.Client):
        def __init__(self, *args, **kwargs):
            raise ValueError("no such thing")

    monkeypatch.setattr(tcd, "Client", Refusing)
    monkeypatch.setattr(tcd, "_reach", lambda address: None)  # as if a scheduler answered there
    with pytest.raises(ValueError, match=r"^scheduler: expected a scheduler address such as 'tcp://host:8786', "
                                         r"got 'tcp://127.0.0.1:8786' \(no such thing\)$"):
        tcd._connect("tcp://127.0.0.1:8786", None, None)


def test_an_in_process_cluster_leaves_the_callers_thread_count(tmp_path, tiny_model_dir):
    """LocalCluster(processes=False): the worker runs in this process, whose thread count is
    process-wide; the job neither lowers it (threads_per_worker=1 here) nor changes the environment,
    and its rows are embed_file's."""
    import transformer_core as tc

    f = write_lines(tmp_path / "c.txt", corpus_lines(30))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=10)
    original = tc.get_num_threads()
    mine = 3 if original != 3 else 2
    out = tmp_path / "out.parquet"
    try:
        tc.set_num_threads(mine)
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                                      silence_logs=logging.ERROR) as c, distributed.Client(c) as client:
            env = dict(os.environ)
            r = embed_corpus(f, out, model=str(tiny_model_dir), scheduler=client, threads_per_worker=1, chunk_size=10)
            assert tc.get_num_threads() == mine
            assert dict(os.environ) == env
    finally:
        tc.set_num_threads(original)
    assert (r.rows, r.chunks_computed) == (30, 3)
    assert_same_rows(out, ref)


def test_a_scheduler_that_never_answers_or_needs_tls_is_named_in_bounded_time(tmp_path, tiny_model_dir, monkeypatch):
    """A port that accepts connections but is not a Dask scheduler: Dask's handshake has no timeout,
    and Client waited forever. Now an OSError naming ``scheduler`` after CONNECT_TIMEOUT; a tls://
    address without security settings is a ValueError naming it (was Dask's bare TypeError)."""
    import socket

    from transformer_core import distributed

    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT", 1.0)
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    t0 = time.perf_counter()
    with pytest.raises(OSError, match=rf"^scheduler: cannot connect to '{address}' \(no answer within 1 s"):
        embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=address)
    assert time.perf_counter() - t0 < 10
    listener.close()
    with pytest.raises(ValueError, match=r"^scheduler: cannot use 'tls://127.0.0.1:1' \(TypeError: .*given as a Client"):
        embed_corpus(f, tmp_path / "t.parquet", model=str(tiny_model_dir), scheduler="tls://127.0.0.1:1")
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "t.parquet").exists()


def test_an_interrupt_before_the_run_started_says_nothing_was_written(tmp_path, tiny_model_dir, cluster,
                                                                      monkeypatch):
    """Ctrl-C while the workers are set up (here: while the encoder plugin is registered) comes
    before anything is written: the message says so instead of pointing --resume at chunks that do
    not exist, and a complete output that overwrite was to replace is the old one, unchanged."""
    c, client = cluster
    model = str(tiny_model_dir)
    f = write_lines(tmp_path / "c.txt", corpus_lines(30))

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(client, "register_plugin", ctrl_c)
    out = tmp_path / "e.parquet"
    with pytest.raises(KeyboardInterrupt) as info:
        embed_corpus(f, out, model=model, scheduler=client, chunk_size=10)
    assert str(info.value) == (f"interrupted before the run started (while the cluster and its workers were set "
                               f"up): nothing was written to {out}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(corpus_lines(30, 100), ref, model=model, chunk_size=10)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(KeyboardInterrupt, match="^interrupted before the run started .*nothing was written to "):
        embed_corpus(f, ref, model=model, scheduler=client, chunk_size=10, overwrite=True)
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert read_sorted(ref)[1] == corpus_lines(30, 100)
    monkeypatch.undo()
    # Ctrl-C inside job.start() (here: while it removes the output overwrite replaces): the old
    # output may be gone, and the message says so instead of "nothing was written"
    monkeypatch.setattr(corpus, "_remove_trash", ctrl_c)
    with pytest.raises(KeyboardInterrupt, match=rf"^interrupted while the output was being prepared: "
                                                rf"{re.escape(str(ref))} may be partly removed or made"):
        embed_corpus(f, ref, model=model, scheduler=client, chunk_size=10, overwrite=True)
    monkeypatch.undo()
    r = embed_corpus(f, out, model=model, scheduler=client, chunk_size=10)
    expected = tmp_path / "expected.parquet"
    corpus.embed_file(f, expected, model=model, chunk_size=10)
    assert r.rows == 30 and r.chunks_computed == 3
    assert_same_rows(out, expected)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_local_cluster_starts_is_the_one_line(tmp_path, tiny_model_dir, signame):
    """Ctrl-C or SIGTERM (the same interrupt in the CLI) while the local cluster's workers start,
    inside LocalCluster(): its half-started workers made Dask's close at exit print a traceback
    (AssertionError: Status.init) after a bare "interrupted". Now the interrupt is held until the
    cluster has started, the cluster is closed as any other, and the documented line is all. The
    signal is sent once, from inside the cluster's start (as the first worker starts), so it
    always lands while the cluster is being built."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    out = tmp_path / "o.parquet"
    script = tmp_path / "interrupt_start.py"
    script.write_text(
        "import os, signal, sys\n"
        "import transformer_core.distributed as td\n"
        "from transformer_core.__main__ import main\n"
        "class Interrupted(td.LocalCluster):\n"
        "    fired = False\n"
        "    async def _correct_state_internal(self):  # starts the workers\n"
        "        if not Interrupted.fired:\n"
        "            Interrupted.fired = True\n"
        f"            os.kill(os.getpid(), signal.{signame})\n"
        "        return await super()._correct_state_internal()\n"
        "if __name__ == '__main__':  # not in the spawned workers, which import this file\n"
        "    td.LocalCluster = Interrupted\n"
        "    sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, str(script), "embed", "--file", str(f), "--out", str(out), "--model",
                           str(tiny_model_dir), "--workers", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"transformer_core embed: interrupted before the run started (while the cluster and "
                           f"its workers were set up): nothing was written to {out}\n")
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "interrupt_start.py"]


def test_a_refused_scheduler_port_is_named_at_once(tmp_path, tiny_model_dir):
    """Nothing listens on the port: Dask's connect retried the refused connection for
    CONNECT_TIMEOUT (20 s) and then blamed "a port that accepts but is not a Dask scheduler". Now a
    plain TCP connection first: "connection refused" at once, nothing written."""
    import socket

    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the kernel refuses connections to it
    port = closed.getsockname()[1]
    try:
        for address in (f"tcp://127.0.0.1:{port}", f"127.0.0.1:{port}"):
            t0 = time.perf_counter()
            with pytest.raises(OSError, match=rf"^scheduler: cannot connect to '{re.escape(address)}' \(connection "
                                              rf"refused: nothing listens at 127\.0\.0\.1:{port}\)$"):
                embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=address)
            assert time.perf_counter() - t0 < 5
    finally:
        closed.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def _no_cluster(*args, **kwargs):
    raise AssertionError("a cluster was started")


def test_counts_beyond_their_bounds_are_refused_before_a_cluster_starts(tmp_path, tiny_model_dir, monkeypatch):
    """threads_per_worker above the core's 1024 threads was refused only inside every worker,
    after the cluster had started (a traceback on stderr, the error naming set_num_threads' `n`),
    and workers had no bound at all (10**9 reached LocalCluster). Both are refused up front."""
    import transformer_core.distributed as dist

    monkeypatch.setattr(dist, "LocalCluster", _no_cluster)
    f = write_lines(tmp_path / "c.txt", ["a", "b"])
    out = tmp_path / "e.parquet"
    for kwargs, error, match in (({"workers": 10**9}, ValueError, r"^workers: expected an int in \[1, 1024\], got 10{9}$"),
                                 ({"workers": 1025}, ValueError, r"^workers: expected an int in \[1, 1024\], got 1025$"),
                                 ({"workers": 2.0}, TypeError, "^workers: expected an int, got float 2.0$"),
                                 ({"workers": 1, "threads_per_worker": 1025}, ValueError,
                                  r"^threads_per_worker: expected an int in \[1, 1024\], got 1025$"),
                                 ({"workers": 1, "threads_per_worker": True}, TypeError,
                                  "^threads_per_worker: expected an int, got bool True$"),
                                 ({"scheduler": "tcp://127.0.0.1:1", "threads_per_worker": 2000}, ValueError,
                                  r"^threads_per_worker: expected an int in \[1, 1024\], got 2000$"),
                                 ({"workers": 1, "max_in_flight": 0}, ValueError, r"^max_in_flight: expected an int in "
                                                                                  r"\[1, 2\*\*63 - 1\], got 0$")):
        t0 = time.perf_counter()
        with pytest.raises(error, match=match):
            embed_corpus(f, out, model=str(tiny_model_dir), **kwargs)
        assert time.perf_counter() - t0 < 5, kwargs
    assert dist.MAX_WORKERS == 1024
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_a_model_that_cannot_be_loaded_is_one_error_before_a_cluster_starts(tmp_path, tiny_model_dir, monkeypatch):
    """The client never loaded the model: a truncated model.safetensors or a missing tokenizer.json
    started a cluster whose every worker printed a traceback. The client loads it first, as
    embed_file does: the same error, before any cluster starts and before anything is written."""
    import shutil

    import transformer_core.distributed as dist

    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:2_000_000])
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_model_dir, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    data = tmp_path / "data"
    data.mkdir()
    f = write_lines(data / "c.txt", corpus_lines(30))
    monkeypatch.setattr(dist, "LocalCluster", _no_cluster)
    for model, error, match in ((truncated, ValueError, r"model\.safetensors: corrupt or truncated safetensors file"),
                                (no_tokenizer, FileNotFoundError, "^tokenizer.json: not found in model directory")):
        with pytest.raises(error, match=match) as single:
            corpus.embed_file(f, data / "single.parquet", model=str(model))
        with pytest.raises(error, match=match) as dask:
            embed_corpus(f, data / "dask.parquet", model=str(model), workers=1)
        assert str(dask.value) == str(single.value)
        with pytest.raises(error, match=match):  # a scheduler address: refused before connecting
            embed_corpus(f, data / "dask.parquet", model=str(model), scheduler="tcp://127.0.0.1:1")
    assert sorted(p.name for p in data.iterdir()) == ["c.txt"]


def test_a_local_cluster_takes_a_free_port_and_prints_nothing():
    """The cluster embed_corpus starts serves its scheduler's HTTP endpoints on a free port: with
    Dask's default 8787 taken (another cluster, a notebook's dashboard) it used to warn "Port 8787
    is already in use" on stderr."""
    import socket
    import warnings

    from transformer_core import distributed as tcd

    holder = socket.socket()
    try:
        try:
            holder.bind(("127.0.0.1", 8787))
            holder.listen()
        except OSError:  # something else holds it already: the case this test makes
            pass
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            client, cluster, owned, threads = tcd._connect(None, 1, 1)
        try:
            assert (owned, threads, len(cluster.workers)) == (True, 1, 1)
            assert cluster.scheduler.http_server.port != 8787
        finally:
            client.close()
            cluster.close()
    finally:
        holder.close()


def test_a_second_run_of_the_output_is_refused_while_one_runs(tmp_path, tiny_model_dir, cluster):
    """The client holds the output's lock from the run's start to its end: another run of the same
    out (overwrite=True with another input, or resume), started while the first is in flight, is
    refused instead of replacing its directory and manifest; the first finishes with exactly its
    own rows, bitwise the single-process run's, and leaves no lock behind."""
    c, client = cluster
    model = str(tiny_model_dir)
    old = write_lines(tmp_path / "old.txt", corpus_lines(120))
    new = write_lines(tmp_path / "new.txt", corpus_lines(60, 5000))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(old, ref, model=model, chunk_size=10)
    out = tmp_path / "e.parquet"
    refused = []

    def second_run(index, done):
        if done == 1:
            for inp, kwargs in ((new, {"overwrite": True}), (old, {"resume": True})):
                with pytest.raises(ValueError, match=f"^out: another run holds {re.escape(str(out))} ") as e:
                    embed_corpus(inp, out, model=model, scheduler=client, chunk_size=10, **kwargs)
                refused.append(e.value)

    r = embed_corpus(old, out, model=model, scheduler=client, chunk_size=10, on_chunk=second_run)
    assert r.rows == 120 and len(refused) == 2
    assert_same_rows(out, ref)
    assert read_sorted(out)[1] == corpus_lines(120) and np.array_equal(read_sorted(out)[2], read_sorted(ref)[2])
    assert not (tmp_path / ".e.parquet.lock").exists()
    r = embed_corpus(new, out, model=model, scheduler=client, chunk_size=10, overwrite=True)  # free once it ended
    assert r.rows == 60 and read_sorted(out)[1] == corpus_lines(60, 5000)


def test_the_jobs_connections_keep_no_copies_of_the_chunks_sent(tmp_path, tiny_model_dir, monkeypatch):
    """Dask keeps the recent messages of each connection (BatchedSend.recent_message_log: 1000 by
    default), and a chunk's texts travel in them: the client's process held a copy of every chunk
    sent (its Client's connection and, for its own local cluster, the scheduler's connections to
    the workers), so its memory grew with the corpus, not with max_in_flight. The connections the
    job makes keep none (DASK_LOG_LENGTH), and Dask's setting is restored afterwards."""
    import dask
    from transformer_core import distributed as tcd

    key = "distributed.admin.low-level-log-length"
    before = dask.config.get(key)
    f = write_lines(tmp_path / "c.txt", corpus_lines(60))
    made, seen = [], []
    connect = tcd._connect

    def recording_connect(*args):
        made.append(connect(*args))  # (client, cluster, own, threads)
        return made[-1]

    def logs(index, done):
        client, cluster = made[0][:2]
        comms = [client.scheduler_comm, *cluster.scheduler.stream_comms.values()]
        assert len(comms) == 2  # the client's, and the scheduler's to its one worker
        seen.append([(len(comm.recent_message_log), comm.recent_message_log.maxlen) for comm in comms])

    monkeypatch.setattr(tcd, "_connect", recording_connect)
    r = embed_corpus(f, tmp_path / "e.parquet", model=str(tiny_model_dir), workers=1, chunk_size=2, on_chunk=logs)
    assert r.rows == 60 and len(seen) == 30 and len(made) == 1
    assert all(entry == [(0, 0), (0, 0)] for entry in seen), seen[-1]  # (messages kept, at most), per comm
    assert tcd.DASK_LOG_LENGTH == 0
    assert dask.config.get(key) == before


def test_a_list_input_is_named_input(tmp_path, tiny_model_dir):
    """A list's bad item names embed_corpus's argument (it said ``texts``) and an empty list is "the
    list given as input" (it said "0 sentences given as arguments", the CLI's words); no cluster
    starts and nothing is written."""
    model = str(tiny_model_dir)
    with pytest.raises(ValueError, match="^input: expected some text, got an empty text at index 0$"):
        embed_corpus(["", "a"], tmp_path / "e.parquet", model=model, workers=1)
    with pytest.raises(ValueError) as e:
        embed_corpus([], tmp_path / "e.parquet", model=model, workers=1)
    assert str(e.value) == "input: the list given as input has no text to embed (it is empty)"
    assert os.listdir(tmp_path) == []


def test_overlapping_jobs_restore_dasks_log_length_when_the_last_ends():
    """Each job set the log length with its own dask.config.set, which restores what it found: two
    jobs in threads ending in the order they started left the process's setting at 0."""
    import dask
    from transformer_core import distributed

    key = "distributed.admin.low-level-log-length"
    before = dask.config.get(key)
    first, second = distributed._job_dask_settings(), distributed._job_dask_settings()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first job ends while the second runs
    assert dask.config.get(key) == distributed.DASK_LOG_LENGTH
    second.__exit__(None, None, None)
    assert dask.config.get(key) == before != distributed.DASK_LOG_LENGTH


def test_a_port_that_answers_other_bytes_is_an_oserror(tmp_path, tiny_model_dir):
    """A service that answers with its own bytes and hangs up (an HTTP server's 400, an SSH banner):
    Dask read the first 8 bytes as a frame length, and the job failed with numpy's MemoryError for
    exabytes (a traceback and rc 1 in the CLI). Now the OSError of a scheduler that cannot be
    reached, saying that something answered but not as a Dask scheduler; nothing written."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed at the end of the test
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    try:
        t0 = time.perf_counter()
        with pytest.raises(OSError, match=rf"^scheduler: cannot connect to '{address}' \(it answered, but not as "
                                          rf"a Dask scheduler: "):
            embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=address)
        assert time.perf_counter() - t0 < 10
    finally:
        listener.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_a_workers_or_nannys_address_is_not_a_scheduler(tmp_path, tiny_model_dir, cluster):
    """A worker's (or its nanny's) address given as scheduler: Client failed with a TypeError
    (Worker.identity() got an unexpected keyword argument), reported as "a scheduler that needs TLS
    or other security settings". Now a ValueError naming scheduler that says it is a Dask Worker
    (with its scheduler's address) or Nanny, not a scheduler; nothing written."""
    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    worker = sorted(client.scheduler_info()["workers"])[0]
    nanny = sorted(n.address for n in c.workers.values())[0]
    bad = r"^scheduler: expected a scheduler address such as 'tcp://host:8786', got "
    for address, match in ((worker, rf"a Dask Worker answered there, not a scheduler: its scheduler is "
                                    rf"'{re.escape(c.scheduler_address)}'\)$"),
                           (nanny, r"a Dask Nanny answered there, not a scheduler\)$")):
        with pytest.raises(ValueError, match=rf"{bad}'{re.escape(address)}' \({match}") as e:
            embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=address)
        assert "TLS" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_a_closed_client_is_named_scheduler(tmp_path, tiny_model_dir):
    """A closed Client (or one whose LocalCluster was closed) given as scheduler: the job failed
    with KeyError: 'workers' after the output's lock was taken. Now a ValueError naming scheduler,
    up front, with nothing written."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    for close in ("client", "cluster"):
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                                      silence_logs=logging.ERROR) as c:
            client = distributed.Client(c)
            (client if close == "client" else c).close()
            with pytest.raises(ValueError, match="^scheduler: expected a running Client, got one that is closed$"):
                embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=client)
            client.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_a_cluster_without_workers_is_a_bounded_error(tmp_path, tiny_model_dir, monkeypatch):
    """A given Client whose cluster has no worker: the job went on to submit and waited forever,
    holding the output's lock (a second run of it refused meanwhile). Now the same OSError naming
    scheduler as for the scheduler's address (which waited 60 s and raised Dask's
    WorkerStartTimeoutError), after WORKER_TIMEOUT, before anything is written."""
    import transformer_core.distributed as tcd

    monkeypatch.setattr(tcd, "WORKER_TIMEOUT", 1.0)
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    out = tmp_path / "o.parquet"
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0",
                                  silence_logs=logging.ERROR) as c, distributed.Client(c) as client:
        for scheduler in (client, c.scheduler_address):
            outcome = []

            def run(scheduler=scheduler, outcome=outcome):
                try:
                    outcome.append(embed_corpus(f, out, model=str(tiny_model_dir), scheduler=scheduler))
                except Exception as e:
                    outcome.append(e)

            thread = threading.Thread(target=run, daemon=True)
            t0 = time.perf_counter()
            thread.start()
            thread.join(30)
            assert not thread.is_alive(), f"still waiting for a worker ({scheduler!r})"
            assert time.perf_counter() - t0 < 25
            assert isinstance(outcome[0], OSError), outcome
            assert str(outcome[0]) == "scheduler: no worker joined the Dask cluster within 1 s; nothing was written"
            assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
    r = corpus.embed_file(f, out, model=str(tiny_model_dir))  # the lock is free
    assert r.rows == 5


def test_a_given_client_keeps_no_plugin_and_no_encoder(tmp_path, tiny_model_dir, cluster):
    """The job's worker plugin stayed registered on the caller's cluster after the job (and after a
    failed one): every worker kept every model it ever loaded, and every worker that started later
    loaded them all again. Now it is unregistered at the end, which drops the workers' encoder."""
    from transformer_core import distributed as tcd

    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(20))

    def plugins(dask_scheduler=None):
        return sorted(name for name in dask_scheduler.worker_plugins if name.startswith("transformer_core"))

    def encoders():
        from transformer_core import distributed as d

        return sorted(d._ENCODERS)

    fingerprint = corpus.model_identity(str(tiny_model_dir))["fingerprint"]
    seen = []
    r = embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=client, chunk_size=10,
                     on_chunk=lambda i, done: seen.append((client.run_on_scheduler(plugins), client.run(encoders))))
    assert r.rows == 20
    assert len(seen[0][0]) == 1 and any(fingerprint in fps for fps in seen[0][1].values())  # while it ran
    assert client.run_on_scheduler(plugins) == []
    assert all(fingerprint not in fps for fps in client.run(encoders).values())
    assert fingerprint not in tcd._ENCODERS  # the client's own process (no worker here)


def test_dask_is_quiet_while_the_job_runs(tmp_path, tiny_model_dir, cluster):
    """The CLI prints one line for an expected error, and nothing from Dask: Dask's ERROR lines
    (distributed.client when the scheduler goes away, distributed.scheduler when a worker dies)
    reached stderr with a traceback before that line, and a chunk of over 10 MB of text made Dask
    warn "Sending large graph" after a successful run. While a job on connections it makes runs,
    the distributed loggers are at CRITICAL and that warning is off; both restored afterwards."""
    import warnings

    import dask

    c, client = cluster
    f = write_lines(tmp_path / "c.txt", corpus_lines(40))
    loggers = ("distributed", "distributed.client", "distributed.scheduler", "distributed.worker")
    levels = {name: logging.getLogger(name).level for name in loggers}
    seen = []

    def on_chunk(index, done):
        seen.append([logging.getLogger(name).isEnabledFor(logging.ERROR) for name in loggers])

    key = "distributed.admin.large-graph-warning-threshold"
    with dask.config.set({key: "1kB"}), warnings.catch_warnings(record=True) as caught:  # every chunk is > 1 kB
        warnings.simplefilter("always")
        r = embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=c.scheduler_address,
                         chunk_size=20, on_chunk=on_chunk)
        assert dask.config.get(key) == "1kB"
    assert r.rows == 40 and len(seen) == 2
    assert not [w for w in caught if "large graph" in str(w.message)], [str(w.message) for w in caught]
    assert seen == [[False] * len(loggers)] * 2
    assert {name: logging.getLogger(name).level for name in loggers} == levels


def test_a_model_the_workers_cannot_load_names_model_and_the_worker(tmp_path, tiny_model_dir, cluster, monkeypatch):
    """A relative model path meant the client's directory, but the workers resolved it against
    their own: the job failed with "name_or_path: 'm' is neither a model directory ...", right after
    the client had loaded the same 'm'. The workers now get the absolute path; and a model a worker
    cannot load is an error naming model and the worker."""
    import shutil

    from transformer_core import distributed as tcd

    c, client = cluster
    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["_name_or_path"] = str(model)  # a fingerprint of its own: no worker has this encoder loaded yet
    (model / "config.json").write_text(json.dumps(config))
    f = write_lines(tmp_path / "c.txt", corpus_lines(20))
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(model), chunk_size=10)
    monkeypatch.chdir(tmp_path)  # the workers' directory stays the one they started in
    assert client.run(os.getcwd) != {w: str(tmp_path) for w in client.run(os.getcwd)}
    r = embed_corpus("c.txt", "o.parquet", model="m", scheduler=client, chunk_size=10)
    assert r.rows == 20
    assert_same_rows(tmp_path / "o.parquet", ref)
    missing = str(tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match=rf"^model: '{re.escape(missing)}' cannot be loaded on worker "
                                                rf"tcp://w:1 \(pid {os.getpid()}\): name_or_path: .* the workers must "
                                                rf"see the same model as the client$"):
        tcd._worker_encoder(missing, "0" * 64, "tcp://w:1")


def test_a_failed_registration_is_named_and_leaves_no_plugin(tmp_path, tiny_model_dir, monkeypatch):
    """The workers cannot load the model (here: they are given a path that does not exist): the
    registration's error names model and the worker, nothing is written, and the plugin that
    failed is not left registered on the caller's cluster (it stayed, and every worker started
    later failed to set it up)."""
    from transformer_core import distributed as tcd

    missing = str(tmp_path / "not_on_the_workers")
    monkeypatch.setattr(tcd, "_worker_model", lambda model: missing)
    f = write_lines(tmp_path / "c.txt", corpus_lines(5))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                                  silence_logs=logging.CRITICAL) as c, distributed.Client(c) as client:
        with pytest.raises(FileNotFoundError, match=rf"^model: '{re.escape(missing)}' cannot be loaded on worker "
                                                    rf"inproc://\S+ \(pid {os.getpid()}\): name_or_path: "):
            embed_corpus(f, tmp_path / "o.parquet", model=str(tiny_model_dir), scheduler=client)
        plugins = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.worker_plugins))
        assert not [name for name in plugins if name.startswith("transformer_core")], plugins
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
