"""transformer_core.corpus: embedding files into .npy / .parquet in chunks, resuming, searching.

References: ``SentenceEncoder.encode`` on the same lines (itself checked against transformers in
test_sentence_encoder.py), numpy brute force for search, and an uninterrupted run for resumed ones.
The outputs are read back here with numpy / pyarrow directly, not with the module's readers.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import transformer_core as tc
from conftest import MODEL_NAME, SENTENCES, corpus_lines
from transformer_core import corpus


# ------------------------------------------------------------------------------------------ helpers
def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def run_cli(*args, check=True, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "transformer_core", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def load_output(out: Path, data: Path | None = None):
    """(ids (N,), texts [N], embeddings (N, dim)) of an output, read with numpy / pyarrow."""
    out = Path(out)
    data = out if data is None else data
    if out.suffix == ".npy":
        emb = np.load(data)
        texts = [json.loads(line) for line in Path(f"{out}.texts.jsonl").read_text(encoding="utf-8").splitlines()]
        return np.arange(len(emb)), texts, emb
    table = pq.read_table(data)
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("text").type == pa.string()
    etype = table.schema.field("embedding").type
    assert pa.types.is_fixed_size_list(etype) and etype.value_type == pa.float32()
    table = table.sort_by("id")
    emb = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    return table.column("id").to_numpy(), table.column("text").to_pylist(), emb


def manifest(out) -> dict:
    return json.loads(Path(f"{out}.manifest.json").read_text())


def leftover_temps(directory: Path) -> list[str]:
    return sorted(p.name for p in Path(directory).rglob(".*tmp-*"))


@pytest.fixture(scope="module")
def encoder():
    return tc.SentenceEncoder.from_pretrained(MODEL_NAME)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_model_dir):
    return tc.SentenceEncoder.from_pretrained(str(tiny_model_dir))


# ------------------------------------------------------------------------ SentenceEncoder.encode
def test_encode_length_sorted_batches_keep_order(encoder):
    """Batches are cut from the length-sorted sentences; rows still follow the input order and
    match each sentence embedded alone (no padding at all)."""
    sentences = SENTENCES[::-1] + ["Hi.", SENTENCES[7]]
    emb = encoder.encode(sentences, batch_size=4)
    alone = np.concatenate([encoder.encode([s]) for s in sentences])
    assert emb.shape == (len(sentences), 384) and emb.dtype == np.float32
    np.testing.assert_allclose(emb, alone, atol=1e-6)
    np.testing.assert_array_equal(emb[-1], emb[len(SENTENCES) - 1 - 7])  # the same sentence twice
    np.testing.assert_allclose(encoder.encode(iter(sentences[:3])), emb[:3], atol=1e-6)  # any iterable


@pytest.mark.parametrize("kwargs, error, match", [
    ({"sentences": ["ok", 3]}, TypeError, "index 1"),
    ({"sentences": b"bytes"}, TypeError, "sentences"),
    ({"sentences": 5}, TypeError, "sentences"),
    ({"sentences": ["ok"], "batch_size": 0}, ValueError, "batch_size"),
    ({"sentences": ["ok"], "batch_size": 2.0}, TypeError, "batch_size"),
    ({"sentences": ["ok"], "batch_size": True}, TypeError, "batch_size"),
    ({"sentences": ["ok"], "normalize": "yes"}, TypeError, "normalize"),
    ({"sentences": ["ok"], "progress": 1}, TypeError, "progress"),
])
def test_encode_bad_arguments(tiny_encoder, kwargs, error, match):
    with pytest.raises(error, match=match):
        tiny_encoder.encode(**kwargs)


def test_encode_empty_list(tiny_encoder):
    out = tiny_encoder.encode([])
    assert out.shape == (0, 32) and out.dtype == np.float32


# -------------------------------------------------------------------------------------- readers
def test_text_reader_strips_and_skips_blank_lines(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"\xef\xbb\xbf  first line \r\n\n   \nsecond\tline\r\n\xc3\xa9t\xc3\xa9\nlast without newline")
    assert list(corpus.open_source(p)) == ["first line", "second\tline", "été", "last without newline"]


def test_jsonl_reader(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"text": "a", "n": 1}, {"body": "x", "text": "line\nwith newline"}, {"text": " b "}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert list(corpus.open_source(p)) == ["a", "line\nwith newline", " b "]  # kept as stored
    q = tmp_path / "u.jsonl"
    q.write_text('{"body": "x"}\n{"body": "y"}\n', encoding="utf-8")
    assert list(corpus.open_source(q, text_field="body")) == ["x", "y"]


@pytest.mark.parametrize("content, match", [
    ('{"text": "ok"}\n{"text": \n', "line 2: not valid JSON"),
    ('{"text": "ok"}\n["text"]\n', "line 2: expected a JSON object, got an array"),
    ('{"text": "ok"}\n\n{"body": "x"}\n', "line 3: no field 'text'"),
    ('{"text": 7}\n', "line 1: field 'text' is a number"),
    ('{"text": "\\ud800"}\n', "line 1: .*lone surrogate"),
    ('{"text": "ok"}\n' + "[" * 100000 + "]" * 100000 + "\n", "line 2: not valid JSON .nested too deeply"),
])
def test_jsonl_bad_records(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    kept = list(src)
    assert src.num_skipped == 1 and kept == (["ok"] if content.startswith('{"text": "ok"}') else [])


def test_csv_reader(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes('id,text,other\n1,plain,x\n2,"quoted, with comma",y\n3,"two\nlines",z\n\n4,"é ""q""",w\n'
                  .encode("utf-8"))
    assert list(corpus.open_source(p)) == ["plain", "quoted, with comma", "two\nlines", 'é "q"']
    assert list(corpus.open_source(p, text_field="other")) == ["x", "y", "z", "w"]
    with pytest.raises(ValueError, match="no column 'body'.*'id', 'text', 'other'"):
        list(corpus.open_source(p, text_field="body"))
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"text\nok\nbad \xff here\nshort,\n")
    with pytest.raises(ValueError, match="line 3: invalid UTF-8"):
        list(corpus.open_source(bad))
    assert list(corpus.open_source(bad, errors="skip")) == ["ok", "short"]


def test_parquet_reader(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"n": [1, 2, 3, 4], "body": ["a", None, "c", "é"]}), p, row_group_size=2)
    with pytest.raises(ValueError, match="row 2: column 'body' is null"):
        list(corpus.open_source(p, text_field="body"))
    src = corpus.open_source(p, text_field="body", errors="skip")
    assert list(src) == ["a", "c", "é"] and src.num_skipped == 1
    with pytest.raises(ValueError, match="no column 'text'"):
        list(corpus.open_source(p))
    with pytest.raises(ValueError, match="column 'n' has type int64"):
        list(corpus.open_source(p, text_field="n"))
    raw = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff\xfe"], pa.binary())}), raw)
    with pytest.raises(ValueError, match="row 2: invalid UTF-8"):
        list(corpus.open_source(raw))
    notpq = write_lines(tmp_path / "fake.parquet", ["not parquet"])
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        list(corpus.open_source(notpq))


def test_csv_field_longer_than_the_csv_modules_default_limit(tmp_path):
    """A valid CSV field of 200,000 characters (the csv module's default limit is 131,072) is read
    whole; the process-wide limit is the same afterwards, also after a reader left unfinished."""
    import csv

    long_text = "".join(SENTENCES) * (200_000 // len("".join(SENTENCES)) + 1)
    long_text = long_text[:200_000] + ' "quoted", multi\nline'
    rows = [["1", "short"], ["2", long_text], ["3", "after"]]
    p = tmp_path / "long.csv"
    with open(p, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([["id", "text"], *rows])
    limit = csv.field_size_limit()
    got = list(corpus.open_source(p))
    assert got == [r[1] for r in rows] and len(got[1]) == 200_021
    assert csv.field_size_limit() == limit
    it = iter(corpus.open_source(p))
    assert next(it) == "short" and next(it) == long_text and csv.field_size_limit() == limit
    with pytest.raises(csv.Error, match="field larger than field limit"):  # the default is unchanged
        list(csv.reader(open(p, encoding="utf-8", newline="")))


def test_parquet_dictionary_encoded_column(tmp_path):
    """A dictionary-encoded string column (what a pandas categorical becomes) is read through its
    dictionary: the same texts as the plain column, nulls refused or skipped by row."""
    values = ["b", "a", "é", "b", None, "c", "a"]
    p = tmp_path / "cat.parquet"
    pq.write_table(pa.table({"text": pa.array(values).dictionary_encode()}), p, row_group_size=3)
    assert pa.types.is_dictionary(pq.ParquetFile(p).schema_arrow.field("text").type)
    with pytest.raises(ValueError, match="row 5: column 'text' is null"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    assert list(src) == [v for v in values if v is not None] and src.num_skipped == 1
    ints = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": pa.array([1, 2, 1]).dictionary_encode()}), ints)
    with pytest.raises(ValueError, match="column 'text' has type int64, expected a string column"):
        list(corpus.open_source(ints))


def test_text_reader_invalid_utf8_names_the_line(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"good one\ngood two\nbad \xc3\x28 line\n\nlast \xff\n")
    with pytest.raises(ValueError, match=r"line 3: invalid UTF-8 \(byte 5"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    assert list(src) == ["good one", "good two"]
    assert src.num_skipped == 2 and [w for w, _ in src.skipped] == ["line 3", "line 5"]


def test_open_source_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        corpus.open_source(tmp_path / "missing.txt")
    with pytest.raises(IsADirectoryError):
        corpus.open_source(tmp_path)
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"abc\x00\x01\x02" * 10)
    with pytest.raises(ValueError, match="binary file .*offset 3"):
        corpus.open_source(binary)
    with pytest.raises(ValueError, match="binary"):
        corpus.open_source(binary, input_format="jsonl")
    text = write_lines(tmp_path / "t.txt", ["x"])
    with pytest.raises(ValueError, match="input_format"):
        corpus.open_source(text, input_format="xml")
    with pytest.raises(ValueError, match="errors"):
        corpus.open_source(text, errors="ignore")
    with pytest.raises(ValueError, match="text_field: only for"):
        corpus.open_source(text, text_field="text")
    with pytest.raises(TypeError, match=r"^path: expected a str or os.PathLike, got int$"):
        corpus.open_source(3)


def test_open_source_errors_name_its_argument(tmp_path, tiny_model_dir):
    """open_source's errors said ``input:``, an argument it does not have (its parameter is
    ``path``); now they name ``path``, while embed_file and embed_corpus (whose argument is
    ``input``) say ``input`` and the CLI ``--file``. Nothing is written by any of them."""
    missing = tmp_path / "missing.txt"
    text = write_lines(tmp_path / "t.txt", ["x"])
    cases = [(missing, FileNotFoundError, rf"{re.escape(str(missing))}: no such file$"),
             (tmp_path, IsADirectoryError, rf"{re.escape(str(tmp_path))} is a directory, expected a file$"),
             ("/dev/null", ValueError, r"/dev/null is not a regular file \(a pipe or a device\)"),
             (str(text) + "\0", ValueError, r"expected a path, got '.*t\.txt\\x00', which holds a NUL character"),
             (None, TypeError, r"expected a str or os\.PathLike, got NoneType$")]
    for path, error, match in cases:
        with pytest.raises(error, match="^path: " + match):
            corpus.open_source(path)
        with pytest.raises(error, match="^input: " + match):
            corpus.embed_file(path, tmp_path / "e.npy", model=str(tiny_model_dir))
    assert sorted(os.listdir(tmp_path)) == ["t.txt"]
    proc = run_cli("embed", "--file", missing, "--out", tmp_path / "e.npy", check=False)
    assert proc.returncode == 2 and proc.stderr == f"transformer_core embed: --file: {missing}: no such file\n"
    # the CLI names its flags for the file's content and options too (they said input and text_field)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for out in ((), ("--out", tmp_path / "e.npy")):
        proc = run_cli("embed", "--file", empty, *out, "--model", tiny_model_dir, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith(f"transformer_core embed: --file: {empty} (text) has "
                                                               "no text to embed"), proc.stderr
        assert proc.stderr.count("\n") == 1
    proc = run_cli("embed", "--file", text, "--text-field", "body", check=False)
    assert proc.returncode == 2 and proc.stderr == (f"transformer_core embed: --text-field: only for jsonl, csv and "
                                                    f"parquet input; {text} is read as text, one per line\n")
    with pytest.raises(ValueError, match="^input: .* has no text to embed"):
        corpus.embed_file(empty, tmp_path / "e.npy", model=str(tiny_model_dir))
    with pytest.raises(ValueError, match="^text_field: only for jsonl"):
        corpus.open_source(text, text_field="body")


# ------------------------------------------------------------- equality with SentenceEncoder.encode
N_REAL = 5000


@pytest.fixture(scope="module")
def real_corpus(tmp_path_factory, encoder):
    """5,000 lines, and SentenceEncoder.encode of them (the reference)."""
    lines = corpus_lines(N_REAL)
    path = write_lines(tmp_path_factory.mktemp("real") / "corpus.txt", lines)
    return path, lines, encoder.encode(lines, progress=False)


def test_real_model_npy_equals_encode(real_corpus, tmp_path):
    path, lines, ref = real_corpus
    out = tmp_path / "emb.npy"
    proc = run_cli("embed", "--file", path, "--out", out, "--chunk-size", 700)
    assert f"{N_REAL} rows x 384" in proc.stdout
    assert "sentences/s" in proc.stderr and "5000/5000" in proc.stderr  # the progress bar
    ids, texts, emb = load_output(out)
    assert emb.shape == (N_REAL, 384) and emb.dtype == np.float32
    assert texts == lines
    np.testing.assert_allclose(emb, ref, atol=1e-6, rtol=0)
    m = manifest(out)
    assert m["complete"] and m["num_chunks"] == 8 and m["completed"] == [[0, 8]]
    assert m["model"]["dim"] == 384 and m["model"]["name"] == MODEL_NAME
    assert not Path(f"{out}.partial").exists() and leftover_temps(tmp_path) == []


def test_real_model_parquet_equals_encode(real_corpus, tmp_path):
    path, lines, ref = real_corpus
    out = tmp_path / "emb.parquet"
    result = corpus.embed_file(path, out, chunk_size=1200)
    assert (result.rows, result.dim, result.chunks, result.rows_computed) == (N_REAL, 384, 5, N_REAL)
    assert sorted(os.listdir(out)) == [f"part-{i:05d}.parquet" for i in range(5)]
    ids, texts, emb = load_output(out)
    np.testing.assert_array_equal(ids, np.arange(N_REAL))
    assert texts == lines
    np.testing.assert_allclose(emb, ref, atol=1e-6, rtol=0)
    first = pq.read_table(out / "part-00001.parquet")
    assert first.num_rows == 1200 and first.column("id")[0].as_py() == 1200


# --------------------------------------------------------------------------------- bounded memory
_PEAK_SCRIPT = """
import sys
from transformer_core.__main__ import main
rc = main(sys.argv[1:])
status = open("/proc/self/status").read().split("\\n")
print("VmHWM", rc, [l.split()[1] for l in status if l.startswith("VmHWM")][0])
"""


def _peak_rss_kib(args) -> int:
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("VmHWM")]
    assert proc.returncode == 0 and line, proc.stdout + proc.stderr[-2000:]
    _, rc, kib = line[0].split()
    assert rc == "0", proc.stderr[-2000:]
    return int(kib)


@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_peak_memory_does_not_grow_with_the_file(tmp_path, tiny_model_dir, kind):
    """Peak RSS of a 50,000-line run is within a small margin of a 5,000-line run's (chunks of 500):
    the input is streamed, the .npy written one chunk at a time."""
    peaks = {}
    for n in (5000, 50000):
        f = write_lines(tmp_path / f"c{n}.txt", corpus_lines(n))
        out = tmp_path / f"e{n}.{kind}"
        peaks[n] = _peak_rss_kib(["embed", "--file", f, "--out", out, "--model", tiny_model_dir,
                                  "--chunk-size", 500, "--no-progress"])
        assert manifest(out)["complete"] and manifest(out)["num_rows"] == n
    margin = 8 * 1024  # KiB; the 50,000 x 32 float32 output alone is 6.1 MiB
    assert peaks[50000] <= peaks[5000] + margin, peaks


# ------------------------------------------------------------------------------ interrupt, resume
N_KILL, CHUNK_KILL = 10000, 250


@pytest.fixture(scope="module")
def kill_corpus(tmp_path_factory, tiny_model_dir):
    """A 10,000-line corpus and its uninterrupted outputs (both kinds), with the tiny model."""
    d = tmp_path_factory.mktemp("kill")
    path = write_lines(d / "corpus.txt", corpus_lines(N_KILL))
    refs = {}
    for kind in ("npy", "parquet"):
        out = d / f"ref.{kind}"
        corpus.embed_file(path, out, model=str(tiny_model_dir), chunk_size=CHUNK_KILL)
        refs[kind] = load_output(out)
    return path, refs


def _start_and_interrupt(args, out: Path, sig: int, after_chunks: int = 3):
    """Runs the CLI, sends ``sig`` once the manifest shows ``after_chunks`` chunks done."""
    # a shell's background job ignores SIGINT and its children inherit that: restore the default so
    # that Python installs its Ctrl-C handler in the child wherever the tests run
    proc = subprocess.Popen([sys.executable, "-m", "transformer_core", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    man = Path(f"{out}.manifest.json")
    deadline = time.monotonic() + 300
    done = []
    while time.monotonic() < deadline and proc.poll() is None:
        if man.exists():
            done = corpus.completed_chunks(json.loads(man.read_text()))
            if len(done) >= after_chunks:
                break
        time.sleep(0.002)
    assert proc.poll() is None, f"the run ended before it could be interrupted: {proc.communicate()}"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize("kind, sig", [("npy", signal.SIGKILL), ("parquet", signal.SIGKILL),
                                       ("npy", signal.SIGINT), ("parquet", signal.SIGTERM)],
                         ids=["npy-SIGKILL", "parquet-SIGKILL", "npy-SIGINT", "parquet-SIGTERM"])
def test_interrupted_run_resumes_to_the_uninterrupted_rows(tmp_path, tiny_model_dir, kill_corpus, kind, sig):
    path, refs = kill_corpus
    out = tmp_path / f"emb.{kind}"
    args = ["embed", "--file", path, "--out", out, "--model", tiny_model_dir, "--chunk-size", CHUNK_KILL]
    rc, _, stderr = _start_and_interrupt(args + ["--no-progress"], out, sig)
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
    else:  # Ctrl-C / kill: one line, what is saved, how to go on
        assert rc == 2 and "Traceback" not in stderr, stderr
        assert stderr.startswith("transformer_core embed: interrupted: ") and "--resume" in stderr, stderr
    m = manifest(out)
    done = sorted(corpus.completed_chunks(m))
    assert not m["complete"] and 3 <= len(done) < m["num_chunks"] == N_KILL // CHUNK_KILL
    assert done == list(range(len(done)))
    # Nothing at OUT looks complete; the partial output holds exactly the chunks done, valid.
    assert not out.exists()
    partial = Path(f"{out}.partial")
    ref_ids, ref_texts, ref_emb = refs[kind]
    rows = len(done) * CHUNK_KILL
    if kind == "npy":
        emb = np.load(partial)
        assert emb.shape == ref_emb.shape
        np.testing.assert_array_equal(emb[:rows], ref_emb[:rows])
    else:
        parts = sorted(p.name for p in partial.glob("part-*.parquet"))
        assert parts[:len(done)] == [f"part-{i:05d}.parquet" for i in done]
        table = pq.read_table(partial / "part-00002.parquet")
        np.testing.assert_array_equal(table.column("id").to_numpy(), np.arange(2 * CHUNK_KILL, 3 * CHUNK_KILL))
    hits = corpus.search(out, "a man is playing a guitar", k=3, allow_incomplete=True)[0]
    assert len(hits) == 3 and all(h.id < rows or h.id // CHUNK_KILL in done for h in hits)
    with pytest.raises(ValueError, match="incomplete"):
        corpus.search(out, "query")
    # Resume: only the remaining chunks are computed.
    proc = run_cli(*args, "--resume", "--json", "--no-progress")
    info = json.loads(proc.stdout)
    assert info["rows"] == N_KILL and info["rows_computed"] <= N_KILL - rows
    ids, texts, emb = load_output(out)
    np.testing.assert_array_equal(ids, ref_ids)
    assert texts == ref_texts
    np.testing.assert_array_equal(emb, ref_emb)
    assert manifest(out)["complete"] and not partial.exists() and leftover_temps(tmp_path) == []
    # Resuming a complete output does nothing.
    again = json.loads(run_cli(*args, "--resume", "--json", "--no-progress").stdout)
    assert again["rows_computed"] == 0


def test_resume_refuses_another_model_or_input(tmp_path, tiny_model_dir):
    lines = corpus_lines(60)
    f = write_lines(tmp_path / "c.txt", lines)
    out = tmp_path / "e.npy"
    corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=25)
    before = out.read_bytes(), Path(f"{out}.manifest.json").read_bytes()
    with pytest.raises(ValueError, match="another model: .*tiny_bert.*all-MiniLM-L6-v2"):
        corpus.embed_file(f, out, model=MODEL_NAME, resume=True)
    with pytest.raises(ValueError, match="chunk size 25, got 30"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=30, resume=True)
    write_lines(f, lines + ["one more line"])
    with pytest.raises(ValueError, match="not the one .* size differs"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)
    write_lines(f, ["X" + lines[0][1:]] + lines[1:])  # same size, other content
    with pytest.raises(ValueError, match="content \\(first MiB\\) differs"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)
    assert (out.read_bytes(), Path(f"{out}.manifest.json").read_bytes()) == before  # untouched
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        corpus.embed_file(f, tmp_path / "other.npy", model=str(tiny_model_dir), resume=True)
    with pytest.raises(FileExistsError, match="already exists \\(complete\\).*--overwrite"):
        corpus.embed_file(f, out, model=str(tiny_model_dir))
    r = corpus.embed_file(f, out, model=str(tiny_model_dir), overwrite=True, chunk_size=7)
    assert r.rows == 60 and manifest(out)["num_chunks"] == 9 and load_output(out)[1][0].startswith("X")


def test_skip_mode_ids_follow_the_kept_lines(tmp_path, tiny_model_dir, tiny_encoder):
    f = tmp_path / "c.txt"
    f.write_bytes(b"first\nbad \xff\nsecond\n\nthird \xfe\xfe\nfourth\n")
    out = tmp_path / "e.parquet"
    with pytest.raises(ValueError, match="line 2: invalid UTF-8"):
        corpus.embed_file(f, out, model=str(tiny_model_dir))
    assert not out.exists() and not Path(f"{out}.partial").exists() and not Path(f"{out}.manifest.json").exists()
    r = corpus.embed_file(f, out, model=str(tiny_model_dir), errors="skip")
    assert r.rows == 3 and r.num_skipped == 2 and [w for w, _ in r.skipped] == ["line 2", "line 5"]
    ids, texts, emb = load_output(out)
    assert ids.tolist() == [0, 1, 2] and texts == ["first", "second", "fourth"]
    np.testing.assert_allclose(emb, tiny_encoder.encode(texts, normalize=True), atol=1e-6)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_structured_inputs_embed_their_field(tmp_path, tiny_model_dir, tiny_encoder, fmt):
    texts = corpus_lines(37)
    f = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        f.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    elif fmt == "csv":
        import csv

        with open(f, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "body"])
            w.writerows(enumerate(texts))
    else:
        pq.write_table(pa.table({"id": range(37), "body": texts}), f, row_group_size=10)
    out = tmp_path / "e.npy"
    corpus.embed_file(f, out, model=str(tiny_model_dir), text_field="body", chunk_size=8)
    _, got_texts, emb = load_output(out)
    assert got_texts == texts
    np.testing.assert_allclose(emb, tiny_encoder.encode(texts, normalize=True), atol=1e-6)


def test_no_text_is_an_error_and_writes_nothing(tmp_path, tiny_model_dir):
    for name, content in (("empty.txt", b""), ("blank.txt", b"\n  \n\t\n")):
        f = tmp_path / name
        f.write_bytes(content)
        with pytest.raises(ValueError, match="no text to embed"):
            corpus.embed_file(f, tmp_path / "e.npy", model=str(tiny_model_dir))
    assert sorted(os.listdir(tmp_path)) == ["blank.txt", "empty.txt"]


def test_output_path_errors(tmp_path, tiny_model_dir):
    f = write_lines(tmp_path / "c.txt", ["a", "b"])
    with pytest.raises(FileNotFoundError, match="directory .*nope does not exist"):
        corpus.embed_file(f, tmp_path / "nope" / "e.npy", model=str(tiny_model_dir))
    with pytest.raises(ValueError, match="ending in .npy or .parquet"):
        corpus.embed_file(f, tmp_path / "e.txt", model=str(tiny_model_dir))
    with pytest.raises(ValueError, match="chunk_size"):
        corpus.embed_file(f, tmp_path / "e.npy", model=str(tiny_model_dir), chunk_size=0)
    assert sorted(os.listdir(tmp_path)) == ["c.txt"]


def test_out_that_is_the_input_is_refused_before_anything_is_removed(tmp_path, tiny_model_dir):
    """The output's paths must not be the input: the same path, a symlink or a hard link to it, or
    a dataset directory holding it. Refused with a ValueError naming out (--out), input untouched."""
    model = str(tiny_model_dir)
    data = tmp_path / "data.parquet"
    pq.write_table(pa.table({"text": ["one", "two", "three"]}), data)
    original = data.read_bytes()
    (tmp_path / "link.parquet").symlink_to(data)
    os.link(data, tmp_path / "hard.parquet")
    for out in (data, tmp_path / "link.parquet", tmp_path / "hard.parquet"):
        for kwargs in ({"overwrite": True}, {}, {"resume": True}):
            with pytest.raises(ValueError, match=r"^out: .* is the input .*data\.parquet: .*\(another out / --out\)"):
                corpus.embed_file(data, out, model=model, **kwargs)
    txt = write_lines(tmp_path / "e.npy.partial", ["a", "b"])
    with pytest.raises(ValueError, match=r"^out: .*e\.npy\.partial is the input"):
        corpus.embed_file(txt, tmp_path / "e.npy", model=model, input_format="text")  # no path the run uses
    inner = tmp_path / "ds.parquet"
    corpus.embed_file(data, inner, model=model)
    part = inner / "part-00000.parquet"
    part_bytes = part.read_bytes()
    with pytest.raises(ValueError, match=r"^out: .*ds\.parquet holds the input .*part-00000\.parquet"):
        corpus.embed_file(part, inner, model=model, overwrite=True)
    # an input reached THROUGH the output directory (a link inside it to a file elsewhere, or a
    # ".." out of it) stops existing when the output is removed: refused too, spelled as given
    (inner / "corpus.parquet").symlink_to(data)
    for through in (inner / "corpus.parquet", inner / ".." / "data.parquet"):
        with pytest.raises(ValueError, match=r"^out: .*ds\.parquet holds the input .*"):
            corpus.embed_file(through, inner, model=model, overwrite=True)
    (inner / "corpus.parquet").unlink()
    assert data.read_bytes() == original and part.read_bytes() == part_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.parquet", "ds.parquet", "ds.parquet.manifest.json",
                                                          "e.npy.partial", "hard.parquet", "link.parquet"]
    corpus.embed_file(data, tmp_path / "other.parquet", model=model)  # another path is fine
    assert load_output(tmp_path / "other.parquet")[1] == ["one", "two", "three"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_size": 0}, ValueError, "^batch_size: expected an int in \\[1, 2\\*\\*63 - 1\\], got 0$"),
    ({"batch_size": "8"}, TypeError, "^batch_size: expected an int, got str '8'$"),
    ({"batch_size": 2.5}, TypeError, "^batch_size: expected an int, got float 2.5$"),
    ({"progress": "yes"}, TypeError, "^progress: expected a bool, got str 'yes'$"),
    ({"overwrite": 1}, TypeError, "^overwrite: expected a bool, got int 1$"),
    ({"quantize": "int4"}, ValueError, "^quantize: expected one of 'int8', got 'int4'$"),
    # beyond sys.maxsize it used to pass and fail in islice, after the old output was removed
    ({"chunk_size": 10**30}, ValueError, r"^chunk_size: expected an int in \[1, 2\*\*63 - 1\], got 10{30}$"),
    ({"chunk_size": 2.0}, TypeError, "^chunk_size: expected an int, got float 2.0$"),
    ({"model": 5}, TypeError, "^model: expected a str or path, got int$"),
    ({"model": " "}, ValueError, "^model: expected a model name or path, got ' '$"),
    ({"model": "no-such-model"}, FileNotFoundError, "^model: 'no-such-model' is neither a model directory"),
])
@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, tiny_model_dir, kwargs, error, match, kind):
    """Checked before the output is touched: nothing new is left behind, and a complete output
    that overwrite=True would replace is kept as it was (still searchable)."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(6))
    with pytest.raises(error, match=match):
        corpus.embed_file(f, tmp_path / f"new.{kind}", **{"model": str(tiny_model_dir), **kwargs})
    assert sorted(os.listdir(tmp_path)) == ["c.txt"]
    out = tmp_path / f"e.{kind}"
    corpus.embed_file(f, out, model=str(tiny_model_dir))
    before = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(error, match=match):
        corpus.embed_file(f, out, **{"model": str(tiny_model_dir), "overwrite": True, **kwargs})
    assert {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert corpus.search(out, corpus_lines(6)[2], k=1)[0][0].id == 2


def test_embed_summary_and_search_name_a_bad_model(tmp_path, tiny_model_dir, tiny_encoder):
    """``model`` is the argument's name in the message (not model_identity's ``name_or_path``);
    a good one still gives encode()'s rows and scores."""
    lines = corpus_lines(4)
    out = tmp_path / "e.npy"
    corpus.embed_file(lines, out, model=str(tiny_model_dir))
    for model, error, match in ((5, TypeError, "^model: expected a str or path, got int$"),
                                ("", ValueError, "^model: expected a model name or path, got ''$"),
                                ("no-such-model", FileNotFoundError, "^model: 'no-such-model' is neither")):
        with pytest.raises(error, match=match):
            corpus.embed_summary(lines, model=model)
        with pytest.raises(error, match=match):
            corpus.search(out, lines[1], model=model)
    s = corpus.embed_summary(lines, model=str(tiny_model_dir))
    np.testing.assert_array_equal(s.embeddings, tiny_encoder.encode(lines, normalize=True))
    hit = corpus.search(out, lines[1], k=1, model=str(tiny_model_dir))[0][0]
    q = tiny_encoder.encode([lines[1]], normalize=True)[0]
    assert hit.id == 1 and hit.text == lines[1] and abs(hit.score - float(q @ q)) < 1e-6


def test_embed_summary_checks_limit(tiny_model_dir):
    lines = corpus_lines(3)
    for limit, error, match in ((0, ValueError, "^limit: expected an int in \\[1, 2\\*\\*63 - 1\\], got 0$"),
                                (-1, ValueError, "^limit: expected an int in \\[1, 2\\*\\*63 - 1\\], got -1$"),
                                (True, TypeError, "^limit: expected an int, got bool True$"),
                                (2.0, TypeError, "^limit: expected an int, got float 2.0$")):
        with pytest.raises(error, match=match):
            corpus.embed_summary(lines[:1], model=str(tiny_model_dir), limit=limit)
    with pytest.raises(ValueError, match="^batch_size: expected an int in \\[1, 2\\*\\*63 - 1\\], got 0$"):
        corpus.embed_summary(lines, model=str(tiny_model_dir), batch_size=0)
    with pytest.raises(ValueError, match="^quantize: expected one of 'int8', got 'int4'$"):
        corpus.embed_summary(lines, model=str(tiny_model_dir), quantize="int4")
    s = corpus.embed_summary(lines, model=str(tiny_model_dir), limit=2)  # 3 > 2: summarised
    assert s.count == 3 and s.embeddings is None and -1 <= s.mean_cosine <= 1
    s = corpus.embed_summary(lines, model=str(tiny_model_dir), limit=3)
    assert s.count == 3 and s.embeddings.shape == (3, 32)


def test_embed_summary_takes_the_largest_limit(tiny_model_dir, tiny_encoder):
    """limit=2**63 - 1 is in the documented range, but limit + 1 went to itertools.islice, whose
    bound is sys.maxsize: its own ValueError ("Stop argument for islice() ...") named no argument.
    Now every text of a shorter source comes back; one over the range is refused, naming limit."""
    lines = corpus_lines(3)
    for limit in (2**63 - 1, np.int64(2**63 - 1), 2**63 - 2):
        s = corpus.embed_summary(lines, model=str(tiny_model_dir), limit=limit)
        assert s.count == 3 and s.texts == lines
        np.testing.assert_array_equal(s.embeddings, tiny_encoder.encode(lines, normalize=True))
    with pytest.raises(ValueError, match="^limit: expected an int in \\[1, 2\\*\\*63 - 1\\], got 9223372036854775808$"):
        corpus.embed_summary(lines, model=str(tiny_model_dir), limit=2**63)


def test_finish_keeps_only_the_parts_of_its_run(tmp_path, tiny_model_dir, tiny_encoder):
    """A part that is not the manifest's (a writer that got past every check) is removed at the end;
    a writer of another run is refused (ESTALE) and writes nothing; the marker does not stay."""
    lines = corpus_lines(25)
    out = tmp_path / "e.parquet"
    job = corpus.EmbedJob.prepare(corpus.ListSource(lines), out, corpus.model_identity(str(tiny_model_dir)),
                                  chunk_size=10)
    job.start()
    data = Path(f"{out}.partial")
    assert sorted(p.name for p in data.iterdir()) == [f".run-{job.run}"] and manifest(out)["run"] == job.run
    stray = tiny_encoder.encode(["stray"], normalize=True)
    with pytest.raises(OSError, match="not written: .*no marker .run-0123abcd.*no longer the data of run 0123abcd") as e:
        corpus.write_parquet_part(data, 7, 5, 70, ["stray"], stray, run="0123abcd")
    assert e.value.errno == errno.ESTALE
    writer = job.writer()
    for index, start, texts in job.pending():
        writer.write(start, texts, tiny_encoder.encode(texts, normalize=True))
        job.commit(index)
    corpus.write_parquet_part(data, 7, 5, 70, ["stray"], stray)  # no run given: nothing checks it
    (data / ".part-00001.parquet.tmp-1-abc").write_bytes(b"half")
    assert sorted(p.name for p in data.iterdir()) == [".part-00001.parquet.tmp-1-abc", f".run-{job.run}",
                                                      "part-00000.parquet", "part-00001.parquet",
                                                      "part-00002.parquet", "part-00007.parquet"]
    job.finish()
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    ids, texts, emb = load_output(out)
    assert ids.tolist() == list(range(25)) and texts == lines
    np.testing.assert_array_equal(emb, np.concatenate([tiny_encoder.encode(lines[a:a + 10], normalize=True)
                                                      for a in range(0, 25, 10)]))
    assert pq.read_table(out).num_rows == 25


def test_prepare_checks_its_arguments_before_anything_is_written(tmp_path, tiny_model_dir):
    """EmbedJob.prepare checked none of these: batch_size=0 was written into a manifest that
    read_manifest then refused as damaged, normalize='no' was stored as true, resume=1 taken as
    True, a model dict without 'dim' failed at start() with KeyError: 'dim', and a list as source
    with AttributeError. Each is now refused naming the argument, before anything is written."""
    f = write_lines(tmp_path / "c.txt", ["one", "two", "three"])
    out = tmp_path / "e.npy"
    mid = corpus.model_identity(str(tiny_model_dir))
    src = corpus.open_source(f)
    cases = [
        ({"batch_size": 0}, ValueError, r"^batch_size: expected an int in \[1, 2\*\*63 - 1\], got 0$"),
        ({"batch_size": True}, TypeError, "^batch_size: expected an int, got bool True$"),
        ({"batch_size": 2.0}, TypeError, "^batch_size: expected an int, got float 2.0$"),
        ({"chunk_size": 0}, ValueError, r"^chunk_size: expected an int in \[1, 2\*\*63 - 1\], got 0$"),
        ({"normalize": "no"}, TypeError, "^normalize: expected a bool, got str 'no'$"),
        ({"normalize": 0}, TypeError, "^normalize: expected a bool, got int 0$"),
        ({"resume": 1}, TypeError, "^resume: expected a bool, got int 1$"),
        ({"overwrite": "yes"}, TypeError, "^overwrite: expected a bool, got str 'yes'$"),
        ({"model": {"x": 1}}, ValueError, r"^model: expected a dict from model_identity\(\), with 'name' \(a str\); "
                                          r"got one with the keys \['x'\]$"),
        ({"model": str(tiny_model_dir)}, TypeError, r"^model: expected the dict of model_identity\(\) "
                                                    r"\(model_identity\(name\) makes it\), got str$"),
        ({"model": {k: v for k, v in mid.items() if k != "dim"}}, ValueError, r"^model: expected a dict from "
                                                                              r"model_identity\(\), with 'dim'"),
        ({"model": {**mid, "dim": 0}}, ValueError, "^model: expected 'dim' an int >= 1, got int 0$"),
        ({"model": {**mid, "dim": np.int64(32)}}, ValueError, "^model: expected 'dim' an int >= 1, got int64 32$"),
        ({"model": {**mid, "fingerprint": None}}, ValueError, "^model: expected 'fingerprint' a str, got NoneType"),
        ({"model": {**mid, "fingerprint_version": True}}, ValueError, "^model: expected 'fingerprint_version' an "
                                                                      "int >= 1, got bool True$"),
        ({"model": {**mid, "quantize": "int4"}}, ValueError, "^model: expected 'quantize' one of 'int8' .*got str "
                                                             "'int4'$"),
        ({"source": ["one", "two"]}, TypeError, r"^source: expected a TextSource \(open_source\) or a ListSource, "
                                                r"got list$"),
        ({"source": str(f)}, TypeError, "^source: expected a TextSource .*got str$"),
    ]
    for change, error, match in cases:
        kwargs = {"source": src, "out": out, "model": mid, **change}
        with pytest.raises(error, match=match):
            corpus.EmbedJob.prepare(**kwargs)
        # the same with an output that exists and would be replaced or resumed: still refused first
        with pytest.raises(error, match=match):
            corpus.EmbedJob.prepare(**{**kwargs, "resume": change.get("resume", True)})
    assert sorted(os.listdir(tmp_path)) == ["c.txt"]
    # what the checks let through is recorded as given: normalize false, batch_size an int
    job = corpus.EmbedJob.prepare(src, out, mid, normalize=np.bool_(False), batch_size=np.int64(7))
    job.start()
    job.close()
    man = corpus.read_manifest(out)
    assert man["normalize"] is False and man["batch_size"] == 7 and type(man["batch_size"]) is int
    assert man["model"] == mid and man["num_rows"] == 3


def test_resume_takes_the_run_over(tmp_path, tiny_model_dir):
    """A resumed run draws a new run id: the interrupted run's writers are refused from then on."""
    lines = corpus_lines(30)
    f = write_lines(tmp_path / "c.txt", lines)
    out = tmp_path / "e.parquet"
    ref = tmp_path / "ref.parquet"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=10)
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(str(tiny_model_dir)),
                                  chunk_size=10)
    job.start()
    old = job.run
    index, start, texts = next(job.pending())
    job.writer().write(start, texts, load_output(ref)[2][:10])
    job.commit(index)
    job.close()  # interrupted: its lock is released, its writers still carry its run id
    corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)
    new = manifest(out)["run"]
    assert new != old and manifest(out)["complete"]
    ids, texts, emb = load_output(out)
    rids, rtexts, remb = load_output(ref)
    assert texts == rtexts == lines and np.array_equal(emb, remb)
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    with pytest.raises(OSError, match=f"no longer the data of run {old}"):
        corpus.write_parquet_part(out, 5, 5, 50, ["x"], remb[:1], run=old)
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


# ------------------------------------------------------------------------------------------ search
@pytest.fixture(scope="module")
def search_index(tmp_path_factory, tiny_model_dir):
    """A tiny-model index of 403 lines in chunks of 50, in both formats."""
    d = tmp_path_factory.mktemp("search")
    lines = corpus_lines(400) + [SENTENCES[3], SENTENCES[3], SENTENCES[3]]  # near-ties at the end
    f = write_lines(d / "c.txt", lines)
    outs = {}
    for kind in ("npy", "parquet"):
        outs[kind] = d / f"e.{kind}"
        corpus.embed_file(f, outs[kind], model=str(tiny_model_dir), chunk_size=50)
    return lines, outs


def brute_force(emb: np.ndarray, q: np.ndarray):
    """Cosine of every row with q, in float64, and the rows ordered best first (ties: lower id)."""
    e = emb.astype(np.float64)
    scores = (e @ q.astype(np.float64)) / (np.linalg.norm(e, axis=1) * np.linalg.norm(q))
    return scores, np.lexsort((np.arange(len(scores)), -scores))


def assert_same_topk(hits, scores: np.ndarray, order: np.ndarray, k: int, tol: float = 1e-6):
    """``hits`` are the reference's top k: the same ids, except that rows whose scores differ by
    less than ``tol`` (float32 rounding) may trade places."""
    k = min(k, len(scores))
    ids = np.array([h.id for h in hits])
    got = np.array([h.score for h in hits])
    assert len(hits) == k and len(set(ids.tolist())) == k
    np.testing.assert_allclose(got, scores[ids], atol=tol)           # each score is its row's cosine
    np.testing.assert_allclose(got, scores[order[:k]], atol=tol)     # rank by rank, the reference's
    kth = scores[order[k - 1]]
    clear = set(order[:k][scores[order[:k]] > kth + tol].tolist())   # rows no tie can displace
    assert clear <= set(ids.tolist())
    near = np.abs(np.diff(scores[order[:k + 1]])) < tol              # no near-tie: the exact order
    if not near.any():
        assert ids.tolist() == order[:k].tolist()


@pytest.mark.parametrize("kind", ["npy", "parquet"])
@pytest.mark.parametrize("k", [1, 5, 17, 1000])
def test_search_equals_brute_force(search_index, tiny_encoder, kind, k):
    lines, outs = search_index
    _, _, emb = load_output(outs[kind])
    queries = ["A man is playing a guitar.", "weather", SENTENCES[3], "line 123"]
    results = corpus.search(outs[kind], queries, k=k, block_rows=37)
    qemb = tiny_encoder.encode(queries, normalize=True)
    for q, hits in zip(qemb, results):
        scores, order = brute_force(emb, q)
        assert_same_topk(hits, scores, order, k)
        assert [h.text for h in hits] == [lines[h.id] for h in hits]


def write_npy_index(out: Path, emb: np.ndarray, texts: list, model, chunk_size: int) -> Path:
    """A complete .npy index made by hand: the array, the texts sidecar, the manifest."""
    np.save(out, emb)
    Path(f"{out}.texts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    n = len(emb)
    chunks = -(-n // chunk_size)
    man = {"format": "transformer_core.embeddings", "version": 1, "kind": "npy",
           "model": corpus.model_identity(model), "dtype": "float32", "normalize": True, "input": {},
           "num_rows": n, "chunk_size": chunk_size, "num_chunks": chunks, "part_width": 5,
           "completed": [[0, chunks]], "complete": True}
    Path(f"{out}.manifest.json").write_text(json.dumps(man))
    return out


def test_search_real_model_equals_brute_force(real_corpus, tmp_path, encoder):
    """With all-MiniLM-L6-v2 (well-spread scores) the top-k ids are exactly numpy's."""
    path, lines, ref = real_corpus
    out = write_npy_index(tmp_path / "e.npy", ref, lines, MODEL_NAME, 1000)
    queries = ["A man is playing a guitar.", "What is the capital of France?", "Cats sleep a lot.", "pizza"]
    results = corpus.search(out, queries, k=10, block_rows=999)
    for q, hits in zip(encoder.encode(queries), results):
        scores, order = brute_force(ref, q)
        assert [h.id for h in hits] == order[:10].tolist()
        np.testing.assert_allclose([h.score for h in hits], scores[order[:10]], atol=1e-6)
        assert [h.text for h in hits] == [lines[i] for i in order[:10]]


_READ_PARTS_THEN_EXIT = """
import sys
from pathlib import Path
from transformer_core import corpus
index = Path(sys.argv[1])
man, data = corpus._open_index(index, False)
for chunk in sorted(corpus.completed_chunks(man)):
    table = corpus._read_part(man, data, index, chunk, ["id", "embedding", "text"])
print(table.num_rows)
"""


def test_reading_parquet_parts_then_exiting_never_aborts(search_index):
    # Each search reads its Parquet parts with pyarrow's read_table and may end the process right
    # after. Read through a Python file object, a dataset thread could drop the file's last
    # reference while the interpreter was finalizing, and the process aborted ("terminate called
    # without an active exception"; about half the runs of this script, 8 % of `search` commands).
    _, outs = search_index
    for _ in range(10):
        r = subprocess.run([sys.executable, "-c", _READ_PARTS_THEN_EXIT, str(outs["parquet"])], capture_output=True,
                           text=True, timeout=120)
        assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "3", "")


def test_search_ties_go_to_the_lower_id(tmp_path, tiny_model_dir, tiny_encoder):
    texts = corpus_lines(30)
    emb = tiny_encoder.encode(texts)
    emb[[4, 11, 29]] = emb[17]  # four identical rows, in different blocks
    out = write_npy_index(tmp_path / "e.npy", emb, texts, str(tiny_model_dir), 10)
    hits = corpus.search(out, texts[17], k=3, block_rows=5)[0]
    assert [h.id for h in hits] == [4, 11, 17]
    assert hits[0].score == hits[1].score == hits[2].score


def test_search_errors(search_index, tmp_path, tiny_model_dir):
    lines, outs = search_index
    with pytest.raises(FileNotFoundError, match="no such file"):
        corpus.search(tmp_path / "missing.npy", "q")
    plain = tmp_path / "plain.npy"
    np.save(plain, np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="no manifest"):
        corpus.search(plain, "q")
    with pytest.raises(ValueError, match="embedded with .*not 'all-MiniLM-L6-v2'"):
        corpus.search(outs["npy"], "q", model=MODEL_NAME)
    assert corpus.search(outs["npy"], "q", model=str(tiny_model_dir), k=2)[0][0].id >= 0
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        corpus.search(outs["npy"], "q", k=0)
    with pytest.raises(ValueError, match="^queries: expected a str or a non-empty list of str, got an empty list$"):
        corpus.search(outs["npy"], [])


def test_search_scores_do_not_depend_on_blocks_or_the_output_kind(search_index, tiny_encoder):
    """Every row's score is bitwise the same whatever block_rows (1, 3, all) and for the .npy and the
    .parquet of the same rows, so near-ties rank the same; and each is its row's cosine."""
    lines, outs = search_index
    _, _, emb = load_output(outs["npy"])
    assert np.array_equal(emb, load_output(outs["parquet"])[2])  # the same stored rows
    queries = ["A man is playing a guitar.", SENTENCES[3], "line 123", "weather"]
    runs = {(kind, b): corpus.search(outs[kind], queries, k=len(lines), block_rows=b)
            for kind in ("npy", "parquet") for b in (1, 3, len(lines))}
    ref = runs[("npy", len(lines))]
    for key, results in runs.items():
        for hits, ref_hits in zip(results, ref):
            assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in ref_hits], key
    for q, hits in zip(tiny_encoder.encode(queries, normalize=True), ref):
        scores, order = brute_force(emb, q)
        assert_same_topk(hits, scores, order, len(lines))
    # The scores of rows 400..402 (one text three times) are bitwise equal: ranked by id.
    assert [h.id for h in corpus.search(outs["npy"], SENTENCES[3], k=3, block_rows=401)[0]] == [400, 401, 402]


def test_search_names_a_missing_part_and_a_truncated_npy(search_index, tmp_path):
    import shutil

    lines, outs = search_index
    pq_out = tmp_path / "e.parquet"
    shutil.copytree(outs["parquet"], pq_out)
    shutil.copy(f"{outs['parquet']}.manifest.json", f"{pq_out}.manifest.json")
    (pq_out / "part-00003.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"index: {pq_out}/part-00003.parquet is missing: the part of chunk 3 (rows 150..199) of the "
            f"dataset {pq_out}, which its manifest {pq_out}.manifest.json records as done")):
        corpus.search(pq_out, "weather", k=3)
    npy_out = tmp_path / "e.npy"
    data = Path(outs["npy"]).read_bytes()
    npy_out.write_bytes(data[:-100])
    shutil.copy(f"{outs['npy']}.manifest.json", f"{npy_out}.manifest.json")
    with pytest.raises(ValueError, match="^" + re.escape(
            f"index: {npy_out} is truncated or damaged: its header says (403, 32) float32, {len(data):,} bytes, "
            f"the file holds {len(data) - 100:,}")):
        corpus.search(npy_out, "weather", k=3)


def test_completed_chunks_are_stored_as_ranges():
    rng = np.random.default_rng(1)
    for trial in range(20):
        order = rng.permutation(60)[: rng.integers(1, 61)]
        ranges: list = []
        for k, i in enumerate(order):
            corpus._add_to_ranges(ranges, int(i))
            corpus._add_to_ranges(ranges, int(i))  # twice: no change
            assert corpus.completed_chunks({"completed": ranges}) == set(order[:k + 1].tolist())
            flat = [x for r in ranges for x in r]
            assert flat == sorted(flat) and all(a < b for a, b in ranges)
            assert all(ranges[j][1] < ranges[j + 1][0] for j in range(len(ranges) - 1))  # merged
    ranges = []
    for i in range(1000):
        corpus._add_to_ranges(ranges, i)
    assert ranges == [[0, 1000]]


def test_completed_chunks_checks_its_manifest(search_index):
    """completed_chunks (public) of {} raised KeyError: 'completed', of None "'NoneType' object is
    not subscriptable"; now it names ``manifest`` and says what it expected."""
    _, outs = search_index
    man = corpus.read_manifest(outs["npy"])
    assert corpus.completed_chunks(man) == set(range(man["num_chunks"])) and man["num_chunks"] > 1
    assert corpus.completed_chunks({"completed": [[0, 2], [5, 7]]}) == {0, 1, 5, 6}
    assert corpus.completed_chunks({"completed": []}) == set()
    for bad, error, match in (
            (None, TypeError, r"^manifest: expected a dict \(as read_manifest returns\), got NoneType$"),
            ([[0, 1]], TypeError, r"^manifest: expected a dict \(as read_manifest returns\), got list$"),
            ({}, ValueError, r"^manifest: expected a dict with a 'completed' list of \[first, stop\) chunk ranges "
                             r"\(as read_manifest returns\), got one with the keys \[\]$"),
            ({"completed": None}, ValueError, r"^manifest: expected 'completed' a list of sorted, disjoint, "
                                              r"non-touching \[first, stop\) chunk ranges .*got NoneType None$"),
            ({"completed": [[2, 1]]}, ValueError, r"^manifest: expected 'completed' .*got list \[\[2, 1\]\]$"),
            ({"completed": [[0, 2], [2, 3]]}, ValueError, r"^manifest: expected 'completed' .*non-touching"),
            ({"completed": [[0, 1.5]]}, ValueError, r"^manifest: expected 'completed' "),
            ({"completed": [[-1, 1]]}, ValueError, r"^manifest: expected 'completed' "),
            # beyond the manifest's own chunks, and a range whose set would exhaust memory (it
            # was built, a MemoryError or the OOM killer)
            ({"completed": [[0, 5]], "num_chunks": 3}, ValueError,
             r"^manifest: expected 'completed' .*0 <= first < stop <= num_chunks, 3\), got list \[\[0, 5\]\]$"),
            ({"completed": [[0, 2**62]]}, ValueError, rf"^manifest: its completed ranges hold {2**62} chunk indices, "
                                                      r"a set of them more than this machine's memory")):
        with pytest.raises(error, match=match):
            corpus.completed_chunks(bad)


def test_merge_topk_is_independent_of_blocking():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 20, size=500).astype(np.float32)  # many ties
    ids = np.arange(500)
    ref = np.lexsort((ids, -scores))[:25]
    for block in (1, 7, 25, 26, 500):
        best = (np.empty(0, np.float32), np.empty(0, np.int64))
        for a in range(0, 500, block):
            best = corpus._merge_topk(*best, scores[a:a + block], ids[a:a + block], 25)
        assert best[1].tolist() == ref.tolist(), block


# ------------------------------------------------------------------------------ a full disk
def _cli(capsys, *args):
    """``main`` in this process (so that os functions can be patched): (exit code, stdout, stderr)."""
    from transformer_core.__main__ import main

    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_npy_output_on_a_full_disk_fails_before_writing(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The .npy's space is reserved when it is created: a disk too small is one error line, and
    nothing is left behind (no manifest, no partial data claiming rows)."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(40))
    out = tmp_path / "e.npy"
    reserved = []

    def full_disk(fd, offset, length):
        reserved.append((offset, length))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    rc, stdout, stderr = _cli(capsys, "embed", "--file", f, "--out", out, "--model", tiny_model_dir,
                              "--chunk-size", 10, "--no-progress")
    assert rc == 2 and stdout == ""
    assert stderr == (f"transformer_core embed: {out}.partial: No space left on device (reserving "
                      f"{reserved[0][1]:,} bytes for 40 x 32 float32 embeddings)\n")
    assert reserved == [(0, reserved[0][1])] and reserved[0][1] >= 40 * 32 * 4  # header + every row
    assert sorted(os.listdir(tmp_path)) == ["c.txt"]


def test_npy_write_refused_mid_run_keeps_the_manifest_true(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch,
                                                           capsys):
    """A write the disk refuses (a file system that cannot reserve space) is an OSError, not a
    SIGBUS: one error line, the manifest records only the chunks written, and --resume finishes."""
    lines = corpus_lines(40)
    f = write_lines(tmp_path / "c.txt", lines)
    out = tmp_path / "e.npy"
    args = ["embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--chunk-size", 10, "--no-progress"]
    pwrite = os.pwrite
    calls = []

    def fills_up(fd, data, offset):
        calls.append(offset)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", fills_up)
    rc, _, stderr = _cli(capsys, *args)
    assert rc == 2 and stderr == f"transformer_core embed: {out}.partial: No space left on device\n"
    m = manifest(out)
    assert m["completed"] == [[0, 2]] and not m["complete"] and not out.exists()
    sidecar = Path(f"{out}.texts.jsonl")
    assert [json.loads(t) for t in sidecar.read_text(encoding="utf-8").splitlines()] == lines[:20]
    assert sidecar.stat().st_size == m["texts_bytes"]
    emb = np.load(f"{out}.partial")
    np.testing.assert_allclose(emb[:20], tiny_encoder.encode(lines[:20], normalize=True), atol=1e-6)
    monkeypatch.undo()
    rc, _, stderr = _cli(capsys, *args, "--resume")
    assert rc == 0, stderr
    _, texts, emb = load_output(out)
    assert texts == lines
    np.testing.assert_allclose(emb, tiny_encoder.encode(lines, normalize=True), atol=1e-6)


# ------------------------------------------------------------------------------ checked inputs
def test_resume_names_a_different_quantize_setting(tmp_path, tiny_model_dir):
    f = write_lines(tmp_path / "c.txt", corpus_lines(20))
    out = tmp_path / "e.npy"
    corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=10)
    before = out.read_bytes(), Path(f"{out}.manifest.json").read_bytes()
    with pytest.raises(ValueError, match=r"^resume: .*e\.npy was embedded in float32 \(no --quantize\), this run "
                                         r"with --quantize int8; leaving out --quantize continues it"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True, quantize="int8")
    assert (out.read_bytes(), Path(f"{out}.manifest.json").read_bytes()) == before


def test_list_input_that_is_not_unicode_writes_nothing(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=r"^input: .*lone surrogate '\\udce9' at position 3 of the text at index 1"):
        corpus.embed_file(["fine", "caf\udce9"], tmp_path / "e.npy", model=str(tiny_model_dir))
    assert os.listdir(tmp_path) == []


def test_search_refuses_empty_or_invalid_queries(search_index):
    _, outs = search_index
    with pytest.raises(ValueError, match="^queries: expected some text, got an empty query at index 1$"):
        corpus.search(outs["npy"], ["fine", ""])
    with pytest.raises(ValueError, match="^queries: expected some text, got an all-whitespace query at index 0$"):
        corpus.search(outs["npy"], " \t")
    with pytest.raises(ValueError, match=r"^queries: .*lone surrogate '\\udce9' at position 3 of the text at index 0"):
        corpus.search(outs["npy"], "caf\udce9")


def test_read_manifest_nested_too_deeply(tmp_path):
    out = tmp_path / "e.npy"
    Path(f"{out}.manifest.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match=r"manifest.json: not a valid manifest \(nested too deeply\)"):
        corpus.read_manifest(out)


@pytest.mark.parametrize("changes, match", [
    ({"completed": None}, "no field 'completed'"),
    ({"completed": "x"}, "completed: expected sorted, .* got 'x'"),
    ({"completed": [[0, 99]]}, r"completed: .*within \[0, 9\] \(num_chunks\), got \[\[0, 99\]\]"),
    ({"completed": [[2, 4], [0, 1]]}, "completed: .* got"),     # not sorted
    ({"completed": [[0, 3], [2, 5]]}, "completed: .* got"),     # overlapping
    ({"completed": [[0, 2], [2, 5]]}, "completed: .* got"),     # touching: never written so
    ({"completed": [[1, 1]]}, "completed: .* got"),             # empty range
    ({"completed": [[0, 2.5]]}, "completed: .* got"),
    ({"complete": None}, "no field 'complete'"),
    ({"complete": "yes"}, "complete: expected true or false, got 'yes'"),
    ({"complete": True, "completed": [[0, 5]]}, r"completed: expected \[\[0, 9\]\] \(every chunk"),
    ({"num_chunks": 8}, r"num_chunks: expected 9 \(num_rows 403 / chunk_size 50"),
    ({"chunk_size": 0}, "chunk_size: expected an int >= 1, got 0"),
    ({"model": {"name": "m", "fingerprint": "f"}}, "no field 'model.dim'"),
    ({"kind": "csv"}, "kind: expected 'npy' or 'parquet', got 'csv'"),
    ({"texts_bytes": -1}, "texts_bytes: expected an int >= 0, got -1"),
])
def test_read_manifest_names_the_damaged_field(search_index, tmp_path, changes, match):
    _, outs = search_index
    man = manifest(outs["npy"])
    assert corpus.read_manifest(outs["npy"]) == man  # the real one passes
    man.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del man[key]
    out = tmp_path / "e.npy"
    Path(f"{out}.manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match=f"^{out}.manifest.json: a damaged manifest: {match}"):
        corpus.read_manifest(out)


def test_model_identity_stores_an_existing_path_absolute(tmp_path, tiny_model_dir, monkeypatch):
    """A relative --model path is recorded resolved, so `search` works from another folder; a name stays a name."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    ident = corpus.model_identity("m")
    assert ident["name"] == str((tmp_path / "m").resolve())
    assert ident["fingerprint"] == corpus.model_identity(tiny_model_dir)["fingerprint"]
    assert corpus.model_identity(MODEL_NAME)["name"] == MODEL_NAME


def test_model_identity_covers_a_default_prompt(tmp_path, tiny_model_dir):
    """A folder whose config_sentence_transformers.json names a non-empty default prompt (which
    encode puts before every text) has another fingerprint, so an output embedded without the
    prompt is not resumed or searched with it; an empty prompt or none keeps the fingerprint."""
    import shutil

    base = corpus.model_identity(tiny_model_dir)["fingerprint"]
    prints = {}
    for name, st in {"none": {"prompts": {"q": "query: "}}, "empty": {"prompts": {"q": ""}, "default_prompt_name": "q"},
                     "query": {"prompts": {"q": "query: "}, "default_prompt_name": "q"},
                     "passage": {"prompts": {"q": "passage: "}, "default_prompt_name": "q"}}.items():
        d = tmp_path / name
        shutil.copytree(tiny_model_dir, d)
        (d / "config_sentence_transformers.json").write_text(json.dumps(st))
        prints[name] = corpus.model_identity(d)["fingerprint"]
    assert prints["none"] == prints["empty"] == base
    assert len({base, prints["query"], prints["passage"]}) == 3


def test_model_identity_of_an_empty_default_prompt_is_that_of_no_prompt(tmp_path, tiny_model_dir):
    """An empty default prompt is no prompt (sentence-transformers 6), whatever include_prompt says:
    the same embeddings as no default prompt, and the same fingerprint. (Under the rule of
    sentence-transformers 2 to 4 it left [CLS] out of the pooling and had a fingerprint of its own.)"""
    import shutil

    from transformer_core import SentenceEncoder

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    prints, embeddings = {}, {}
    for name, st in {"none": {"prompts": {"q": ""}}, "empty": {"prompts": {"q": ""}, "default_prompt_name": "q"},
                     "query": {"prompts": {"q": "query: "}, "default_prompt_name": "q"}}.items():
        d = tmp_path / name
        shutil.copytree(tiny_model_dir, d)
        (d / "config_sentence_transformers.json").write_text(json.dumps(st))
        (d / "modules.json").write_text(json.dumps(modules))
        (d / "1_Pooling").mkdir()
        (d / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "include_prompt": False}))
        prints[name] = corpus.model_identity(d)["fingerprint"]
        embeddings[name] = SentenceEncoder.from_pretrained(d).encode(["a man plays a guitar"])
    np.testing.assert_array_equal(embeddings["none"], embeddings["empty"])
    assert prints["none"] == prints["empty"]
    assert np.abs(embeddings["none"] - embeddings["query"]).max() > 1e-3  # a prompt with tokens: another model
    assert prints["none"] != prints["query"]


def test_parquet_write_error_names_the_part(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A Parquet part the disk refuses (EFBIG, e.g. `ulimit -f`) is one error line naming the part,
    and no temp file is left behind."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(20))
    out = tmp_path / "e.parquet"

    def too_large(*a, **k):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(pq, "write_table", too_large)
    rc, stdout, stderr = _cli(capsys, "embed", "--file", f, "--out", out, "--model", tiny_model_dir,
                              "--chunk-size", 10, "--no-progress")
    assert rc == 2 and stdout == ""
    assert stderr == f"transformer_core embed: {out}.partial/part-00000.parquet: File too large\n"
    assert leftover_temps(Path(f"{out}.partial")) == []


# ------------------------------------------------------------------------------ paths given to the CLI and API
@pytest.mark.parametrize("args, flag", [
    (["embed", "--file", "{f}", "--out", ""], "--out"),
    (["embed", "--file", "{f}", "--out=", "--resume"], "--out"),
    (["embed", "--file", "", "hello"], "--file"),
    (["embed", "--file=", "--out", "e.npy"], "--file"),
    (["search", "--index", "", "hello"], "--index"),
])
def test_cli_refuses_an_empty_path(tmp_path, tiny_model_dir, monkeypatch, capsys, args, flag):
    """An empty path is a usage error naming its flag (exit 2, nothing printed on stdout, nothing
    written), not a flag left out: `--out ''` does not fall back to printing the similarity matrix,
    `--file '' hello` does not embed "hello"."""
    write_lines(tmp_path / "c.txt", ["one", "two"])
    monkeypatch.chdir(tmp_path)
    rc, stdout, stderr = _cli(capsys, *[a.replace("{f}", "c.txt") for a in args], "--model", tiny_model_dir,
                              *(["--no-progress"] if args[0] == "embed" else []))
    assert (rc, stdout) == (2, "")
    assert stderr == f"transformer_core {args[0]}: {flag}: expected a path, got ''\n"
    assert os.listdir(tmp_path) == ["c.txt"]


def test_paths_starting_with_a_tilde_are_in_the_home_directory(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch,
                                                               capsys):
    """``~`` is expanded in the corpus paths as in --model (the shell does not expand ``--out=~/x``):
    the CLI's --file, --out and --index, and the path arguments of the Python functions."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    lines = corpus_lines(20)
    write_lines(home / "c.txt", lines)
    ref = tiny_encoder.encode(lines, normalize=True)
    rc, stdout, stderr = _cli(capsys, "embed", "--file=~/c.txt", "--out=~/e.npy", "--model", tiny_model_dir,
                              "--chunk-size", 10, "--no-progress", "--json")
    assert rc == 0, stderr
    assert json.loads(stdout)["out"] == str(home / "e.npy")
    _, texts, emb = load_output(home / "e.npy")
    assert texts == lines
    np.testing.assert_allclose(emb, ref, atol=1e-6)
    assert manifest(home / "e.npy")["input"]["path"] == str(home / "c.txt")
    rc, stdout, stderr = _cli(capsys, "search", "--index=~/e.npy", lines[7], "-k", 1, "--json")
    assert rc == 0, stderr
    assert [h["id"] for h in json.loads(stdout)[0]["hits"]] == [7]
    # the Python API
    assert corpus.manifest_path("~/e.npy") == home / "e.npy.manifest.json"
    assert corpus.read_manifest("~/e.npy") == manifest(home / "e.npy")
    assert list(corpus.open_source("~/c.txt")) == lines
    result = corpus.embed_file("~/c.txt", "~/e.parquet", model=str(tiny_model_dir), chunk_size=10)
    assert result.out == home / "e.parquet"
    _, texts, emb = load_output(home / "e.parquet")
    assert texts == lines
    np.testing.assert_allclose(emb, ref, atol=1e-6)
    assert [h.id for h in corpus.search("~/e.parquet", lines[3], k=1)[0]] == [3]
    summary = corpus.embed_summary("~/c.txt", model=str(tiny_model_dir))
    np.testing.assert_allclose(summary.embeddings, ref, atol=1e-6)
    assert os.listdir(work) == []  # no directory named "~"


def test_out_under_a_regular_file_says_it_is_not_a_directory(tmp_path, tiny_model_dir, capsys):
    f = write_lines(tmp_path / "c.txt", ["one", "two"])
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    for out in (afile / "x.npy", afile / "sub" / "x.parquet"):
        with pytest.raises(NotADirectoryError, match=f"^out: {re.escape(str(afile))} is not a directory "
                                                     f"\\(for {re.escape(str(out))}\\)$"):
            corpus.embed_file(f, out, model=str(tiny_model_dir))
    rc, stdout, stderr = _cli(capsys, "embed", "--file", f, "--out", afile / "x.npy", "--model", tiny_model_dir,
                              "--no-progress")
    assert (rc, stdout) == (2, "")
    assert stderr == f"transformer_core embed: out: {afile} is not a directory (for {afile / 'x.npy'})\n"
    # a directory that does not exist is still named as such
    with pytest.raises(FileNotFoundError, match=f"^out: the directory {re.escape(str(tmp_path / 'no'))} does not "
                                                f"exist"):
        corpus.embed_file(f, tmp_path / "no" / "x.npy", model=str(tiny_model_dir))
    assert afile.read_text() == "x\n" and sorted(os.listdir(tmp_path)) == ["afile", "c.txt"]

# ------------------------------------------------------------------- inputs read twice, records cut short
def test_a_pipe_as_input_is_refused_before_anything_is_read(tmp_path):
    """A FIFO (as /dev/stdin or <(...)): refused, naming it, before any read (the first 8 KiB went
    to the binary check and were lost to the embedding; a named FIFO hung on its second open)."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=rf"^path: {re.escape(str(fifo))} is not a regular file .*save it to a file"):
        corpus.open_source(fifo)


def test_csv_records_with_broken_quotes_are_errors_not_texts(tmp_path):
    """A quote left open would swallow every later record into one text, and text after a closing
    quote was merged silently: both are errors of their record (strict) or skipped (skip)."""
    open_quote = write_lines(tmp_path / "a.csv", ["id,text", '1,"Hello', "2,world", "3,foo"])
    with pytest.raises(ValueError, match=r"a.csv, line 2: not valid CSV \(unexpected end of data\)"):
        list(corpus.open_source(open_quote))
    src = corpus.open_source(open_quote, errors="skip")
    assert list(src) == [] and src.num_skipped == 1
    after = write_lines(tmp_path / "b.csv", ["id,text", '1,"Hello," she said', "2,ok"])
    with pytest.raises(ValueError, match="b.csv, line 2: not valid CSV"):
        list(corpus.open_source(after))
    src = corpus.open_source(after, errors="skip")
    assert list(src) == ["ok"] and src.num_skipped == 1


def test_jsonl_integer_beyond_pythons_digit_limit_is_a_bad_record(tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_text('{"text": "a"}\n{"text": "b", "n": ' + "9" * 5000 + '}\n{"text": "c"}\n')
    with pytest.raises(ValueError, match="big.jsonl, line 2: not valid JSON"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    assert list(src) == ["a", "c"] and src.num_skipped == 1


def test_parquet_duplicated_or_damaged_columns_are_named(tmp_path):
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"]), dup)
    with pytest.raises(ValueError, match="dup.parquet: column 'text' appears 2 times"):
        list(corpus.open_source(dup))
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": [f"text number {i}" for i in range(10000)]}), bad, row_group_size=777)
    data = bytearray(bad.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 2000] = bytes(range(256)) * 7 + bytes(208)
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"bad.parquet, after row \d+: not a readable Parquet file"):
        list(corpus.open_source(bad, errors="skip"))


def _fail_third_chunk(monkeypatch, error: BaseException):
    """Makes the .npy writer raise ``error`` at its third chunk; returns a function that puts the
    real writer back."""
    write = corpus._NpyWriter.write
    calls = []

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise error
        return write(self, *args)

    monkeypatch.setattr(corpus._NpyWriter, "write", failing)
    return lambda: monkeypatch.setattr(corpus._NpyWriter, "write", write)


def _interrupted_after_two_chunks(tmp_path, model_dir, monkeypatch):
    """An .npy run of 50 lines in chunks of 10, interrupted (as Ctrl-C) during its third chunk:
    returns (input file, output path)."""
    f = write_lines(tmp_path / "c.txt", corpus_lines(50))
    out = tmp_path / "r.npy"
    restore = _fail_third_chunk(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        corpus.embed_file(f, out, model=str(model_dir), chunk_size=10)
    restore()
    return f, out


def test_resume_refuses_a_lost_texts_file_and_another_batch_size(tmp_path, tiny_model_dir, monkeypatch):
    """An interrupted .npy run whose texts file was deleted: the resume refuses it (it padded the
    file with NUL bytes, and search gave ids the texts of other rows); another batch size is
    refused (its rows would differ from an uninterrupted run's in the last bits)."""
    f = write_lines(tmp_path / "c.txt", [f"sentence {i}" for i in range(50)])
    out = tmp_path / "r.npy"
    restore = _fail_third_chunk(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError):
        corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=10, batch_size=4)
    restore()
    assert manifest(out)["batch_size"] == 4
    with pytest.raises(ValueError, match="batch_size: .* started with batch size 4, got 32"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)
    texts = Path(f"{out}.texts.jsonl")
    saved = texts.read_bytes()
    texts.unlink()
    with pytest.raises(ValueError, match=r"texts.jsonl: holds 0 of the \d+ bytes the finished chunks wrote"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True, batch_size=4)
    texts.write_bytes(saved)
    r = corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True, batch_size=4)
    assert r.rows == 50
    hit = corpus.search(out, ["sentence 1"], k=1, model=str(tiny_model_dir))[0][0]
    assert (hit.id, hit.text) == (1, "sentence 1")
    texts.write_bytes(texts.read_bytes()[:30])  # cut after the run: no texts rather than wrong ones
    with pytest.warns(corpus.TextsMissingWarning, match=r"texts.jsonl holds 30 bytes, its manifest"):
        assert corpus.search(out, ["sentence 1"], k=1, model=str(tiny_model_dir))[0][0].text is None


def test_a_querys_scores_do_not_depend_on_the_other_queries(search_index):
    lines, outs = search_index
    alone = corpus.search(outs["npy"], ["line 12"], k=5)[0]
    with_others = corpus.search(outs["npy"], ["line 12", "a much longer query " * 20, "x"], k=5)[0]
    assert [(h.id, h.score) for h in alone] == [(h.id, h.score) for h in with_others]


# ------------------------------------------------------------------------- concurrent runs, inputs
def _run_chunks(job, encoder, chunks=None):
    """Writes and commits ``job``'s pending chunks (the first ``chunks`` of them; all: None)."""
    writer = job.writer()
    for n, (index, start, texts) in enumerate(job.pending()):
        if chunks is not None and n == chunks:
            break
        job.commit(index, **writer.write(start, texts, encoder.encode(texts, batch_size=32, normalize=True)))
    writer.close()


def _two_runs_prepared(tmp_path, tiny_model_dir):
    """Six lines in in.txt and two runs prepared on the same out.npy before either started:
    ``(lines, input path, out, run a, run b)``."""
    lines = corpus_lines(6)
    f = write_lines(tmp_path / "in.txt", lines)
    out = tmp_path / "out.npy"
    mid = corpus.model_identity(str(tiny_model_dir))
    a = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=3, batch_size=32)
    b = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=3, batch_size=32)
    return lines, f, out, a, b


def test_a_second_npy_run_is_refused_while_the_first_holds_the_output(tmp_path, tiny_model_dir, tiny_encoder):
    """Two runs prepared on the same OUT.npy before either started (both pass the "already exists"
    check while counting): the second's start is refused instead of replacing the first's files
    (which left an output marked complete whose rows were zeros and whose texts file was empty)."""
    lines, f, out, a, b = _two_runs_prepared(tmp_path, tiny_model_dir)
    a.start()
    _run_chunks(a, tiny_encoder, chunks=1)
    with pytest.raises(ValueError, match=f"^out: another run holds {re.escape(str(out))} "):
        b.start()
    with pytest.raises(ValueError, match="^out: another run holds"):  # and a third, at its prepare
        corpus.embed_file(f, out, model=str(tiny_model_dir), overwrite=True)
    _run_chunks(a, tiny_encoder)
    a.finish()
    ref = np.concatenate([tiny_encoder.encode(lines[i:i + 3], batch_size=32, normalize=True) for i in (0, 3)])
    ids, texts, emb = load_output(out)
    assert texts == lines and np.array_equal(emb, ref) and manifest(out)["complete"]
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.npy", "out.npy.manifest.json", "out.npy.texts.jsonl"]
    with pytest.raises(FileExistsError, match="out: .*out.npy was created by another run since this one was prepared"):
        b.start()  # the lock is free now; b still does not replace a's finished output
    assert np.array_equal(np.load(out), ref) and load_output(out)[1] == lines


def test_npy_runs_without_a_lock_fail_stale_never_complete(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch):
    """Where there are no locks, a run replaced by another fails at its next write, commit or
    finish (ESTALE), never marking the other run's output complete; the other run finishes right."""
    monkeypatch.setattr(corpus, "fcntl", None)
    lines, f, out, a, b = _two_runs_prepared(tmp_path, tiny_model_dir)
    a.start()
    writer = a.writer()
    (index, start, texts), rest = next(a.pending()), list(a.pending())[1:]
    a.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, normalize=True)))
    with pytest.raises(FileExistsError, match="created by another run since this one was prepared"):
        b.start()
    b = corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(str(tiny_model_dir)), chunk_size=3,
                                batch_size=32, overwrite=True)
    b.start()  # replaces a's files
    index, start, texts = rest[0]
    with pytest.raises(OSError, match="no longer the file this writer opened") as e:
        writer.write(start, texts, tiny_encoder.encode(texts, normalize=True))
    assert e.value.errno == errno.ESTALE
    writer.close()
    with pytest.raises(OSError, match=f"the manifest records run {b.run}") as e:
        a.commit(index)
    assert e.value.errno == errno.ESTALE
    a.manifest["completed"] = [[0, 2]]
    with pytest.raises(OSError, match=f"the manifest records run {b.run}"):
        a.finish()
    assert not out.exists() and manifest(out)["run"] == b.run and not manifest(out)["complete"]
    _run_chunks(b, tiny_encoder)
    b.finish()
    ref = np.concatenate([tiny_encoder.encode(lines[i:i + 3], normalize=True) for i in (0, 3)])
    assert load_output(out)[1] == lines and np.array_equal(np.load(out), ref)


def test_the_npy_lock_of_another_process_is_released_when_it_dies(tmp_path, tiny_model_dir, tiny_encoder):
    lines = corpus_lines(6)
    f = write_lines(tmp_path / "in.txt", lines)
    out = tmp_path / "out.npy"
    code = ("import sys, time\nfrom transformer_core import corpus\n"
            "job = corpus.EmbedJob.prepare(corpus.open_source(sys.argv[1]), sys.argv[2], "
            "corpus.model_identity(sys.argv[3]), chunk_size=3, batch_size=32)\n"
            "job.start()\nprint('started', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(f), str(out), str(tiny_model_dir)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        for kwargs in ({"overwrite": True}, {"resume": True}):
            with pytest.raises(ValueError, match="^out: another run holds"):
                corpus.embed_file(f, out, model=str(tiny_model_dir), **kwargs)
        assert Path(f"{out}.partial").exists() and not manifest(out)["completed"]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    r = corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)  # the kernel released the lock
    ref = np.concatenate([tiny_encoder.encode(lines[i:i + 3], normalize=True) for i in (0, 3)])
    assert r.rows_computed == 6 and load_output(out)[1] == lines and np.array_equal(np.load(out), ref)
    assert not (tmp_path / ".out.npy.lock").exists()


def test_resume_refuses_an_input_edited_in_the_middle(tmp_path, tiny_model_dir):
    """Same size, same first and last MiB: the hash of the whole file tells them apart. A manifest
    of an earlier version (no hash of the whole file) resumes only with the same mtime too."""
    lines = [f"line {i:02d} " + "word " * 20000 for i in range(30)]  # ~3 MiB
    f = write_lines(tmp_path / "big.txt", lines)
    out = tmp_path / "big.npy"
    mid = corpus.model_identity(str(tiny_model_dir))
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=10, batch_size=32)
    job.start()
    job.close()  # interrupted before its first chunk
    assert manifest(out)["input"]["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    original = f.read_bytes()
    data = bytearray(original)
    i = data.index(b"line 15 ")
    data[i:i + 8] = b"LINE XV "
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"not the one .* content \(SHA-256 of the whole file\) differs"):
        corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, batch_size=32)
    f.write_bytes(original)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, the same bytes: resumes
    assert corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, batch_size=32).num_rows == 30
    m = manifest(out)
    del m["input"]["sha256"]
    Path(f"{out}.manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="its modification time .*holds no hash of the whole file"):
        corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, batch_size=32)
    os.utime(f, ns=(st.st_atime_ns, m["input"]["mtime_ns"]))
    assert corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, batch_size=32).num_rows == 30


@pytest.mark.parametrize("data, refused", [
    (b"one\ntwo\nfirst half\rsecond half\nfour\n", True),  # a \r inside a line: two texts now, one before
    (b"one\r\ntwo\r\nthree\r\n", False),  # CRLF: the same texts either way
    (b"one\r\r\ntwo\nthree\r", False),  # \r before a line end: the same texts either way
])
def test_resume_of_a_run_that_split_lines_at_newline_only(tmp_path, tiny_model_dir, data, refused):
    """Text files split as universal newlines since a run's manifest records it ("newlines"); a
    run started before (its manifest without the key) on a file holding a \r inside a line read
    other texts: resuming it is refused before anything is embedded, naming the cause. Other files
    resume."""
    f = tmp_path / "in.txt"
    f.write_bytes(data)
    out = tmp_path / "o.npy"
    mid = corpus.model_identity(str(tiny_model_dir))
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=1, batch_size=32)
    job.start()
    job.close()  # interrupted before its first chunk
    assert manifest(out)["input"]["newlines"] == "universal"
    m = manifest(out)
    del m["input"]["newlines"]  # as an earlier version wrote it
    Path(f"{out}.manifest.json").write_text(json.dumps(m))
    if refused:
        with pytest.raises(ValueError, match=r"started by an earlier version, which split .*lines at \\n only; .*"
                                             r"carriage return inside a line"):
            corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, batch_size=32)
        assert manifest(out) == m
    else:
        job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, batch_size=32)
        assert job.num_rows == 3


def test_finish_removes_only_its_own_temporaries(tmp_path, tiny_model_dir):
    """Output names holding glob characters: ``a*.npy`` leaves ``ab.npy``'s temporaries alone,
    ``r[1].npy`` removes its own."""
    f = write_lines(tmp_path / "in.txt", ["one", "two"])
    other = tmp_path / ".ab.npy.manifest.json.tmp-999-deadbeef"
    mine = tmp_path / ".r[1].npy.manifest.json.tmp-999-deadbeef"
    other.write_text("{}")
    mine.write_text("{}")
    corpus.embed_file(f, tmp_path / "a*.npy", model=str(tiny_model_dir))
    corpus.embed_file(f, tmp_path / "r[1].npy", model=str(tiny_model_dir))
    assert other.exists() and not mine.exists()
    assert load_output(tmp_path / "r[1].npy")[1] == ["one", "two"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_empty_and_whitespace_texts_are_bad_records(tmp_path, tiny_model_dir, tiny_encoder, fmt):
    """As text input skips blank lines and search refuses a blank query: an empty or whitespace-only
    field is a bad record (strict: an error naming it; skip: skipped), never a [CLS] [SEP] row."""
    values = ["", "   ", "ok", "\t\n"]
    p = tmp_path / f"e.{fmt}"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps({"text": v}) + "\n" for v in values), encoding="utf-8")
        where = ["line 1", "line 2", "line 4"]
    elif fmt == "csv":
        p.write_text('id,text\n1,""\n2,   \n3,ok\n4,"\t\n"\n', encoding="utf-8")
        where = ["line 2", "line 3", "line 6"]
    else:
        pq.write_table(pa.table({"text": values}), p)
        where = ["row 1", "row 2", "row 4"]
    with pytest.raises(ValueError, match=f"{where[0]}: field 'text' is empty|{where[0]}: column 'text' is empty"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    assert list(src) == ["ok"] and src.num_skipped == 3
    assert [w for w, _ in src.skipped] == where
    assert [r.split(" is ")[1] for _, r in src.skipped] == ["empty (it would embed to [CLS] [SEP] alone)",
                                                            "only whitespace (it would embed to [CLS] [SEP] alone)",
                                                            "only whitespace (it would embed to [CLS] [SEP] alone)"]
    out = tmp_path / "o.npy"
    r = corpus.embed_file(p, out, model=str(tiny_model_dir), errors="skip")
    assert r.rows == 1 and r.num_skipped == 3 and load_output(out)[1] == ["ok"]
    assert np.array_equal(np.load(out), tiny_encoder.encode(["ok"], normalize=True))


def test_a_full_disk_on_the_texts_sidecar_names_it_and_resumes(tmp_path, tiny_model_dir):
    """A write of the .npy's texts sidecar that fails (here past RLIMIT_FSIZE, in a child process)
    left its bytes in the file's buffer; closing the writer flushed them again, failed again, and
    that unnamed error replaced the one naming the file. Now the named error reaches the caller;
    nothing looks complete, and a resume with the limit gone gives embed_file's output."""
    lines = [f"{i} " + "word " * 100 for i in range(30)]  # ~500 B of text a row (a chunk fits the buffer)
    f = write_lines(tmp_path / "long.txt", lines)
    out = tmp_path / "o.npy"
    code = f"""
import resource, signal, sys
from transformer_core import corpus
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (8000, 8000))  # the .npy (4 KB) fits, the sidecar's 2nd chunk does not
try:
    corpus.embed_file({str(f)!r}, {str(out)!r}, model={str(tiny_model_dir)!r}, chunk_size=10)
except OSError as e:
    print("OSError", e)
    sys.exit(0)
print("no error")
sys.exit(1)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OSError [Errno 27]") and "o.npy.texts.jsonl" in r.stdout, r.stdout
    assert not out.exists()
    done = corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=10, resume=True)
    assert done.rows == 30 and done.chunks_computed >= 1
    ref = tmp_path / "ref.npy"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=10)
    np.testing.assert_array_equal(np.load(out), np.load(ref))
    assert (tmp_path / "o.npy.texts.jsonl").read_bytes() == (tmp_path / "ref.npy.texts.jsonl").read_bytes()


def test_list_input_with_an_empty_or_blank_text_is_refused(tmp_path, tiny_model_dir, tiny_encoder):
    """As every file reader refuses a blank record and search a blank query: a list's empty or
    whitespace-only text is a ValueError naming its index, before anything is written; the list
    without it gives encode()'s rows."""
    model = str(tiny_model_dir)
    for texts, match in ((["fine", ""], ": expected some text, got an empty text at index 1$"),
                         ([" \t\n", "fine"], ": expected some text, got an all-whitespace text at index 0$")):
        with pytest.raises(ValueError, match="^input" + match):  # the argument's name, not ListSource's
            corpus.embed_file(texts, tmp_path / "e.npy", model=model)
        with pytest.raises(ValueError, match="^input" + match):
            corpus.embed_summary(texts, model=model)
        with pytest.raises(ValueError, match="^texts" + match):
            corpus.ListSource(texts)
    assert os.listdir(tmp_path) == []
    corpus.embed_file(["fine", " spaced "], tmp_path / "e.npy", model=model)
    assert load_output(tmp_path / "e.npy")[1] == ["fine", " spaced "]  # kept as given
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), tiny_encoder.encode(["fine", " spaced "], normalize=True))


def test_reader_arguments_are_checked_whatever_the_input(tmp_path, tiny_model_dir):
    """input_format / text_field apply to a path only: with a list or a TextSource they are refused
    (as the CLI refuses --format / --text-field without --file), and errors is checked for every
    input; nothing is written."""
    model = str(tiny_model_dir)
    f = write_lines(tmp_path / "c.jsonl", [json.dumps({"body": "x"})])
    source = corpus.open_source(f, text_field="body")
    for input, what in ((["a"], "texts given as a list"), (source, "a TextSource")):
        for kwargs, match in (({"text_field": "x"}, f"^text_field: only for a path input, got 'x' with {what}"),
                              ({"input_format": "jsonl"}, f"^input_format: only for a path input, got 'jsonl' with {what}"),
                              ({"errors": "bad"}, "^errors: expected 'strict' or 'skip', got 'bad'$")):
            with pytest.raises(ValueError, match=match):
                corpus.embed_file(input, tmp_path / "e.npy", model=model, **kwargs)
            with pytest.raises(ValueError, match=match):
                corpus.embed_summary(input, model=model, **kwargs)
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl"]
    # errors="skip" with a source opened strict was ignored, and a bad record then told the user to
    # pass errors='skip': refused, naming how to open the source instead
    with pytest.raises(ValueError, match=r"^errors: 'skip' with a TextSource opened with errors='strict'.*"
                                         r"open_source\(\.\.\., errors='skip'\)"):
        corpus.embed_summary(source, model=model, errors="skip")
    skipping = corpus.open_source(f, text_field="body", errors="skip")
    assert corpus.embed_summary(skipping, model=model, errors="skip").texts == ["x"]
    assert corpus.embed_summary(skipping, model=model).texts == ["x"]  # the default: as opened


def test_path_arguments_of_the_wrong_type_are_named(tmp_path, tiny_model_dir, search_index):
    model = str(tiny_model_dir)
    for value, got in ((5, "int"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"^out: expected a str or os.PathLike, got {got}$"):
            corpus.embed_file(["a"], value, model=model)
        with pytest.raises(TypeError, match=f"^index: expected a str or os.PathLike, got {got}$"):
            corpus.search(value, "a")
        with pytest.raises(TypeError, match=f"^out: expected a str or os.PathLike, got {got}$"):
            corpus.read_manifest(value)
    assert os.listdir(tmp_path) == []
    _, outs = search_index
    assert corpus.read_manifest(str(outs["npy"]))["complete"] is True


def test_search_checks_block_rows_like_k_and_allow_incomplete(search_index):
    """block_rows: a numpy integer is an int (as for k), a float a TypeError; allow_incomplete a
    bool, not any truthy value. The scores do not depend on block_rows."""
    lines, outs = search_index
    ref = corpus.search(outs["npy"], lines[7], k=4, block_rows=4)
    assert ref[0][0].id == 7
    assert corpus.search(outs["npy"], lines[7], k=np.int64(4), block_rows=np.int64(4)) == ref
    assert corpus.search(outs["npy"], lines[7], k=4, block_rows=np.int32(4), allow_incomplete=np.True_) == ref
    for kwargs, error, match in (({"block_rows": 2.0}, TypeError, "^block_rows: expected an int, got float$"),
                                 ({"block_rows": True}, TypeError, "^block_rows: expected an int, got bool$"),
                                 ({"block_rows": np.int64(0)}, ValueError, "^block_rows: expected an int >= 1, got 0$"),
                                 ({"allow_incomplete": "yes"}, TypeError,
                                  "^allow_incomplete: expected a bool, got str 'yes'$"),
                                 ({"allow_incomplete": 1}, TypeError, "^allow_incomplete: expected a bool, got int 1$")):
        with pytest.raises(error, match=match):
            corpus.search(outs["npy"], lines[7], k=4, **kwargs)


def test_text_reader_splits_lines_as_universal_newlines(tmp_path, tiny_model_dir, tiny_encoder):
    """A line of text input ends at \\n, \\r\\n (one line end) or a lone \\r, as Python's universal
    newlines: a file of classic-Mac \\r line ends is read line by line (not as one text), the
    texts otherwise as stored, and an error's line number counts those lines."""
    cr = tmp_path / "cr.txt"
    cr.write_bytes(b"one\rtwo\rthree\r")
    assert list(corpus.open_source(cr)) == ["one", "two", "three"]
    mixed = tmp_path / "mixed.txt"
    data = b"\xef\xbb\xbfa\r\nb\rc\n\r\n\rd  e\r\r\nlast"
    mixed.write_bytes(data)
    ref = [t.strip() for t in data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    assert list(corpus.open_source(mixed)) == [t for t in ref if t] == ["a", "b", "c", "d  e", "last"]
    # a \r\n that falls across two reads of the file stays one line end
    long = tmp_path / "long.txt"
    lines = [f"{i} " + "x" * (8189 + i % 5) for i in range(12)]
    long.write_bytes("".join(t + ("\r\n" if i % 2 else "\r") for i, t in enumerate(lines)).encode())
    assert list(corpus.open_source(long)) == lines
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\rstill ok\r\nbad \xff\rafter")
    with pytest.raises(ValueError, match=r"line 3: invalid UTF-8 \(byte 5"):
        list(corpus.open_source(bad))
    src = corpus.open_source(bad, errors="skip")
    assert list(src) == ["ok", "still ok", "after"] and [w for w, _ in src.skipped] == ["line 3"]
    out = tmp_path / "cr.npy"
    assert corpus.embed_file(cr, out, model=str(tiny_model_dir)).rows == 3
    np.testing.assert_array_equal(np.load(out), tiny_encoder.encode(["one", "two", "three"], normalize=True))


@pytest.mark.parametrize("arrow_type", ["string_view", "large_string", "binary_view"])
def test_parquet_view_and_large_string_columns_are_text(tmp_path, tiny_model_dir, tiny_encoder, arrow_type):
    """pyarrow writes a string_view column (and stores its schema): read as text like a string
    column, nulls and blank values still bad records by row."""
    if not hasattr(pa, arrow_type):
        pytest.skip(f"pyarrow {pa.__version__} has no {arrow_type}")
    values = ["first", "é second", None, "  ", "third"]
    typ = getattr(pa, arrow_type)()
    raw = [v.encode() if v is not None and "binary" in arrow_type else v for v in values]
    p = tmp_path / "v.parquet"
    pq.write_table(pa.table({"text": pa.array(raw, typ)}), p, row_group_size=2)
    assert pq.ParquetFile(p).schema_arrow.field("text").type == typ
    with pytest.raises(ValueError, match="row 3: column 'text' is null"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    kept = ["first", "é second", "third"]
    assert list(src) == kept and [w for w, _ in src.skipped] == ["row 3", "row 4"]
    out = tmp_path / "o.parquet"
    corpus.embed_file(p, out, model=str(tiny_model_dir), errors="skip")
    ids, texts, emb = load_output(out)
    assert texts == kept
    np.testing.assert_array_equal(emb, tiny_encoder.encode(kept, normalize=True))



# ------------------------------------------------------- names pyarrow would take for URIs, line ends
def _read_parts(directory: Path):
    """The rows of a Parquet output, its parts read through Arrow's own open files (pyarrow takes
    a path string for a URI): (ids, texts, embeddings (N, dim))."""
    tables = []
    for part in sorted(directory.glob("part-*.parquet")):
        with pa.OSFile(os.fsencode(part)) as fh:  # never a Python file object: see corpus._read_part
            tables.append(pq.read_table(fh))
    table = pa.concat_tables(tables).sort_by("id")
    emb = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    return table.column("id").to_numpy(), table.column("text").to_pylist(), emb


@pytest.mark.parametrize("name", ["out-2024-01-01T12:30:00", "hdfs:/out", os.fsdecode(b"out-\xff")],
                         ids=["colon", "hdfs-dir", "not-utf8"])
def test_parquet_names_that_look_like_uris_are_local_files(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch,
                                                           name):
    """pyarrow reads a relative path string as a URI: an output named with a timestamp was written
    but not searchable ("Unrecognized filesystem type in URI"), nor readable as Parquet input; a
    folder "hdfs:" went to HDFS (a JVM error); a name that is not UTF-8 was a UnicodeEncodeError.
    Now pyarrow gets open files: the rows are the encoder's, search finds them."""
    monkeypatch.chdir(tmp_path)
    Path(name).parent.mkdir(exist_ok=True)
    lines = corpus_lines(12)
    ref = np.concatenate([tiny_encoder.encode(lines[i:i + 5], normalize=True) for i in range(0, 12, 5)])
    out = Path(f"{name}.parquet")
    r = corpus.embed_file(write_lines(Path("in.txt"), lines), out, model=str(tiny_model_dir), chunk_size=5)
    assert (r.rows, r.chunks) == (12, 3)
    ids, texts, emb = _read_parts(out)
    assert ids.tolist() == list(range(12)) and texts == lines
    np.testing.assert_array_equal(emb, ref)
    hits = corpus.search(out, [lines[7], lines[2]], k=2)
    assert [(h[0].id, h[0].text) for h in hits] == [(7, lines[7]), (2, lines[2])]
    np.testing.assert_allclose([h[0].score for h in hits], 1.0, atol=1e-5)
    # the same texts as a Parquet input of such a name (its rows in two row groups)
    source = Path(f"{name}-in.parquet")
    with open(source, "wb") as fh:
        pq.write_table(pa.table({"text": lines}), fh, row_group_size=7)
    assert list(corpus.open_source(source)) == lines
    out2 = Path(f"{name}-2.npy")
    corpus.embed_file(source, out2, model=str(tiny_model_dir), chunk_size=5)
    np.testing.assert_array_equal(np.load(out2), ref)


def test_jsonl_and_csv_with_lone_cr_line_ends_say_so(tmp_path):
    """JSONL and CSV lines end at \\n (or \\r\\n): a file of classic-Mac \\r line ends reads as one
    line, which gave "Extra data" or the csv module's "open the file in universal-newline mode?".
    Now the error says what the line ends are and what to do, whatever --errors (it is the file's,
    not a record's); a lone \\r inside one record of a \\n file names that record."""
    files = {"jsonl": (b'{"text": "one"}\r{"text": "two"}\r', b'{"text": "one"}\n{"text": "two"}\r{"text": "3"}\n'),
             "csv": (b"id,text\r1,one\r2,two\r", b"id,text\n1,one\n2,two\r3,three\n")}
    for fmt, (mac, mixed) in files.items():
        p = tmp_path / f"mac.{fmt}"
        p.write_bytes(mac)
        for errors in ("strict", "skip"):
            with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}: its line ends are lone \\r \(carriage "
                                                 rf"returns, as classic Mac OS wrote them\), which {fmt} input does "
                                                 rf"not split lines at; convert them to \\n or \\r\\n$"):
                list(corpus.open_source(p, errors=errors))
        for ends in (b"\n", b"\r\n"):  # converted, it reads
            p.write_bytes(mac.replace(b"\r", ends))
            assert list(corpus.open_source(p)) == ["one", "two"]
        p.write_bytes(mixed)
        record = ("line 2: not valid JSON \\(Extra data, column 17\\); the line holds a lone \\\\r, not a line end "
                  "here \\(\\\\n or \\\\r\\\\n\\)" if fmt == "jsonl" else
                  "line 3: not valid CSV \\(a lone \\\\r in an unquoted field; a line ends at \\\\n or \\\\r\\\\n\\)")
        with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}, {record} \(--errors skip"):
            list(corpus.open_source(p))
        src = corpus.open_source(p, errors="skip")
        assert list(src) == ["one"] and [w for w, _ in src.skipped] == ["line 2" if fmt == "jsonl" else "line 3"]
    # one record ended by a \r is valid JSON (\r is whitespace): read, not refused
    one = tmp_path / "one.jsonl"
    one.write_bytes(b'{"text": "only"}\r')
    assert list(corpus.open_source(one)) == ["only"]


@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_a_full_disk_while_saving_the_manifest_names_it(tmp_path, tiny_model_dir, monkeypatch, capsys, kind):
    """ENOSPC from the manifest's write or fsync names no file: it was "[Errno 28] No space left on
    device" alone. Now the manifest is named, with what to do: run again (a new run's first
    manifest: nothing kept) or --resume (later: the chunks recorded before are kept), and the
    resumed output is the uninterrupted one's."""
    lines = corpus_lines(40)
    f = write_lines(tmp_path / "c.txt", lines)
    out = tmp_path / f"e.{kind}"
    fsync = os.fsync

    def full_disk_at(n):
        """os.fsync that fails the ``n``-th fsync of a manifest's temporary file with ENOSPC."""
        saves = []

        def fake(fd):
            if ".manifest.json.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
                saves.append(fd)
                if len(saves) == n:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return fsync(fd)
        return fake

    args = ("embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--chunk-size", 10, "--no-progress")
    monkeypatch.setattr(os, "fsync", full_disk_at(1))  # the new run's manifest
    rc, stdout, stderr = _cli(capsys, *args)
    assert (rc, stdout) == (2, "")
    assert stderr == (f"transformer_core embed: {out}.manifest.json: No space left on device (writing the manifest "
                      f"of a new run, nothing was kept: free some space and run again)\n")
    assert sorted(os.listdir(tmp_path)) == ["c.txt"]
    resume_hint = ("writing the manifest; what it recorded before is kept: free some space, then the same command "
                   "with --resume goes on")
    # saves: 1 the new run, 2-5 after chunks 0-3, 6 the finish
    for n, completed in ((3, [[0, 1]]), (6, [[0, 4]])):
        monkeypatch.setattr(os, "fsync", full_disk_at(n))
        rc, stdout, stderr = _cli(capsys, *args, "--overwrite")
        assert (rc, stdout) == (2, "")
        assert stderr == f"transformer_core embed: {out}.manifest.json: No space left on device ({resume_hint})\n"
        assert manifest(out)["completed"] == completed and not manifest(out)["complete"]
        assert leftover_temps(tmp_path) == []
        monkeypatch.setattr(os, "fsync", fsync)
        rc, stdout, stderr = _cli(capsys, *args, "--resume")
        assert rc == 0 and stderr == "", stderr
        assert manifest(out)["complete"]
    ref = tmp_path / f"ref.{kind}"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=10)
    ids, texts, emb = load_output(out)
    ref_ids, ref_texts, ref_emb = load_output(ref)
    assert ids.tolist() == ref_ids.tolist() and texts == ref_texts == lines
    np.testing.assert_array_equal(emb, ref_emb)


def test_cli_resume_keeps_the_runs_batch_size(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """--resume "(same input and model)" refused a run started with --batch-size 16 unless
    --batch-size 16 was given again (the option's default, 32, was always passed). Now a resume
    without --batch-size takes the run's, as it takes its chunk size; another given is refused."""
    lines = corpus_lines(50)
    f = write_lines(tmp_path / "c.txt", lines)
    out = tmp_path / "r.npy"
    args = ("embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--no-progress")
    restore = _fail_third_chunk(monkeypatch, KeyboardInterrupt())  # as Ctrl-C during the third chunk
    rc, _, stderr = _cli(capsys, *args, "--chunk-size", 10, "--batch-size", 16)
    assert rc == 2 and "interrupted: 2 of 5 chunks" in stderr, stderr
    restore()
    assert manifest(out)["batch_size"] == 16
    rc, _, stderr = _cli(capsys, *args, "--resume", "--batch-size", 8)
    assert rc == 2 and "batch_size: " in stderr and "started with batch size 16, got 8" in stderr, stderr
    rc, stdout, stderr = _cli(capsys, *args, "--resume")
    assert rc == 0 and stderr == "", stderr
    assert f"{out}: 50 rows x 32 float32 in 5 chunks (30 embedded now" in stdout
    ref = tmp_path / "ref.npy"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=10, batch_size=16)
    np.testing.assert_array_equal(np.load(out), np.load(ref))
    assert Path(f"{out}.texts.jsonl").read_bytes() == Path(f"{ref}.texts.jsonl").read_bytes()


# ------------------------------------------------------- the whole weights fingerprinted, CRLF first lines
def _fine_tuned_copy(tiny_model_dir: Path, dest: Path) -> tuple[Path, str]:
    """A copy of the tiny model with one row of its word embeddings changed in place, in the middle
    of model.safetensors (more than 1 MiB from either end: what a fingerprint of the header and the
    first and last MiB never saw), the file's size, header and every shape unchanged; and a word
    whose embedding row that is."""
    import shutil

    from transformer_core import Tokenizer

    shutil.copytree(tiny_model_dir, dest)
    weights = dest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    entry = json.loads(data[8:8 + header_len])["embeddings.word_embeddings.weight"]
    rows, dim = entry["shape"]
    tok = Tokenizer.from_pretrained(str(tiny_model_dir))
    row = next(i for i in range(rows // 2, rows) if tok.id_to_token(i).isalpha())  # a whole word, not ##x
    start = 8 + header_len + entry["data_offsets"][0] + row * dim * 4
    assert (1 << 20) < start and start + dim * 4 < len(data) - (1 << 20)  # the middle, far from both ends
    # not a constant shift, which the embeddings' LayerNorm would take out again
    values = np.frombuffer(bytes(data[start:start + dim * 4]), np.float32) + np.linspace(-1, 1, dim, dtype=np.float32)
    data[start:start + dim * 4] = values.tobytes()
    size = weights.stat().st_size
    weights.write_bytes(bytes(data))
    assert weights.stat().st_size == size
    return dest, tok.id_to_token(row)


def test_a_fine_tune_of_the_same_size_is_another_model(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch):
    """model_identity hashed only the safetensors header, the size and the first and last MiB: a
    fine-tune that changed a middle tensor (a merged LoRA update) kept the fingerprint, so resume
    mixed the two models' rows in one output and search(model=) embedded the queries with the other
    model. The whole weight file is hashed now: both are refused."""
    tuned, word = _fine_tuned_copy(tiny_model_dir, tmp_path / "tuned")
    other = tc.SentenceEncoder.from_pretrained(str(tuned)).encode([f"a {word} here"])
    assert np.abs(other - tiny_encoder.encode([f"a {word} here"])).max() > 1e-3  # really another model
    base_id, tuned_id = corpus.model_identity(str(tiny_model_dir)), corpus.model_identity(str(tuned))
    assert base_id["fingerprint"] != tuned_id["fingerprint"]
    assert base_id["fingerprint_version"] == tuned_id["fingerprint_version"] == corpus.FINGERPRINT_VERSION == 2
    # the fingerprint: SHA-256 over the config, the tokenizer files and the whole file's SHA-256
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "sentence_bert_config.json",
                 "special_tokens_map.json"):
        if (tuned / name).is_file():
            h.update(name.encode() + b"\0" + (tuned / name).read_bytes() + b"\0")
    h.update(b"model.safetensors sha256=" + hashlib.sha256((tuned / "model.safetensors").read_bytes()).hexdigest().encode())
    assert tuned_id["fingerprint"] == h.hexdigest()[:32]

    f, out = _interrupted_after_two_chunks(tmp_path, tiny_model_dir, monkeypatch)
    before = out.with_name(out.name + ".partial").read_bytes(), manifest_text(out)
    with pytest.raises(ValueError, match=r"^resume: .*r\.npy was made by another model: .*tiny.* \(fingerprint "
                                         rf"{base_id['fingerprint'][:12]}\), not '{re.escape(str(tuned))}'"):
        corpus.embed_file(f, out, model=str(tuned), resume=True)
    assert (out.with_name(out.name + ".partial").read_bytes(), manifest_text(out)) == before  # untouched
    r = corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)  # its own model continues it
    assert r.rows_computed == 30
    with pytest.raises(ValueError, match=rf"^model: .*r\.npy was embedded with .*, not '{re.escape(str(tuned))}'; "
                                         "queries must be embedded by the same model$"):
        corpus.search(out, "line", model=str(tuned))
    assert corpus.search(out, "line", model=str(tiny_model_dir), k=1)[0][0].id >= 0


def manifest_text(out) -> str:
    return Path(f"{out}.manifest.json").read_text()


def test_a_manifest_of_the_older_fingerprint_is_refused_as_such(tmp_path, tiny_model_dir, monkeypatch):
    """A manifest written before the whole weights were hashed (no model.fingerprint_version, a
    fingerprint of the header and first and last MiB): its fingerprint cannot be compared, so a
    resume and a search with model= say so, not "another model" or a KeyError; a search without
    model= (the index's own model) still reads it."""
    f, out = _interrupted_after_two_chunks(tmp_path, tiny_model_dir, monkeypatch)
    man = manifest(out)
    assert man["model"]["fingerprint_version"] == 2
    del man["model"]["fingerprint_version"]
    man["model"]["fingerprint"] = "3674a5507c91a2ee9c6a610ce0f3512e"  # as an earlier version wrote it
    Path(f"{out}.manifest.json").write_text(json.dumps(man))
    assert corpus.read_manifest(out)["model"] == man["model"]  # still a readable manifest
    older = "made by another model or with an older fingerprint: its manifest holds the fingerprint of an earlier " \
            r"version \(of the weights' header and first and last MiB only, not the whole file\)"
    with pytest.raises(ValueError, match=rf"^resume: .*r\.npy was {older}, which cannot be compared with the "
                                         rf"fingerprint of '.*tiny.*'; --overwrite starts over$"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)
    with pytest.raises(ValueError, match=r"^index: .* is incomplete"):
        corpus.search(out, "line")
    with pytest.raises(ValueError, match=r"^model: .*r\.npy was embedded with another model or with an older "
                                         r"fingerprint: .*leave model out to embed the queries with the index's own"):
        corpus.search(out, "line", model=str(tiny_model_dir), allow_incomplete=True)
    hits = corpus.search(out, "line", allow_incomplete=True, k=3)[0]
    assert len(hits) == 3 and all(h.id < 20 for h in hits)  # the two chunks done
    man["model"]["fingerprint_version"] = "2"
    Path(f"{out}.manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match="a damaged manifest: model.fingerprint_version: expected an int >= 1, got '2'"):
        corpus.read_manifest(out)


def test_model_identity_checks_quantize():
    with pytest.raises(ValueError, match="^quantize: expected one of 'int8', got 'int4'$"):
        corpus.model_identity(MODEL_NAME, quantize="int4")
    with pytest.raises(TypeError, match="^quantize: expected a str, one of 'int8'; got int"):
        corpus.model_identity(MODEL_NAME, quantize=5)
    plain, int8 = corpus.model_identity(MODEL_NAME), corpus.model_identity(MODEL_NAME, quantize="int8")
    assert int8["quantize"] == "int8" and "quantize" not in plain and int8["fingerprint"] != plain["fingerprint"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_bad_first_record_of_a_crlf_file_is_that_records_error(tmp_path, fmt):
    """The lone-\\r check read the first line without its \\n, so the \\r of a \\r\\n line end looked
    lone: a CRLF file whose first record was bad was "its line ends are lone \\r", and errors='skip'
    refused the whole file. Now it is that record's error (JSONL: skipped with 'skip'; CSV: the
    header, an error either way), also when the first line's \\r\\n straddles the 1 MiB block the
    check reads; lone-\\r files are still refused as such."""
    first = b"not json" if fmt == "jsonl" else b'"a"b,text'
    rest = b'{"text": "a"}\r\n' if fmt == "jsonl" else b"x,y\r\n"
    record = (r"line 1: not valid JSON \(Expecting value, column 1\)" if fmt == "jsonl" else
              r"line 1: not valid CSV \(',' expected after '\"'\)")
    long_first = first + b" " * ((1 << 20) - 1 - len(first))  # its \r is the last byte of the first MiB
    for name, data in (("short", first + b"\r\n" + rest), ("straddling", long_first + b"\r\n" + rest)):
        p = tmp_path / f"{name}.{fmt}"
        p.write_bytes(data)
        if name == "straddling":
            assert data.index(b"\r\n") == (1 << 20) - 1
        hint = r" \(--errors skip / errors='skip' skips such records\)" if fmt == "jsonl" else ""
        with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}, {record}{hint}$"):
            list(corpus.open_source(p))
        if fmt == "jsonl":
            src = corpus.open_source(p, errors="skip")
            assert list(src) == ["a"] and src.num_skipped == 1 and src.skipped[0][0] == "line 1"
        else:  # a bad header is the file's error, whatever --errors
            with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}, {record}$"):
                list(corpus.open_source(p, errors="skip"))
    # a \r at the end of the first MiB that is not followed by \n is lone: the file is refused as such
    p = tmp_path / f"mac.{fmt}"
    p.write_bytes(long_first + b"\r" + rest.replace(b"\r\n", b"\r"))
    for errors in ("strict", "skip"):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}: its line ends are lone \\r"):
            list(corpus.open_source(p, errors=errors))
    p.write_bytes(first + b"\r")  # one line, ended by a lone \r at the end of the file
    with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}: its line ends are lone \\r"):
        list(corpus.open_source(p))


def test_csv_header_after_blank_lines_and_a_duplicated_text_column(tmp_path):
    """Blank lines before the CSV header gave "no column 'text' (columns: )"; a header naming the
    text column twice used the first silently. The blank lines are skipped (the line numbers stay
    the file's); a duplicated column is refused, as for Parquet input."""
    p = tmp_path / "blank.csv"
    p.write_bytes(b"\n\r\n\nid,text\n1,one\n2,\"two\n\"\n3,\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}, line 8: column 'text' is empty"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    assert list(src) == ["one", "two\n"] and src.skipped == [("line 8", "column 'text' is empty (it would embed "
                                                               "to [CLS] [SEP] alone)")]
    dup = tmp_path / "dup.csv"
    dup.write_bytes(b"\ntext,id,text\na,1,b\n")
    for errors in ("strict", "skip"):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(dup))}: column 'text' appears 2 times in the CSV "
                                             r"header \(line 2\); expected one$"):
            list(corpus.open_source(dup, errors=errors))
    assert list(corpus.open_source(dup, text_field="id")) == ["1"]
    only_blank = tmp_path / "blank_only.csv"
    only_blank.write_bytes(b"\n\n")
    assert list(corpus.open_source(only_blank)) == []


def test_write_parquet_part_checks_its_arguments_first(tmp_path):
    """write_parquet_part is public and checked nothing: index=-1 wrote part--0001, texts and
    embeddings of different lengths or a 1-D array failed in pyarrow or numpy, a missing directory
    was named as the temp file. Each is refused naming the argument, before anything is written."""
    d = tmp_path / "ds"
    d.mkdir()
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    texts = ["a", "b", "c"]
    cases = [
        ((d, -1, 5, 0, texts, emb), ValueError, r"^index: expected an int in \[0, 2\*\*63 - 1\], got -1$"),
        ((d, 1.0, 5, 0, texts, emb), TypeError, "^index: expected an int, got float 1.0$"),
        ((d, 1, 0, 0, texts, emb), ValueError, r"^width: expected an int in \[1, 19\], got 0$"),
        ((d, 1, 10**9, 0, texts, emb), ValueError, r"^width: expected an int in \[1, 19\], got 1000000000$"),
        ((d, 1, 5, -3, texts, emb), ValueError, r"^start: expected an int in \[0, 2\*\*63 - 1\], got -3$"),
        ((d, 1, 5, 0, ["a", "b"], emb), ValueError, r"^embeddings: expected shape \(2, dim\) with dim >= 1 \(one row "
                                                    r"per text\), got \(3, 4\)$"),
        ((d, 1, 5, 0, texts, emb[0]), ValueError, r"^embeddings: expected shape \(3, dim\) .*got \(4,\)$"),
        ((d, 1, 5, 0, texts, np.zeros((3, 0), np.float32)), ValueError, r"^embeddings: .*got \(3, 0\)$"),
        ((d, 1, 5, 0, texts, emb.astype(np.int32)), TypeError, "^embeddings: expected an array of floats, got dtype int32$"),
        ((d, 1, 5, 0, [1, 2, 3], emb), TypeError, "^texts: expected a list of str, got int at index 0$"),
        ((d, 1, 5, 0, "abc", emb), TypeError, "^texts: expected a list of str, got str$"),
        ((d, 1, 5, 0, [], emb[:0]), ValueError, "^texts: expected at least one text"),
        ((d, 1, 5, 0, ["a", "\udcff", "c"], emb), ValueError, "^texts: expected valid Unicode text, got a lone "
                                                              "surrogate '\\\\udcff' at position 0 of the text at index 1"),
        ((None, 1, 5, 0, texts, emb), TypeError, "^directory: expected a str or os.PathLike, got NoneType$"),
        ((tmp_path / "missing", 1, 5, 0, texts, emb), FileNotFoundError,
         rf"^directory: {re.escape(str(tmp_path / 'missing'))} does not exist$"),
        ((tmp_path / "f.txt", 1, 5, 0, texts, emb), NotADirectoryError,
         rf"^directory: {re.escape(str(tmp_path / 'f.txt'))} is not a directory$"),
    ]
    (tmp_path / "f.txt").write_text("x")
    for args, error, match in cases:
        with pytest.raises(error, match=match):
            corpus.write_parquet_part(*args)
    for run, error, match in ((5, TypeError, "^run: expected None or a run id"),
                              ("../x", ValueError, r"^run: expected a run id \(letters and digits, at most 64\), got "
                                                   "'../x'$")):
        with pytest.raises(error, match=match):
            corpus.write_parquet_part(d, 1, 5, 0, texts, emb, run=run)
    # float64 embeddings are made float32 (a copy) only after every other check: a bad run or
    # directory took a 293 MiB copy of 200,000 x 384 before its error
    import tracemalloc

    wide = np.ones((4000, 384))  # 12 MiB of float64, 6 MiB as float32
    lines = ["a"] * len(wide)
    for args, kwargs, error in (((d, 1, 5, 0), {"run": 5}, TypeError),
                                ((tmp_path / "missing", 1, 5, 0), {}, FileNotFoundError)):
        tracemalloc.start()
        try:
            with pytest.raises(error):
                corpus.write_parquet_part(*args, lines, wide, **kwargs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak
    assert sorted(os.listdir(tmp_path)) == ["ds", "f.txt"] and os.listdir(d) == []
    path = corpus.write_parquet_part(d, 7, 5, 70, texts, emb.astype(np.float64))  # floats are stored as float32
    assert path == d / "part-00007.parquet" and os.listdir(d) == ["part-00007.parquet"]
    table = pq.read_table(path)
    assert table.column("id").to_pylist() == [70, 71, 72] and table.column("text").to_pylist() == texts
    stored = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(3, 4)
    assert stored.dtype == np.float32 and np.array_equal(stored, emb)


def test_float64_beyond_float32_range_is_refused_not_stored_as_inf(tmp_path, tiny_model_dir):
    """write_parquet_part stores embeddings as float32: a float64 1e300 became inf in the part with
    only a numpy RuntimeWarning (and so in a .npy output through its writer). Now both refuse a
    finite value beyond float32's range, naming the argument, before anything is written; float32's
    largest value given as float64, and an inf given, are stored as they are."""
    d = tmp_path / "ds"
    d.mkdir()
    big = np.array([[1.0, 2.0], [-1e39, 3.0]])
    with pytest.raises(ValueError, match=r"^embeddings: expected values within float32's range \(\|v\| < "
                                         r"3\.4028235677973366e\+38\), got -1e\+39 at index \(1, 0\) \(which overflows "
                                         r"float32\)$"):
        corpus.write_parquet_part(d, 3, 5, 0, ["a", "b"], big)
    assert os.listdir(d) == []
    # the limit said is the cast's: float32's largest plus half its spacing (2**128 - 2**103) and up
    # overflow, what is below rounds to the largest
    top = float(np.finfo(np.float32).max)
    with pytest.raises(ValueError, match=r"got 3\.4028235677973366e\+38 at index \(0, 0\)"):
        corpus.write_parquet_part(d, 3, 5, 0, ["a"], np.array([[2.0**128 - 2.0**103, 0.0]]))
    edge = np.array([[top, -top], [np.inf, 0.5]])
    stored = pq.read_table(corpus.write_parquet_part(d, 3, 5, 0, ["a", "b"], edge))
    stored = stored.column("embedding").combine_chunks().flatten().to_numpy().reshape(2, 2)
    assert stored.dtype == np.float32 and stored.tolist() == edge.tolist()
    below = np.array([[np.nextafter(2.0**128 - 2.0**103, 0.0), 0.0]])
    stored = pq.read_table(corpus.write_parquet_part(d, 4, 5, 0, ["a"], below))
    assert stored.column("embedding").combine_chunks().flatten().to_numpy()[0] == np.float32(top)

    out = tmp_path / "e.npy"
    job = corpus.EmbedJob.prepare(corpus.ListSource(["a", "b", "c"]), out, corpus.model_identity(str(tiny_model_dir)),
                                  chunk_size=2)
    job.start()
    writer = job.writer()
    rows = np.zeros((2, job.dim))
    rows[0, 5] = 1e300
    with pytest.raises(ValueError, match=r"^emb: expected values within float32's range .*got 1e\+300 at index "
                                         r"\(0, 5\)"):
        writer.write(0, ["a", "b"], rows)
    rows[0, 5] = top
    writer.write(0, ["a", "b"], rows)
    job.commit(0)
    writer.close()
    job.close()
    saved = np.load(f"{out}.partial")
    assert saved.dtype == np.float32 and saved[0, 5] == top and np.isfinite(saved).all()
    assert Path(f"{out}.texts.jsonl").read_text() == '"a"\n"b"\n'  # the refused write added no text


def test_write_parquet_part_names_the_part_when_the_directory_goes(tmp_path, monkeypatch):
    """An OS error while the part is written names the part (the documented contract), never the
    hidden temp file: here the directory removed between the checks and the write."""
    d = tmp_path / "ds"
    d.mkdir()
    real_open = open

    def open_after_rmdir(file, *args, **kwargs):
        if ".tmp-" in str(file):
            d.rmdir()
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", open_after_rmdir)
    with pytest.raises(FileNotFoundError) as e:
        corpus.write_parquet_part(d, 3, 5, 0, ["a"], np.ones((1, 2), np.float32))
    assert e.value.filename == str(d / "part-00003.parquet") and e.value.errno == errno.ENOENT


def test_path_and_query_arguments_are_named(tmp_path, search_index, tiny_model_dir):
    """search(index, 5) said "'int' object is not iterable", manifest_path(None) "expected str,
    bytes or os.PathLike object", a path holding a NUL "embedded null byte" (no argument named)."""
    _, outs = search_index
    for queries, error, match in ((5, TypeError, "^queries: expected a str or a non-empty list of str, got int$"),
                                  (b"q", TypeError, "^queries: expected a str or a non-empty list of str, got bytes$"),
                                  (["a", 5], TypeError, "^queries: expected a list of str, got int at index 1$"),
                                  ([], ValueError, "^queries: expected a str or a non-empty list of str, got an empty "
                                                   "list$")):
        with pytest.raises(error, match=match):
            corpus.search(outs["npy"], queries)
    for bad, error, match in ((None, TypeError, "^out: expected a str or os.PathLike, got NoneType$"),
                              (5, TypeError, "^out: expected a str or os.PathLike, got int$"),
                              ("x\0.npy", ValueError, r"^out: expected a path, got 'x\\x00.npy', which holds a NUL")):
        with pytest.raises(error, match=match):
            corpus.manifest_path(bad)
    nul = str(tmp_path / "x\0.npy")
    for call, name in ((lambda: corpus.embed_file(["a"], nul, model=str(tiny_model_dir)), "out"),
                       (lambda: corpus.search(nul, "q"), "index"),
                       (lambda: corpus.open_source(nul), "path"),
                       (lambda: corpus.embed_file(nul, tmp_path / "e.npy", model=str(tiny_model_dir)), "input"),
                       (lambda: corpus.read_manifest(nul), "out")):
        with pytest.raises(ValueError, match=rf"^{name}: expected a path, got '.*x\\x00\.npy', which holds a NUL "
                                             r"character \(no file name can\)$"):
            call()
    for batch_size, error in ((0, ValueError), (True, TypeError), ("2", TypeError)):
        with pytest.raises(error, match="^batch_size: expected an int"):
            corpus.search(tmp_path / "not-opened.npy", "q", batch_size=batch_size)  # before the index is opened
    assert os.listdir(tmp_path) == []


def test_search_checks_the_index_own_model_has_not_changed(tmp_path, tiny_model_dir):
    """With model left out, search loads the model at the name its manifest records: a fine-tune
    saved over that directory since embedding gave queries of another model against the stored
    rows (silently other scores); now its fingerprint is checked, and the original still works."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    lines = corpus_lines(12)
    out = tmp_path / "e.npy"
    corpus.embed_file(write_lines(tmp_path / "c.txt", lines), out, model=str(model), chunk_size=5)
    assert [h[0].id for h in corpus.search(out, [lines[3], lines[8]], k=1)] == [3, 8]
    tuned, _ = _fine_tuned_copy(tiny_model_dir, tmp_path / "tuned")
    shutil.copy(tuned / "model.safetensors", model / "model.safetensors")  # saved over the index's model
    with pytest.raises(ValueError, match=re.escape(f"index: {out} was embedded with the model at {str(model)!r}, "
                                                   f"whose files have changed since")):
        corpus.search(out, lines[3])
    assert corpus.search(out, lines[3], k=1, model=str(tiny_model_dir))[0][0].id == 3  # the model it was made with


def test_docstrings_name_line_ends_as_text():
    r"""The docstrings that name line ends (``\n``, ``\r\n``, a lone ``\r``) hold them as text: the
    module's and the readers' were not raw, so help() showed real line feeds and carriage returns."""
    import inspect

    from transformer_core import chat

    docs = {}
    for module in (corpus, chat):
        docs[module.__name__] = module.__doc__
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            members = vars(obj).items() if inspect.isclass(obj) else ()
            for qual, member in [(name, obj), *((f"{name}.{n}", m) for n, m in members)]:
                doc = getattr(member, "__doc__", None)
                if isinstance(doc, str):
                    docs[f"{module.__name__}.{qual}"] = doc
    assert len(docs) > 50
    assert [k for k, d in docs.items() if "\r" in d] == []
    assert "a line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r``" in " ".join(corpus.__doc__.split())
    assert "``\\n`` or ``\\r\\n`` removed" in " ".join(chat._stdin_turns.__doc__.split())
    assert "a lone ``\\r``" in docs["transformer_core.corpus._csv_problem"]


# ---------------------------------------------------------------- texts of only invisible characters
INVISIBLE_ONLY = ["\u200b", "\ufeff", "\x00\x7f", "\u0301", " \u200b\u0301 \x1f "]
INVISIBLE_WHY = ("only characters that carry no text (control, zero-width or format characters, combining marks, "
                 "private-use characters, the replacement character U+FFFD) (it would embed to [CLS] [SEP] alone)")


def test_invisible_only_texts_embed_as_the_empty_text(tiny_encoder):
    """Why they are blank: each embeds to the very row of "" ([CLS] [SEP] alone), while a visible
    character among them makes a text."""
    rows = tiny_encoder.encode(INVISIBLE_ONLY + [""], normalize=True)
    for row in rows[:-1]:
        np.testing.assert_array_equal(row, rows[-1])
    assert [corpus._blank_kind(t) for t in INVISIBLE_ONLY] == ["invisible"] * 5
    assert [corpus._blank_kind(t) for t in ("", " \t", "\u200bword", "\u0301a", "a")] == [
        "empty", "whitespace", None, None, None]
    assert np.abs(tiny_encoder.encode(["\u200bword"]) - rows[-1]).max() > 1e-3


def test_text_reader_skips_lines_of_only_invisible_characters(tmp_path):
    """A zero-width space, a byte-order mark in mid-file, control characters or a lone combining
    mark on a line passed the blank check (str.strip) and was indexed as the [CLS] [SEP] row."""
    p = tmp_path / "zw.txt"
    p.write_bytes(b"a cat on a mat\n\xe2\x80\x8b\n\xef\xbb\xbf\n\x01\x7f\n\xcc\x81\n \xe2\x80\x8b\xcc\x81 \x1f \n"
                  b"\xe2\x80\x8bword\nthe dog\n")
    assert list(corpus.open_source(p)) == ["a cat on a mat", "\u200bword", "the dog"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_invisible_only_records_are_bad_records(tmp_path, tiny_model_dir, tiny_encoder, fmt):
    values = ["\u200b", "ok", "\u0301", "\x7f\ufeff"]
    p = tmp_path / f"e.{fmt}"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps({"text": v}) + "\n" for v in values), encoding="utf-8")
        where = ["line 1", "line 3", "line 4"]
    elif fmt == "csv":
        p.write_text("id,text\n" + "".join(f"{i},{v}\n" for i, v in enumerate(values)), encoding="utf-8")
        where = ["line 2", "line 4", "line 5"]
    else:
        pq.write_table(pa.table({"text": values}), p)
        where = ["row 1", "row 3", "row 4"]
    kind = "field" if fmt == "jsonl" else "column"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}, {where[0]}: {kind} 'text' is "
                                         rf"{re.escape(INVISIBLE_WHY)} \(--errors skip"):
        list(corpus.open_source(p))
    src = corpus.open_source(p, errors="skip")
    assert list(src) == ["ok"] and src.num_skipped == 3
    assert src.skipped == [(w, f"{kind} 'text' is {INVISIBLE_WHY}") for w in where]
    out = tmp_path / "o.npy"
    r = corpus.embed_file(p, out, model=str(tiny_model_dir), errors="skip")
    assert r.rows == 1 and load_output(out)[1] == ["ok"]
    np.testing.assert_array_equal(np.load(out), tiny_encoder.encode(["ok"], normalize=True))


def test_invisible_only_list_texts_and_queries_are_refused(tmp_path, tiny_model_dir, search_index):
    why = INVISIBLE_WHY.split(" (it would")[0]
    for t in INVISIBLE_ONLY:
        with pytest.raises(ValueError, match=rf"^input: expected some text, got a text of {re.escape(why)} "
                                             rf"at index 1$"):
            corpus.embed_file(["fine", t], tmp_path / "e.npy", model=str(tiny_model_dir))
        with pytest.raises(ValueError, match=rf"^queries: expected some text, got a query of {re.escape(why)} "
                                             rf"at index 0$"):
            corpus.search(search_index[1]["npy"], t)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------- a few messages
def test_resume_with_a_model_changed_under_the_same_name(tmp_path, tiny_model_dir, monkeypatch):
    """The model's files changed since the run started, its path the same: the message told the
    user to pass that very --model. It says the files changed now, and restoring them continues."""
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    f, out = _interrupted_after_two_chunks(tmp_path, model, monkeypatch)
    old_fp = manifest(out)["model"]["fingerprint"]
    tuned, _ = _fine_tuned_copy(tiny_model_dir, tmp_path / "tuned")
    original = (model / "model.safetensors").read_bytes()
    shutil.copy(tuned / "model.safetensors", model / "model.safetensors")
    new_fp = corpus.model_identity(model)["fingerprint"]
    with pytest.raises(ValueError) as e:
        corpus.embed_file(f, out, model=str(model), resume=True)
    assert str(e.value) == (f"resume: {out} was made by the model at {str(model.resolve())!r}, whose files have "
                            f"changed since the run started (fingerprint {old_fp[:12]} then, {new_fp[:12]} now); "
                            f"--overwrite starts over with it, or restoring its original files continues the run")
    assert "--model" not in str(e.value)
    (model / "model.safetensors").write_bytes(original)
    r = corpus.embed_file(f, out, model=str(model), resume=True)
    assert r.rows == 50 and r.rows_computed == 30
    ref = tmp_path / "ref.npy"
    corpus.embed_file(f, ref, model=str(model), chunk_size=10)
    np.testing.assert_array_equal(np.load(out), np.load(ref))


def test_a_parquet_writer_whose_directory_another_run_replaced_is_stale(tmp_path, tiny_model_dir, tiny_encoder):
    """Run A's directory (OUT.parquet.partial) was removed by run B's overwrite (B finished: its
    data is OUT.parquet now): A's writer said "directory: ... does not exist", an API argument's
    message. Now it is the documented stale-run error (ESTALE), and B's output is untouched."""
    lines = corpus_lines(20)
    out = tmp_path / "r1.parquet"
    model = str(tiny_model_dir)
    job = corpus.EmbedJob.prepare(corpus.ListSource(lines), out, corpus.model_identity(model), chunk_size=10)
    job.start()
    data = Path(f"{out}.partial")
    assert data.is_dir()
    with pytest.raises(ValueError, match="^out: another run holds"):  # not while A holds the output
        corpus.embed_file(lines, out, model=model, chunk_size=10, overwrite=True)
    job.close()  # A interrupted: its writer (a cancelled task still running) is all that is left of it
    corpus.embed_file(lines, out, model=model, chunk_size=10, overwrite=True)  # run B replaces and finishes
    assert not data.exists()
    index, start, texts = next(job.pending())
    emb = tiny_encoder.encode(texts, normalize=True)
    with pytest.raises(OSError) as e:
        job.writer().write(start, texts, emb)
    assert e.value.errno == errno.ESTALE
    assert str(e.value) == (f"[Errno {errno.ESTALE}] not written: its directory {data} is gone, it is no longer the "
                            f"data of run {job.run} (another run replaced, resumed or finished it): "
                            f"'{data / 'part-00000.parquet'}'")
    with pytest.raises(OSError, match=f"its directory .* is gone, it is no longer the data of run {job.run}"):
        corpus.write_parquet_part(data, 1, 5, 10, texts, emb, run=job.run)
    with pytest.raises(FileNotFoundError, match=r"^directory: .* does not exist$"):  # no run: the argument
        corpus.write_parquet_part(data, 1, 5, 10, texts, emb)
    ids, got, rows = load_output(out)
    assert got == lines and not data.exists()
    np.testing.assert_array_equal(rows, np.concatenate([tiny_encoder.encode(lines[a:a + 10], normalize=True)
                                                       for a in (0, 10)]))


@pytest.mark.parametrize("name", [".npy", ".parquet", ".NPY"])
def test_an_output_named_only_by_its_extension_asks_for_a_name(tmp_path, name):
    out = tmp_path / name
    with pytest.raises(ValueError, match=rf"^out: expected a file name before the extension \(such as "
                                         rf"embeddings{re.escape(name.lower())}\), got '{re.escape(str(out))}'$"):
        corpus.embed_file(["x"], out)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------- two runs of one Parquet output
def test_a_second_parquet_run_is_refused_while_the_first_holds_the_output(tmp_path, tiny_model_dir, tiny_encoder):
    """A Parquet run holds the output's lock from its start to its end, as a .npy run does: a second
    run of the same output (overwrite, resume) is refused, instead of replacing the first's
    directory and manifest (a stale commit of the first then replaced the second's manifest, and a
    later resume mixed the second's rows into the first's input)."""
    model = str(tiny_model_dir)
    lines = corpus_lines(25)
    f = write_lines(tmp_path / "old.txt", lines)
    new = write_lines(tmp_path / "new.txt", corpus_lines(25, 500))
    out = tmp_path / "out.parquet"
    a = corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(model), chunk_size=10,
                                batch_size=32)
    b = corpus.EmbedJob.prepare(corpus.open_source(new), out, corpus.model_identity(model), chunk_size=10,
                                batch_size=32, overwrite=True)  # prepared before a started: nothing to refuse yet
    a.start()
    assert (tmp_path / ".out.parquet.lock").exists()
    with pytest.raises(ValueError, match=f"^out: another run holds {re.escape(str(out))} "):
        b.start()
    writer = a.writer()
    pending = list(a.pending())
    index, start, texts = pending[0]
    a.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, batch_size=32, normalize=True)))
    for kwargs in ({"overwrite": True}, {"resume": True}):  # refused at their prepare
        with pytest.raises(ValueError, match=f"^out: another run holds {re.escape(str(out))} "):
            corpus.embed_file(new if "overwrite" in kwargs else f, out, model=model, **kwargs)
    for index, start, texts in pending[1:]:
        a.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, batch_size=32, normalize=True)))
    a.finish()
    ref = np.concatenate([tiny_encoder.encode(lines[i:i + 10], batch_size=32, normalize=True) for i in (0, 10, 20)])
    ids, got, emb = load_output(out)
    assert got == lines and ids.tolist() == list(range(25)) and np.array_equal(emb, ref)
    assert not (tmp_path / ".out.parquet.lock").exists()
    assert sorted(os.listdir(tmp_path)) == ["new.txt", "old.txt", "out.parquet", "out.parquet.manifest.json"]


def test_resume_and_finish_refuse_the_parts_of_another_run(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch):
    """Where there are no locks, run A's commit that passed its check just before run B replaced the
    output (overwrite) can still save A's manifest over B's: B's parts then sit under A's manifest.
    Every part records its run (Parquet metadata), the manifest the runs of its output: resume
    refuses such a part (it accepted it, and the output mixed new.txt's rows into old.txt's), and so
    does the last step; the parts of an output's own runs (the first and each resumption) are kept."""
    monkeypatch.setattr(corpus, "fcntl", None)
    model = str(tiny_model_dir)
    old_lines, new_lines = corpus_lines(30), corpus_lines(30, 500)
    old = write_lines(tmp_path / "old.txt", old_lines)
    new = write_lines(tmp_path / "new.txt", new_lines)
    out = tmp_path / "out.parquet"
    data = Path(f"{out}.partial")
    mid = corpus.model_identity(model)

    def run_chunks(job, n):
        writer = job.writer()
        for index, start, texts in list(job.pending())[:n]:
            job.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, batch_size=32, normalize=True)))

    a = corpus.EmbedJob.prepare(corpus.open_source(old), out, mid, chunk_size=10, batch_size=32)
    a.start()
    run_chunks(a, 1)
    a_manifest = corpus.manifest_path(out).read_bytes()  # A's next commit, checked before B started
    a_part = pq.read_metadata(data / "part-00000.parquet").metadata
    b = corpus.EmbedJob.prepare(corpus.open_source(new), out, mid, chunk_size=10, batch_size=32, overwrite=True)
    b.start()
    run_chunks(b, 2)
    corpus.manifest_path(out).write_bytes(a_manifest)  # ... lands now, over B's
    with pytest.raises(ValueError) as e:
        corpus.embed_file(old, out, model=model, resume=True)
    assert str(e.value) == (f"out: {data / 'part-00000.parquet'}, the part of chunk 0 that the manifest "
                            f"{corpus.manifest_path(out)} records as done, was written by run {b.run}, not by a "
                            f"run of this output ({a.run}): another run of the same output replaced it; "
                            f"--overwrite starts over")
    assert corpus.manifest_path(out).read_bytes() == a_manifest and (data / f".run-{b.run}").exists()
    assert a_part[corpus.PART_RUN_KEY] == a.run.encode() and json.loads(a_manifest)["runs"] == [a.run]
    # the last step checks every part too: a part of another run planted in a run's directory
    r = corpus.embed_file(old, out, model=model, chunk_size=10, overwrite=True)
    assert r.rows_computed == 30
    c = corpus.EmbedJob.prepare(corpus.open_source(new), tmp_path / "c.parquet", mid, chunk_size=10, batch_size=32)
    c.start()
    run_chunks(c, 3)
    c_data = Path(f"{tmp_path / 'c.parquet'}.partial")
    (c_data / ".run-0123abcd").touch()
    corpus.write_parquet_part(c_data, 1, 5, 10, old_lines[10:20],
                              tiny_encoder.encode(old_lines[10:20], batch_size=32, normalize=True), run="0123abcd")
    with pytest.raises(ValueError, match=r"part-00001.parquet, the part of chunk 1 .* was written by run 0123abcd"):
        c.finish()
    # an interrupted run resumed twice: the parts of its three runs make one output, bitwise
    d = corpus.EmbedJob.prepare(corpus.open_source(old), tmp_path / "d.parquet", mid, chunk_size=10, batch_size=32)
    d.start()
    run_chunks(d, 1)
    d.close()
    e1 = corpus.EmbedJob.prepare(corpus.open_source(old), tmp_path / "d.parquet", mid, resume=True, batch_size=32)
    e1.start()
    run_chunks(e1, 1)
    e1.close()
    assert manifest(tmp_path / "d.parquet")["runs"] == [d.run, e1.run]
    r = corpus.embed_file(old, tmp_path / "d.parquet", model=model, resume=True)
    assert r.rows_computed == 10 and len(manifest(tmp_path / "d.parquet")["runs"]) == 3
    ref = np.concatenate([tiny_encoder.encode(old_lines[i:i + 10], batch_size=32, normalize=True) for i in (0, 10, 20)])
    for path in (out, tmp_path / "d.parquet"):
        ids, got, emb = load_output(path)
        assert got == old_lines and np.array_equal(emb, ref)


def test_an_empty_list_input_is_described_as_the_list_given(tmp_path, tiny_model_dir):
    """A Python list is not "sentences given as arguments" (the CLI's wording, kept for the CLI's
    own ListSource)."""
    for call in (lambda: corpus.embed_file([], tmp_path / "e.npy", model=str(tiny_model_dir)),
                 lambda: corpus.embed_summary([], model=str(tiny_model_dir))):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == "input: the list given as input has no text to embed (it is empty)"
    assert corpus.ListSource(["a", "b"]).describe() == "2 sentences given as arguments"
    with pytest.raises(TypeError, match="^input: expected a list of str, got int at index 1$"):
        corpus.embed_file(["a", 3], tmp_path / "e.npy", model=str(tiny_model_dir))
    assert os.listdir(tmp_path) == []


def _small_npy_index(tmp_path, tiny_model_dir, n=12):
    lines = corpus_lines(n)
    out = tmp_path / "idx.npy"
    corpus.embed_file(lines, out, model=str(tiny_model_dir), chunk_size=5)
    return lines, out, Path(f"{out}.texts.jsonl")


@pytest.mark.parametrize("damage, why", [(b"X", "Expecting value: line 1 column 1 (char 0)"),
                                         (b"\xff", "'utf-8' codec can't decode byte 0xff in position 0"),
                                         (b"7", "got a number")])
def test_a_damaged_texts_file_names_the_file_and_line(tmp_path, tiny_model_dir, damage, why):
    """A line of OUT.npy.texts.jsonl that is not a JSON string: the error names the file and the
    line (it was json's bare "Expecting value: line 1 column 1 (char 0)", or a UnicodeDecodeError),
    by the API and the CLI."""
    lines, out, texts = _small_npy_index(tmp_path, tiny_model_dir)
    raw = texts.read_bytes().split(b"\n")
    raw[6] = damage + raw[6][1:] if damage != b"7" else b"7" + b" " * (len(raw[6]) - 1)  # the same size
    texts.write_bytes(b"\n".join(raw))
    with pytest.raises(ValueError) as e:
        corpus.search(out, lines[0], k=12)
    assert str(e.value).startswith(f"index: {texts}, line 7: expected a JSON string")
    assert why in str(e.value) and str(e.value).endswith("`embed --overwrite` makes the index again")
    if damage == b"X":
        r = run_cli("search", "--index", out, lines[0], "-k", "12", check=False)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.strip() == f"transformer_core search: {e.value}"


def test_a_missing_or_cut_texts_file_is_reported_not_silent(tmp_path, tiny_model_dir):
    """The manifest records texts_bytes > 0, the sidecar is gone or shorter: search warns (naming
    the file and the bytes expected and found) and the CLI prints the warning and "(text
    missing)", not "(text not stored)" with no word about it."""
    lines, out, texts = _small_npy_index(tmp_path, tiny_model_dir)
    expected = manifest(out)["texts_bytes"]
    assert expected == texts.stat().st_size > 0
    full = texts.read_bytes()
    for cut, state in ((None, "is missing"), (10, "holds 10 bytes")):
        if cut is None:
            texts.unlink()
        else:
            texts.write_bytes(full[:cut])
        with pytest.warns(corpus.TextsMissingWarning) as caught:
            hits = corpus.search(out, lines[3], k=2)[0]
        assert [h.text for h in hits] == [None, None] and hits[0].id == 3
        assert len(caught) == 1 and str(caught[0].message) == (
            f"index: {texts} {state}, its manifest {corpus.manifest_path(out)} records {expected:,} bytes of texts: "
            f"the hits are shown without their texts (the file was removed or cut; `embed --overwrite` makes "
            f"the index again)")
        r = run_cli("search", "--index", out, lines[3], "-k", "2")
        assert r.stderr.strip() == f"transformer_core search: warning: {caught[0].message}"
        assert r.stdout.count("(text missing)") == 2 and "not stored" not in r.stdout
    texts.write_bytes(full)
    r = run_cli("search", "--index", out, lines[3], "-k", "2")
    assert r.stderr == "" and "(text" not in r.stdout and _short_line(lines[3]) in r.stdout


def _short_line(text):
    return corpus._short(text, 100)


def test_a_path_too_long_for_the_file_system_names_its_argument(tmp_path, tiny_model_dir):
    """`--file`, `--index` and `--out` given a name longer than the file system takes: the error
    names the argument and shows the path cut short, as `--model` does (it printed all 5000
    characters and "File name too long" with no argument)."""
    long = tmp_path / ("a" * 5000)
    clipped = repr(str(long))[:120]
    model = str(tiny_model_dir)
    cases = [(lambda: corpus.open_source(long), "path", long),
             (lambda: corpus.embed_file(long, tmp_path / "o.npy", model=model), "input", long),
             (lambda: corpus.embed_file(["x"], f"{long}.npy", model=model), "out", Path(f"{long}.npy")),
             (lambda: corpus.search(f"{long}.npy", "q"), "index", Path(f"{long}.npy"))]
    for call, name, path in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == (f"{name}: {repr(str(path))[:120]}... ({len(str(path))} characters): the name is "
                                f"too long for the file system (File name too long)")
    # a name that fits, but not with the suffixes of the run's own files (OUT.npy.manifest.json's temporary)
    out = tmp_path / ("b" * 250 + ".npy")
    with pytest.raises(ValueError, match=r"^out: .*\(\d+ characters\): the name is too long for the file system "
                                         r"once a run adds the suffixes of its own files \(the longest, a temporary "
                                         r"manifest, is named with \d+ bytes\) \(File name too long\)$"):
        corpus.embed_file(["x"], out, model=model)
    assert os.listdir(tmp_path) == []
    for flags, name in ((["--file", long], "--file"), (["--out", f"{long}.npy", "x"], "out")):
        r = run_cli("embed", "--model", model, *flags, check=False)
        assert r.returncode == 2 and len(r.stderr) < 400, r.stderr
        assert r.stderr.startswith(f"transformer_core embed: {name}: {clipped}... (")
    r = run_cli("search", "--index", f"{long}.npy", "q", check=False)
    assert r.returncode == 2 and r.stderr.startswith(f"transformer_core search: index: {clipped}... (")


# ---------------------------------------------------------------------- an input edited during a run
def _edit_in_place(f: Path, old: bytes, new: bytes, keep_mtime: bool = False) -> None:
    """Rewrites ``old`` as ``new`` (same length) in the file itself (same inode), as an editor
    saving over it would, its mtime a second later (whatever the clock's granularity);
    ``keep_mtime``: its mtime put back, so that only its bytes tell."""
    assert len(old) == len(new)
    st = f.stat()
    data = f.read_bytes()
    assert data.count(old) == 1
    with open(f, "r+b") as g:
        g.write(data.replace(old, new))
    mtime = st.st_mtime_ns if keep_mtime else st.st_mtime_ns + 10**9
    os.utime(f, ns=(st.st_atime_ns, mtime))
    assert f.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("keep_mtime", [False, True])
@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_an_input_edited_during_the_run_is_refused_never_marked_complete(tmp_path, tiny_model_dir, tiny_encoder,
                                                                          kind, keep_mtime):
    """The file rewritten in place after the first chunk (same size, same number of lines, a line of
    a later chunk changed): the run was marked complete, its rows half old, half new, under the old
    file's SHA-256. Now pending refuses it: by its mtime before the next chunk, or (mtime put back)
    by the hash of the bytes it read before the last chunk is handed out; nothing is marked complete.
    (Lines of about 10 KB: the edit lands beyond what the reader had buffered when it was made.)"""
    lines = [line + ' word' * 2000 for line in corpus_lines(30)]
    f = write_lines(tmp_path / "in.txt", lines)
    out = tmp_path / f"out.{kind}"
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(str(tiny_model_dir)),
                                  chunk_size=10, batch_size=32)
    job.start()
    writer = job.writer()
    handed_out = []
    with pytest.raises(ValueError, match=rf"^input: {re.escape(str(f))} changed during the run: its content "
                                         r"\(SHA-256 \w{12}\) is not the one the run started from \(\w{12}\).*"
                                         r"the output is left incomplete: --overwrite starts over$"):
        for index, start, texts in job.pending():
            handed_out.append(index)
            assert texts == lines[start:start + 10]  # what was handed out is the original file's
            job.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, batch_size=32, normalize=True)))
            if index == 0:
                _edit_in_place(f, lines[25].encode(), lines[25].upper().encode(), keep_mtime)
    writer.close()
    job.close()
    # the mtime is seen before chunk 1; the bytes (mtime put back) once they are read, before chunk 2
    assert handed_out == ([0, 1] if keep_mtime else [0])
    man = manifest(out)
    assert man["complete"] is False and man["input"]["sha256"] != hashlib.sha256(f.read_bytes()).hexdigest()
    assert not out.exists()
    with pytest.raises(ValueError, match="cannot finish"):
        job.finish()
    with pytest.raises(ValueError, match=r"^resume: the input is not the one .* was started from: its content"):
        corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(str(tiny_model_dir)), resume=True)


def test_an_input_edited_before_finish_is_refused_and_a_touched_one_completes(tmp_path, tiny_model_dir,
                                                                            tiny_encoder):
    """finish checks the file again (size and mtime, then its hash): an edit after the last chunk
    was read leaves the output incomplete. A file only touched during the run (same bytes, a newer
    mtime) completes, bit-identical to an untouched run."""
    lines = corpus_lines(30)
    f = write_lines(tmp_path / "in.txt", lines)
    ref = tmp_path / "ref.npy"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=10)
    mid = corpus.model_identity(str(tiny_model_dir))
    for edit in (True, False):
        out = tmp_path / f"out-{edit}.npy"
        job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=10, batch_size=32)
        job.start()
        writer = job.writer()
        for index, start, texts in job.pending():
            job.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, batch_size=32, normalize=True)))
            st = f.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched after every chunk
        writer.close()
        if edit:
            original = f.read_bytes()
            _edit_in_place(f, lines[3].encode(), lines[3].upper().encode())
            with pytest.raises(ValueError, match=rf"^input: {re.escape(str(f))} changed during the run"):
                job.finish()
            job.close()
            assert manifest(out)["complete"] is False and not out.exists()
            f.write_bytes(original)
        else:
            job.finish()
            assert manifest(out)["complete"] is True
            _, texts, emb = load_output(out)
            _, rtexts, remb = load_output(ref)
            assert texts == rtexts == lines and np.array_equal(emb, remb)


def test_the_reviewers_reproducer_of_an_input_edited_during_a_run(tmp_path, encoder):
    """The review's case with the real model: 600 lines, chunks of 200, lines 100 and 500 rewritten
    in place after the first chunk. It completed, row 500 the new text, row 100 the old; now it is
    refused and incomplete. The same run without the edit completes, bit-identical to embed_file."""
    lines = [f"line number {i:04d} about cats" for i in range(600)]
    for edit in (True, False):
        f = write_lines(tmp_path / f"in-{edit}.txt", lines)
        out = tmp_path / f"o-{edit}.npy"
        job = corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(MODEL_NAME), chunk_size=200,
                                      batch_size=32)
        job.start()
        writer = job.writer()

        def run():
            for n, (idx, start, texts) in enumerate(job.pending()):
                job.commit(idx, **writer.write(start, texts, encoder.encode(texts, batch_size=32, normalize=True,
                                                                            progress=False)))
                if n == 0 and edit:
                    data = f.read_text().replace("line number 0500 about cats", "LINE NUMBER 0500 ABOUT DOGS")
                    with open(f, "r+") as g:
                        g.write(data.replace("line number 0100 about cats", "LINE NUMBER 0100 ABOUT DOGS"))
            writer.close()
            job.finish()

        if edit:
            with pytest.raises(ValueError, match="changed during the run"):
                run()
            job.close()
            assert manifest(out)["complete"] is False
        else:
            run()
            ref = tmp_path / "ref.npy"
            corpus.embed_file(f, ref, model=MODEL_NAME, chunk_size=200, batch_size=32)
            assert manifest(out)["complete"] is True
            assert np.array_equal(np.load(out), np.load(ref))
            assert Path(f"{out}.texts.jsonl").read_bytes() == Path(f"{ref}.texts.jsonl").read_bytes()


@pytest.mark.parametrize("other_pass", ["prepare", "count", "list"])
def test_another_pass_over_the_source_during_a_run_leaves_its_input_check_alone(tmp_path, other_pass):
    """The review's reproducer: the hash of the bytes pending read sat on the shared TextSource, so
    any other pass over it while the run was suspended between chunks (a second output prepared
    from the same file, a count of its texts) fed its bytes too, and the untouched file was refused
    as "changed during the run". The hash is now the run's own pass's; the run completes."""
    f = write_lines(tmp_path / "in.txt", [f"line {i}" for i in range(600)])
    src = corpus.open_source(f)
    mid = {"name": "m", "fingerprint": "0" * 32, "fingerprint_version": corpus.FINGERPRINT_VERSION, "dim": 4}
    a = corpus.EmbedJob.prepare(src, tmp_path / "a.npy", mid, chunk_size=200)
    a.start()
    wa = a.writer()
    for n, (idx, start, texts) in enumerate(a.pending()):
        a.commit(idx, **wa.write(start, texts, np.full((len(texts), 4), 0.5, np.float32)))
        if n == 0:
            if other_pass == "prepare":
                assert corpus.EmbedJob.prepare(src, tmp_path / "b.npy", mid, chunk_size=200).num_rows == 600
            elif other_pass == "count":
                assert sum(1 for _ in src) == 600
            else:
                assert list(src)[599] == "line 599"
    wa.close()
    a.finish()
    assert manifest(tmp_path / "a.npy")["complete"] is True
    assert np.load(tmp_path / "a.npy").shape == (600, 4)


# ------------------------------------------------------------------------------ normalize on resume
def test_resume_refuses_another_normalize_and_keeps_the_runs_by_default(tmp_path, tiny_model_dir):
    """normalize was checked for its type and then ignored on resume: a caller encoding with
    normalize=False wrote unnormalised rows into an output recorded as normalised. Now it is refused
    (as chunk_size and batch_size are); left out it keeps the run's; a new run records True."""
    f = write_lines(tmp_path / "in.txt", [f"text {i}" for i in range(10)])
    mid = corpus.model_identity(str(tiny_model_dir))
    for recorded in (True, False):
        out = tmp_path / f"o-{recorded}.npy"
        kwargs = {} if recorded else {"normalize": False}
        job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=5, **kwargs)
        assert job.manifest["normalize"] is recorded
        job.start()
        job.close()  # an interrupted run
        with pytest.raises(ValueError, match=rf"^normalize: {re.escape(str(out))} was started with "
                                             rf"normalize={recorded}, got {not recorded}; leave it out to continue"):
            corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, normalize=not recorded)
        for given in (None, recorded):
            kw = {} if given is None else {"normalize": given}
            job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True, **kw)
            assert job.manifest["normalize"] is recorded
    assert corpus.EmbedJob.prepare.__kwdefaults__["normalize"] is None


# ------------------------------------------------------------------------------ ~ in model_identity
def test_model_identity_expands_a_tilde(tmp_path, tiny_model_dir, monkeypatch):
    """model_identity("~/m") recorded "~/m" (the exists() test did not expand it), which another
    user or HOME resolves elsewhere; it is now the absolute, resolved path, as for any other path."""
    import shutil

    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(tiny_model_dir, home / "m")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    ident = corpus.model_identity("~/m")
    assert ident["name"] == str((home / "m").resolve())
    assert ident["fingerprint"] == corpus.model_identity(tiny_model_dir)["fingerprint"]
    out = tmp_path / "o.npy"
    corpus.embed_file(["a cat", "a dog"], out, model="~/m")
    assert manifest(out)["model"]["name"] == str((home / "m").resolve())
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))  # another HOME searches the same index
    assert [h.id for h in corpus.search(out, "a cat", k=1)[0]] == [0]


def test_file_dash_is_refused_as_standard_input(tmp_path, monkeypatch, capsys):
    """``--file -`` said "no such file"; it gets the message of /dev/stdin (the input is read more
    than once). A file actually named ``-`` is still read."""
    monkeypatch.chdir(tmp_path)
    rc, stdout, stderr = _cli(capsys, "embed", "--file", "-", "--out", "o.npy")
    assert (rc, stdout) == (2, "")
    assert stderr == ("transformer_core embed: --file: - (standard input) is not a regular file; the input is read "
                      "more than once (to check it, to resume): save it to a file first\n")
    write_lines(tmp_path / "-", ["one", "two"])
    assert list(corpus._open_source("-", None, None, "strict", "--file")) == ["one", "two"]
    assert os.listdir(tmp_path) == ["-"]


# ------------------------------------------- embeddings changed by sentence-transformers 6's rules
# Fingerprints that the code before those rules (HEAD~3 of the fix, and the commit that brought
# the rules) computed, of all-MiniLM-L6-v2's files in the folders _minilm_folder makes.
_FP_MINILM = "e091619e8be0d3134366ebcb3064de15"     # all-MiniLM-L6-v2, and its folder without modules.json
_FP_CLS_AFTER_PROMPT = "e2709a025348cba4c6fb82af100429a3"  # cls pooling, include_prompt false, "query: "
_FP_CLS_WITH_PROMPT = "9838b227ef50edb5457b2024b30f35c7"   # the same with include_prompt true
_FP_EMPTY_PROMPT = "56b0a6b69c9ebb56ffa74a950577614a"      # mean pooling, include_prompt false, prompt ""
_QUERY = {"prompts": {"query": "query: "}, "default_prompt_name": "query"}


def _minilm_folder(dest: Path, pooling: dict | None, st: dict | None = None) -> Path:
    """all-MiniLM-L6-v2's files linked into ``dest``, with ``pooling`` as 1_Pooling/config.json (None:
    no modules.json, a plain folder) and ``st`` as config_sentence_transformers.json."""
    import shutil

    from transformer_core.hub import resolve_model_dir

    shutil.copytree(resolve_model_dir(MODEL_NAME), dest, copy_function=os.symlink)
    if pooling is None:
        (dest / "modules.json").unlink()
    else:
        (dest / "1_Pooling" / "config.json").unlink()
        (dest / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384, **pooling}))
    if st is not None:
        (dest / "config_sentence_transformers.json").unlink()
        (dest / "config_sentence_transformers.json").write_text(json.dumps(st))
    return dest


def test_cls_after_the_prompt_changes_only_that_folders_fingerprint(tmp_path):
    """cls pooling with include_prompt false and a default prompt now pools the first token after
    the prompt ([CLS] before), but the fingerprint was the same: a resume mixed the two poolings.
    That folder's fingerprint changed; every other model's is what the code before computed."""
    cls = {"pooling_mode_cls_token": True, "include_prompt": False}
    assert corpus.model_identity(MODEL_NAME)["fingerprint"] == _FP_MINILM
    assert corpus.model_identity(_minilm_folder(tmp_path / "plain", None))["fingerprint"] == _FP_MINILM
    assert corpus.model_identity(_minilm_folder(tmp_path / "incl", {**cls, "include_prompt": True},
                                                _QUERY))["fingerprint"] == _FP_CLS_WITH_PROMPT
    after = _minilm_folder(tmp_path / "after", cls, _QUERY)
    fp = corpus.model_identity(after)["fingerprint"]
    assert fp != _FP_CLS_AFTER_PROMPT and corpus.FINGERPRINT_VERSION == 2
    # the token pooled did change: the first after the prompt, as sentence-transformers 6 (not
    # [CLS]); the reference: transformers' hidden states of the prompted text
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(after))
    hf = transformers.AutoModel.from_pretrained(str(after)).eval()
    n = len(tok("query: ", add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        hidden = hf(**tok("query: a man plays a guitar", return_tensors="pt")).last_hidden_state[0].numpy()
    row = tc.SentenceEncoder.from_pretrained(after).encode(["a man plays a guitar"], normalize=False)[0]
    np.testing.assert_allclose(row, hidden[1 + n], atol=1e-4)
    assert np.abs(row - hidden[0]).max() > 1e-2


def _resume_message(tmp_path, folder: Path, recorded: str) -> str:
    """The message of a resume of an interrupted run of ``folder`` whose manifest holds the
    fingerprint ``recorded`` (as the code before the rules wrote it)."""
    f = write_lines(tmp_path / "in.txt", [f"sentence number {i}" for i in range(4)])
    out = tmp_path / f"{folder.name}.npy"
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, corpus.model_identity(folder), chunk_size=2)
    job.start()
    job.close()  # interrupted before its first chunk
    man = manifest(out)
    man["model"]["fingerprint"] = recorded
    Path(f"{out}.manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError) as e:
        corpus.embed_file(f, out, model=str(folder), resume=True)
    return str(e.value)


@pytest.mark.parametrize("case", ["cls", "empty"])
def test_an_output_of_the_rules_before_is_refused_as_embedded_otherwise(tmp_path, case):
    """An output made before sentence-transformers 6's rules with a folder they change: the cls
    one was resumed (rows of two poolings); the empty-prompt one was refused as "whose files have
    changed ... restoring its original files continues the run", which cannot help. Both are now
    refused, saying the files are unchanged, why the embeddings differ, and --overwrite only; so is
    a search of such an index. Other files under the same name still get the files message."""
    if case == "cls":
        folder = _minilm_folder(tmp_path / "clsq", {"pooling_mode_cls_token": True, "include_prompt": False},
                                _QUERY)
        recorded, why = _FP_CLS_AFTER_PROMPT, ("its cls pooling without the prompt (include_prompt false) takes "
                                               "the first token after the prompt now (as sentence-transformers "
                                               "6), no longer [CLS]")
    else:
        folder = _minilm_folder(tmp_path / "emptyq", {"pooling_mode_mean_tokens": True, "include_prompt": False},
                                {"prompts": {"query": ""}, "default_prompt_name": "query"})
        recorded, why = _FP_EMPTY_PROMPT, ("its empty default prompt is no prompt now (as in sentence-transformers "
                                           "6): [CLS] is pooled with the text, no longer left out")
    name = str(folder.resolve())
    out = tmp_path / f"{folder.name}.npy"
    assert _resume_message(tmp_path, folder, recorded) == (
        f"resume: {out} was made by an earlier version with the model at {name!r}; the model's files are "
        f"unchanged, but this version embeds with it differently: {why}, so its rows would not match the ones "
        f"already made; --overwrite makes the output again")
    assert manifest(out)["complete"] is False
    idx = tmp_path / "idx.npy"
    corpus.embed_file(["a cat", "a dog"], idx, model=str(folder))
    man = manifest(idx)
    man["model"]["fingerprint"] = recorded
    Path(f"{idx}.manifest.json").write_text(json.dumps(man))
    for arg, model in (("index", None), ("model", str(folder))):
        with pytest.raises(ValueError) as e:
            corpus.search(idx, "a cat", model=model)
        assert str(e.value) == (f"{arg}: {idx} was embedded by an earlier version with the model at {name!r}; the "
                                f"model's files are unchanged, but this version embeds with it differently: {why}, "
                                f"so its queries would not match the rows; embed the corpus again (--overwrite)")
    # another fingerprint of the same name (a fine-tune saved over it): still the files message
    other = tmp_path / "other"
    other.mkdir()
    message = _resume_message(other, folder, "0" * 32)
    assert "whose files have changed since the run started" in message and "embeds" not in message


@pytest.mark.parametrize("suffix", [".parquet", ".npy"])
def test_an_interrupt_inside_the_manifests_save_counts_what_is_on_disk(tmp_path, tiny_model_dir, monkeypatch, suffix):
    """Ctrl-C inside the save of the third chunk's manifest: commit had recorded the chunk in memory
    before the save, so the message said "3 of 10 chunks ... are saved" while the manifest on disk
    had 2, and the resume that followed did one chunk more than the message promised. The message
    now counts what the manifest on disk records, and --resume finishes the same rows."""
    f = tmp_path / "c.txt"
    f.write_text("".join(f"line {i}\n" for i in range(1000)), encoding="utf-8")
    out = tmp_path / f"o{suffix}"
    atomic_write, saves = corpus._atomic_write, []

    def interrupted_write(path, data, hint=None):
        if str(path).endswith(".manifest.json"):
            saves.append(path)
            if len(saves) == 4:  # the new run's manifest, then chunks 0 and 1; the third chunk's save
                raise KeyboardInterrupt
        return atomic_write(path, data, hint)

    monkeypatch.setattr(corpus, "_atomic_write", interrupted_write)
    with pytest.raises(KeyboardInterrupt) as info:
        corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=100)
    monkeypatch.undo()
    on_disk = corpus.completed_chunks(json.loads(Path(f"{out}.manifest.json").read_text()))
    assert on_disk == {0, 1}
    assert str(info.value).startswith("interrupted: 2 of 10 chunks (200 of 1000 texts) are saved in "), info.value
    r = corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=100, resume=True)
    assert (r.rows, r.chunks_computed) == (1000, 8)
    ref = tmp_path / f"ref{suffix}"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=100)
    if suffix == ".npy":
        np.testing.assert_array_equal(np.load(out), np.load(ref))
    else:
        a, b = pq.read_table(out).sort_by("id"), pq.read_table(ref).sort_by("id")
        assert a.column("text").to_pylist() == b.column("text").to_pylist()
        np.testing.assert_array_equal(np.stack(a.column("embedding").to_numpy(zero_copy_only=False)),
                                      np.stack(b.column("embedding").to_numpy(zero_copy_only=False)))


# ------------------------------------------------------------- texts the tokenizer drops are blank
# U+FFFD, private-use characters (Co: the BMP's and planes 15 and 16), U+1734 (a nonspacing mark
# in the tokenizer's Unicode tables, Mc since Unicode 14): each reduced to [CLS] [SEP] by BERT's
# normalizer, as the zero-width space is, but taken as text before.
DROPPED_ONLY = ["\ufffd", "\ue000", "\U000f0000\U00100001", " \ufffd\u200b\ue123 ", "\u1734", "\ufffd\u0301"]


def test_every_character_the_tokenizer_drops_is_blank(model_dir, tiny_encoder):
    """Every code point that the embedded tokenizer (tokenizers, all-MiniLM-L6-v2's tokenizer.json)
    turns into no token at all is blank by the rule, so no text of such characters is embedded as
    [CLS] [SEP] alone; a character it keeps (an unassigned code point, made [UNK]) is not blank."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]  # surrogates: invalid Unicode
    encodings = tok.encode_batch(chars, add_special_tokens=False)
    dropped = [c for c, e in zip(chars, encodings) if not e.ids]
    assert {"\ufffd", "\ue000", "\U0010fffd", "\u200b", "\u1734"} <= set(dropped)
    assert [f"U+{ord(c):04X}" for c in dropped if not corpus._blank_kind(c)] == []
    for t in DROPPED_ONLY:
        assert tok.encode(t).tokens == ["[CLS]", "[SEP]"], t
        assert corpus._blank_kind(t) == "invisible", t
    kept = ["\u0378", "\U000e0080", "\ufffd a", "\ue000x", "\u00a9"]  # Cn ([UNK]), with a letter, a symbol
    for t in kept:
        assert tok.encode(t, add_special_tokens=False).ids, t
        assert corpus._blank_kind(t) is None, t
    rows = tiny_encoder.encode(DROPPED_ONLY + [""], normalize=True)
    for row in rows[:-1]:
        np.testing.assert_array_equal(row, rows[-1])  # the same vector as the empty text
    with pytest.raises(ValueError, match="^queries: expected valid Unicode text, got a lone surrogate"):
        corpus.search("unused.npy", "\ud800")  # a lone surrogate stays an invalid text, not a blank one


def test_texts_of_dropped_characters_are_skipped_or_refused(tmp_path, tiny_model_dir, tiny_encoder, search_index):
    """A line of U+FFFD (what a lossy decode leaves) or of private-use characters was embedded as
    [CLS] [SEP] alone, and such a query was accepted, scoring 1.0 against every one of them."""
    p = tmp_path / "in.txt"
    p.write_text("hello\n\u200b\n\ufffd\n\ue000\n\U000f0000\nworld\n", encoding="utf-8")
    assert list(corpus.open_source(p)) == ["hello", "world"]
    out = tmp_path / "o.npy"
    assert corpus.embed_file(p, out, model=str(tiny_model_dir)).rows == 2
    ids, texts, emb = load_output(out)
    assert texts == ["hello", "world"]
    np.testing.assert_array_equal(emb, tiny_encoder.encode(["hello", "world"], normalize=True))
    j = tmp_path / "in.jsonl"
    j.write_text("".join(json.dumps({"text": v}) + "\n" for v in ["ok", "\ufffd", "\ue000"]), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(j))}, line 2: field 'text' is "
                                         rf"{re.escape(INVISIBLE_WHY)} \(--errors skip"):
        list(corpus.open_source(j))
    why = re.escape(INVISIBLE_WHY.split(" (it would")[0])
    for t in DROPPED_ONLY:
        with pytest.raises(ValueError, match=rf"^queries: expected some text, got a query of {why} at index 0$"):
            corpus.search(search_index[1]["npy"], t)
        with pytest.raises(ValueError, match=rf"^input: expected some text, got a text of {why} at index 1$"):
            corpus.embed_file(["fine", t], tmp_path / "e.npy", model=str(tiny_model_dir))
    assert not (tmp_path / "e.npy").exists()


# --------------------------------------------------------------- search: the index's model is gone
def test_search_names_the_index_when_its_recorded_model_is_gone(tmp_path, tiny_model_dir, tiny_encoder):
    """With model left out, a model moved since the index was made was reported as a bad ``model``
    argument, which the caller never gave. The message names the index and the path its manifest
    records, and model= finds the moved model (hits as numpy's brute force)."""
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(tiny_model_dir, copy)
    lines = corpus_lines(20)
    out = tmp_path / "e.npy"
    corpus.embed_file(lines, out, model=str(copy))
    moved = tmp_path / "moved"
    copy.rename(moved)
    with pytest.raises(FileNotFoundError, match=rf"^index: {re.escape(str(out))} was embedded with the model "
                                                rf"{re.escape(repr(str(copy)))} \(the name or path its manifest "
                                                rf"records\), which cannot be found now: .*is neither a model "
                                                rf"directory.*; give model= \(--model\) the model it was embedded "
                                                rf"with, wherever it is now$"):
        corpus.search(out, lines[3])
    hits = corpus.search(out, [lines[3]], k=4, model=str(moved))[0]
    scores, order = brute_force(np.load(out), tiny_encoder.encode([lines[3]], normalize=True)[0])
    assert_same_topk(hits, scores, order, 4)
    assert hits[0].id == 3 and hits[0].text == lines[3]


# ------------------------------------------------------------ .npy writer: chunks in order, once
def test_npy_writer_refuses_chunks_out_of_order_or_twice(tmp_path, tiny_model_dir, tiny_encoder):
    """The .npy writer put the rows at ``start`` but appended the texts in call order: chunks
    written out of order (or one twice) left every row with another row's text, in an output
    marked complete. Any ``start`` but the next row is refused before anything is written; in
    order, the output is encode()'s rows with their own texts, and a resumed job goes on."""
    lines = corpus_lines(7)
    f = write_lines(tmp_path / "in.txt", lines)
    out = tmp_path / "o.npy"
    sidecar = Path(f"{out}.texts.jsonl")
    mid = corpus.model_identity(str(tiny_model_dir))
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, chunk_size=3)
    job.start()
    writer = job.writer()
    pending = list(job.pending())
    assert [start for _, start, _ in pending] == [0, 3, 6]
    emb = {index: tiny_encoder.encode(texts, normalize=True) for index, _, texts in pending}
    (i1, s1, t1), (i0, s0, t0) = pending[1], pending[0]
    with pytest.raises(ValueError, match=r"^start: expected the next row 0, got 3 \(a \.npy output's chunks are "
                                         r"written in order, each once"):
        writer.write(s1, t1, emb[i1])
    assert sidecar.stat().st_size == 0
    np.testing.assert_array_equal(np.load(f"{out}.partial"), np.zeros((7, emb[i0].shape[1]), np.float32))
    job.commit(i0, **writer.write(s0, t0, emb[i0]))
    size = sidecar.stat().st_size
    with pytest.raises(ValueError, match=r"^start: expected the next row 3, got 0 "):
        writer.write(s0, t0, emb[i0])  # the same chunk again
    assert sidecar.stat().st_size == size
    writer.close()
    job.close()
    job = corpus.EmbedJob.prepare(corpus.open_source(f), out, mid, resume=True)
    job.start()
    writer = job.writer()  # a resumed job's writer goes on after the chunks done
    rest = list(job.pending())
    with pytest.raises(ValueError, match=r"^start: expected the next row 3, got 6 "):
        writer.write(rest[1][1], rest[1][2], emb[rest[1][0]])
    for index, start, texts in rest:
        job.commit(index, **writer.write(start, texts, emb[index]))
    writer.close()
    job.finish()
    ids, texts, rows = load_output(out)
    assert texts == lines
    np.testing.assert_array_equal(rows, np.concatenate([emb[0], emb[1], emb[2]]))
    hit = corpus.search(out, lines[0], k=1)[0][0]
    assert (hit.id, hit.text) == (0, lines[0])


def test_parquet_writer_takes_chunks_in_any_order(tmp_path, tiny_model_dir, tiny_encoder):
    """What EmbedJob.writer documents for Parquet: chunks in reverse order still give each id its text."""
    lines = corpus_lines(7)
    out = tmp_path / "o.parquet"
    job = corpus.EmbedJob.prepare(corpus.ListSource(lines), out, corpus.model_identity(str(tiny_model_dir)),
                                  chunk_size=3)
    job.start()
    writer = job.writer()
    for index, start, texts in reversed(list(job.pending())):
        job.commit(index, **writer.write(start, texts, tiny_encoder.encode(texts, normalize=True)))
    job.finish()
    ids, texts, rows = load_output(out)
    assert ids.tolist() == list(range(7)) and texts == lines
    np.testing.assert_array_equal(rows, np.concatenate([tiny_encoder.encode(lines[i:i + 3], normalize=True)
                                                        for i in (0, 3, 6)]))


# ---------------------------------------------------------------- resume of texts given as a list
def test_resume_of_a_list_with_other_texts_speaks_of_the_texts(tmp_path, tiny_model_dir):
    """Resuming the output of a list (the CLI's sentences) with other texts said "its content
    (SHA-256 of the whole file) differs", of a file there is not. It says the texts differ, and
    gives their SHA-256 (over every text and a NUL after each) or their number then and now."""
    def sha(texts):
        h = hashlib.sha256()
        for t in texts:
            h.update(t.encode("utf-8") + b"\0")
        return h.hexdigest()[:12]

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    for suffix in ("npy", "parquet"):
        out = tmp_path / f"o.{suffix}"
        first, other = ["first one", "second"], ["first one", "other"]
        with pytest.raises(KeyboardInterrupt):  # interrupted: an incomplete output to resume
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(corpus.EmbedJob, "commit", interrupt)
                corpus.embed_file(first, out, model=str(tiny_model_dir), chunk_size=1)
        with pytest.raises(ValueError, match=rf"^resume: the texts given differ from the ones {re.escape(str(out))} "
                                             rf"was started from \(SHA-256 of all the texts {sha(first)} then, "
                                             rf"{sha(other)} now\); --overwrite starts over$"):
            corpus.embed_file(other, out, model=str(tiny_model_dir), resume=True)
        with pytest.raises(ValueError, match=rf"^resume: the texts given differ from the ones {re.escape(str(out))} "
                                             rf"was started from \(2 texts then, 3 now\); --overwrite starts over$"):
            corpus.embed_file(first + ["third"], out, model=str(tiny_model_dir), resume=True)
        assert corpus.embed_file(first, out, model=str(tiny_model_dir), resume=True).rows == 2


def test_npy_writer_after_a_failed_texts_write_wants_a_new_writer(tmp_path, tiny_model_dir, tiny_encoder,
                                                                  monkeypatch):
    """A write whose texts failed to reach the disk (ENOSPC at their fsync) may have left some of
    them in the sidecar: retried with the same writer, the chunk's texts were appended a second
    time, every later row then off by them. The writer refuses to go on; a new one cuts the
    sidecar back to the chunks done, and the output is encode()'s rows with their texts."""
    lines = corpus_lines(6)
    out = tmp_path / "o.npy"
    job = corpus.EmbedJob.prepare(corpus.ListSource(lines), out, corpus.model_identity(str(tiny_model_dir)),
                                  chunk_size=3)
    job.start()
    writer = job.writer()
    pending = list(job.pending())
    emb = [tiny_encoder.encode(texts, normalize=True) for _, _, texts in pending]
    fsync = os.fsync

    def full(fd):
        if fd == writer.texts.fileno():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        writer.write(0, pending[0][2], emb[0])
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"^.*o\.npy\.texts\.jsonl: a write of this writer to it failed, so its "
                                         r"next line is not known: make a new writer"):
        writer.write(0, pending[0][2], emb[0])
    writer.close()
    writer = job.writer()
    for (index, start, texts), rows in zip(pending, emb):
        job.commit(index, **writer.write(start, texts, rows))
    writer.close()
    job.finish()
    ids, texts, got = load_output(out)
    assert texts == lines
    np.testing.assert_array_equal(got, np.concatenate(emb))


# ------------------------------------------------ resume of an output made by an earlier version
def _interrupted_after(monkeypatch, chunks: int):
    """EmbedJob.commit interrupted (KeyboardInterrupt) after ``chunks`` commits; undo with monkeypatch.undo()."""
    commit, n = corpus.EmbedJob.commit, [0]

    def interrupt(self, index, **kw):
        if n[0] == chunks:
            raise KeyboardInterrupt
        n[0] += 1
        return commit(self, index, **kw)

    monkeypatch.setattr(corpus.EmbedJob, "commit", interrupt)


@pytest.mark.parametrize("fmt, errors, suffix", [("text", "strict", "npy"), ("jsonl", "skip", "parquet"),
                                                 ("jsonl", "strict", "npy")])
def test_resume_of_an_output_of_the_earlier_blank_rule(tmp_path, tiny_model_dir, tiny_encoder, monkeypatch,
                                                       fmt, errors, suffix):
    """An earlier version's rule for blank texts (categories Cc, Cf and Mn only) embedded lines of
    U+FFFD or private-use characters that this one skips (or refuses, strict): resuming its output
    embedded and committed a chunk under shifted ids, then refused with "changed during the run"
    (strict: a dead end through --errors skip). It is refused before anything is written, with the
    counts then and now; a manifest of the current rule, or of the earlier one whose input has no
    such text, resumes to an uninterrupted run's output."""
    lines = ["alpha one", "beta two", "\ufffd", "gamma three", "delta four", "\ue000", "eps five", "zeta six"]
    kept = [t for t in lines if t not in ("\ufffd", "\ue000")]
    f = tmp_path / f"in.{'txt' if fmt == 'text' else fmt}"

    def write(texts):
        f.write_text("".join((t if fmt == "text" else json.dumps({"text": t})) + "\n" for t in texts),
                     encoding="utf-8")

    def old_output(out):  # as the earlier version left it: interrupted after 2 of its chunks
        with monkeypatch.context() as mp:
            mp.setattr(corpus, "_INVISIBLE_CATEGORIES", frozenset({"Cc", "Cf", "Mn"}))
            mp.setattr(corpus, "_INVISIBLE_CHARS", frozenset())
            _interrupted_after(mp, 2)
            with pytest.raises(KeyboardInterrupt):
                corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=2, errors=errors)
        m = manifest(out)
        m["input"].pop("blank_rule", None)  # an earlier version wrote none
        Path(f"{out}.manifest.json").write_text(json.dumps(m))
        return m

    write(lines)
    out = tmp_path / f"o.{suffix}"
    m = old_output(out)
    assert m["num_rows"] == len(lines) and m["completed"] == [[0, 2]]
    saved = {p: (p.read_bytes() if p.is_file() else sorted(q.name for q in p.iterdir()))
             for p in tmp_path.iterdir() if p.name.startswith("o.")}
    strict = errors == "strict" and fmt != "text"
    why = "refuses" if strict else "skips"
    hint = re.escape(" (with --errors skip / errors='skip', which skips them)") if strict else ""
    with pytest.raises(ValueError, match=rf"^resume: {re.escape(str(out))} was started by an earlier version, "
                                         rf"whose rule for blank texts differs: this one {why} the texts of only "
                                         rf"characters that carry no text .*\(8 texts then, 6 now\), so the rows "
                                         rf"already made would not line up with the texts; --overwrite starts "
                                         rf"over{hint}$"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), errors=errors, resume=True)
    assert {p: (p.read_bytes() if p.is_file() else sorted(q.name for q in p.iterdir()))
            for p in tmp_path.iterdir() if p.name.startswith("o.")} == saved
    assert corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=2, errors="skip", overwrite=True).rows == 6
    ids, texts, emb = load_output(out)
    assert ids.tolist() == list(range(6)) and texts == kept
    np.testing.assert_array_equal(emb, np.concatenate([tiny_encoder.encode(kept[i:i + 2], normalize=True)
                                                       for i in (0, 2, 4)]))

    ref = tmp_path / f"ref.{suffix}"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=2, errors=errors if fmt == "text" else "skip")
    for old in (False, True):  # the current rule; the earlier one on an input without such texts
        if old:
            write(kept)
            corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=2, errors=errors, overwrite=True)
        run_errors = errors if fmt == "text" or old else "skip"
        with monkeypatch.context() as mp:
            _interrupted_after(mp, 1)
            with pytest.raises(KeyboardInterrupt):
                corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=2, errors=run_errors, overwrite=True)
        if old:
            m = manifest(out)
            m["input"].pop("blank_rule", None)
            Path(f"{out}.manifest.json").write_text(json.dumps(m))
        assert corpus.embed_file(f, out, model=str(tiny_model_dir), errors=run_errors, resume=True).rows == 6
        assert manifest(out)["input"]["blank_rule"] == corpus.BLANK_RULE_VERSION
        ids, texts, emb = load_output(out)
        rids, rtexts, remb = load_output(ref)
        assert ids.tolist() == rids.tolist() and texts == rtexts == kept
        np.testing.assert_array_equal(emb, remb)


def test_resume_refuses_an_earlier_versions_npy_written_out_of_order(tmp_path, tiny_model_dir, tiny_encoder):
    """An earlier version's .npy writer appended the texts in the order its chunks came: chunk 1
    then chunk 0, interrupted there, left the first chunks done (passing the check of a prefix)
    with each text on another row's line, and a resume completed it so. The done chunks' texts
    are compared with the texts file's lines before the first chunk not done is handed out; the
    output is left as it was. The same output with its lines in order resumes to an uninterrupted
    run's output."""
    lines = ["apple pie", "banana split", "car engine", "diesel truck", "elm tree", "fig jam"]
    f = write_lines(tmp_path / "in.txt", lines)
    out, ref = tmp_path / "o.npy", tmp_path / "ref.npy"
    corpus.embed_file(f, ref, model=str(tiny_model_dir), chunk_size=2)
    with pytest.MonkeyPatch.context() as mp:
        _interrupted_after(mp, 2)
        with pytest.raises(KeyboardInterrupt):
            corpus.embed_file(f, out, model=str(tiny_model_dir), chunk_size=2)
    assert manifest(out)["completed"] == [[0, 2]]
    sidecar = Path(f"{out}.texts.jsonl")
    in_order = sidecar.read_bytes()  # chunk 2's texts too: written, its commit interrupted
    assert in_order == "".join(json.dumps(t) + "\n" for t in lines).encode()
    sidecar.write_bytes("".join(json.dumps(t) + "\n" for t in lines[2:4] + lines[:2] + lines[4:]).encode())
    swapped, partial, m = sidecar.read_bytes(), Path(f"{out}.partial").read_bytes(), manifest(out)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(sidecar))}, line 1: holds 'car engine', not the text "
                                         rf"of row 0 \('apple pie'\): the texts of the chunks done are not on their "
                                         rf"rows' lines \(written out of order by an earlier version, or the file "
                                         rf"was edited\); --overwrite starts over$"):
        corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True)
    assert sidecar.read_bytes() == swapped and Path(f"{out}.partial").read_bytes() == partial
    assert not out.exists()
    assert {k: v for k, v in manifest(out).items() if k not in ("run", "runs")} == \
        {k: v for k, v in m.items() if k not in ("run", "runs")}
    sidecar.write_bytes(in_order)
    assert corpus.embed_file(f, out, model=str(tiny_model_dir), resume=True).rows == 6
    ids, texts, emb = load_output(out)
    assert texts == lines
    np.testing.assert_array_equal(emb, np.load(ref))
    np.testing.assert_array_equal(emb, np.concatenate([tiny_encoder.encode(lines[i:i + 2], normalize=True)
                                                       for i in (0, 2, 4)]))
    hit = corpus.search(out, lines[0], k=1)[0][0]
    assert (hit.id, hit.text) == (0, lines[0])
