"""`python -m transformer_core embed ...` run through subprocess with sys.executable."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import transformer_core as tc
from conftest import MODEL_NAME, corpus_lines, sentencepiece_tokenizer

PAIR = ["A man is playing a guitar.", "The stock market crashed today."]
FILE_SENTENCES = ["The cat sat on the mat.", "A feline rested on the rug.", "Interest rates rose."]


def _run(*args, input=None, timeout=300):
    """The CLI in a subprocess: the CompletedProcess (stdout, stderr, returncode)."""
    return subprocess.run([sys.executable, "-m", "transformer_core", *args], capture_output=True, text=True,
                          input=input, timeout=timeout)


def run_cli(*args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "transformer_core", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def encoder():
    return tc.SentenceEncoder.from_pretrained(MODEL_NAME)


def _floats(text):
    return [float(m) for m in re.findall(r"-?\d+\.\d+(?:[eE][-+]?\d+)?", text)]


def test_cli_embed_text_output(encoder):
    out = run_cli("embed", *PAIR)
    assert re.search(r"\(\s*2\s*,\s*384\s*\)", out), out
    emb = encoder.encode(PAIR)
    sim = emb @ emb.T
    nums = _floats(out)
    # the printed cosine-similarity matrix: the off-diagonal value and the diagonal ones
    assert any(abs(x - sim[0, 1]) < 5e-3 for x in nums), (sim[0, 1], out)
    assert sum(abs(x - 1.0) < 5e-3 for x in nums) >= 2, out


def test_cli_embed_json(encoder):
    out = run_cli("embed", "--json", *PAIR)
    data = json.loads(out)
    assert list(data["shape"]) == [2, 384]
    sim = np.asarray(data["similarity"], dtype=np.float64)
    emb = encoder.encode(PAIR)
    ref = (emb @ emb.T).astype(np.float64)
    assert sim.shape == (2, 2)
    np.testing.assert_allclose(sim, ref, atol=1e-5)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    np.testing.assert_allclose(sim, sim.T, atol=1e-6)


def test_cli_embed_file(encoder, tmp_path):
    f = tmp_path / "sentences.txt"
    f.write_text("\n".join(FILE_SENTENCES) + "\n", encoding="utf-8")
    data = json.loads(run_cli("embed", "--json", "--file", str(f)))
    assert list(data["shape"]) == [3, 384]
    emb = encoder.encode(FILE_SENTENCES)
    np.testing.assert_allclose(np.asarray(data["similarity"]), emb @ emb.T, atol=1e-5)


def test_cli_bad_usage_fails_cleanly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file",
                           str(tmp_path / "does_not_exist.txt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "does_not_exist.txt" in proc.stderr + proc.stdout


# ------------------------------------------------------------------- corpus commands (embed --out, search)
def run_cli_any(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "transformer_core", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def assert_clean_error(proc, *fragments):
    """Exit code 2, one line on stderr ``transformer_core <command>: ...`` naming the fragments, no traceback."""
    assert proc.returncode == 2, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("transformer_core "), lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_cli_more_than_20_sentences_prints_a_summary(encoder, tmp_path):
    lines = corpus_lines(25)
    f = tmp_path / "c.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run_cli("embed", "--file", str(f), "--no-progress")
    assert "embedded 25 sentences (dim 384)" in out and "--out" in out
    assert len(out.splitlines()) <= 6  # no matrix
    data = json.loads(run_cli("embed", "--file", str(f), "--json", "--no-progress"))
    emb = encoder.encode(lines).astype(np.float64)
    sim = emb @ emb.T
    mean_cos = (sim.sum() - np.trace(sim)) / (25 * 24)
    assert data["count"] == 25 and data["shape"] == [25, 384]
    assert abs(data["mean_cosine"] - mean_cos) < 1e-5
    assert "similarity" not in data and "embeddings" not in data
    f20 = tmp_path / "c20.txt"
    f20.write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    assert np.asarray(json.loads(run_cli("embed", "--file", str(f20), "--json"))["similarity"]).shape == (20, 20)


def test_cli_embed_out_and_search(tmp_path, tiny_model_dir):
    lines = corpus_lines(120)
    f = tmp_path / "c.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for kind in ("npy", "parquet"):
        out = tmp_path / f"e.{kind}"
        proc = run_cli_any("embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--chunk-size", 50)
        assert proc.returncode == 0, proc.stderr
        assert f"{out}: 120 rows x 32 float32 in 3 chunks" in proc.stdout
        assert "120/120" in proc.stderr and "sentences/s" in proc.stderr  # the progress bar
        res = run_cli_any("search", "--index", out, lines[77], "-k", 3, "--json")
        assert res.returncode == 0, res.stderr
        hits = json.loads(res.stdout)[0]["hits"]
        assert hits[0]["id"] == 77 and hits[0]["text"] == lines[77] and abs(hits[0]["score"] - 1) < 1e-5
        text = run_cli_any("search", "--index", out, lines[77], "another query", "-k", 2).stdout
        assert text.count("query: ") == 2 and f"[77] {lines[77]}" in text


def test_cli_bad_inputs_fail_cleanly(tmp_path, tiny_model_dir):
    model = ["--model", str(tiny_model_dir), "--no-progress"]
    good = tmp_path / "good.txt"
    good.write_text("one\ntwo\nthree\n", encoding="utf-8")
    out = tmp_path / "e.npy"

    assert_clean_error(run_cli_any("embed", "--file", tmp_path / "missing.txt", "--out", out, *model),
                       "transformer_core embed:", "missing.txt", "no such file")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert_clean_error(run_cli_any("embed", "--file", empty, "--out", out, *model), "no text to embed", "empty")
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert_clean_error(run_cli_any("embed", "--file", binary, "--out", out, *model), "binary file")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\nnot \xff fine\nlast\n")
    assert_clean_error(run_cli_any("embed", "--file", bad, "--out", out, *model), "line 3", "invalid UTF-8",
                       "--errors skip")
    assert_clean_error(run_cli_any("embed", "--file", good, "--out", tmp_path / "no" / "dir" / "e.npy", *model),
                       "does not exist")
    assert_clean_error(run_cli_any("embed", "--file", good, "--out", tmp_path / "e.csv", *model), ".npy or .parquet")
    # None of the failures above left anything behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "empty.txt", "good.txt", "model.bin"]

    skip = run_cli_any("embed", "--file", bad, "--out", out, "--errors", "skip", "--json", *model)
    assert skip.returncode == 0 and json.loads(skip.stdout)["rows"] == 3, skip.stderr
    assert "skipped 1 records: line 3: invalid UTF-8" in skip.stderr
    assert_clean_error(run_cli_any("embed", "--file", good, "--out", out, *model), "already exists", "--overwrite")
    # --resume with another model: refused, and the output is left as it was.
    before = out.read_bytes()
    assert_clean_error(run_cli_any("embed", "--file", bad, "--out", out, "--errors", "skip", "--resume",
                                   "--no-progress"), "another model", "all-MiniLM-L6-v2")
    assert out.read_bytes() == before and json.loads((tmp_path / "e.npy.manifest.json").read_text())["complete"]
    assert_clean_error(run_cli_any("embed", "--file", good, "--out", tmp_path / "x.npy", "--resume", *model),
                       "nothing to resume")
    assert_clean_error(run_cli_any("embed", "a", "--file", good), "not both")
    assert_clean_error(run_cli_any("embed", "--file", good, "--resume"), "--resume needs --out")
    # options that would do nothing here are refused, not ignored
    assert_clean_error(run_cli_any("embed", "a", "b", "--threads-per-worker", "2"),
                       "--threads-per-worker needs --workers or --scheduler")
    for flag, value in (("--format", "csv"), ("--text-field", "body"), ("--errors", "skip")):
        assert_clean_error(run_cli_any("embed", "a", "b", flag, value), f"{flag} needs --file")
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"text": "a"}\n{"txt": "b"}\n', encoding="utf-8")
    assert_clean_error(run_cli_any("embed", "--file", jl, "--out", tmp_path / "j.npy", *model), "line 2",
                       "no field 'text'", "--text-field")
    assert_clean_error(run_cli_any("search", "--index", tmp_path / "nothing.npy", "q"),
                       "transformer_core search:", "nothing.npy")
    assert run_cli_any("embed", "--chunk-size", "0", "x").returncode == 2  # argparse: usage error


def test_cli_embed_out_that_is_the_input_is_refused(tmp_path, tiny_model_dir):
    """`embed --file data.parquet --out data.parquet --overwrite` used to remove the input before
    reading it: one error line naming --out, and the input (a file, or a link to it) untouched."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data.parquet"
    pq.write_table(pa.table({"text": FILE_SENTENCES}), data)
    original = data.read_bytes()
    (tmp_path / "link.parquet").symlink_to(data)
    model = ["--model", str(tiny_model_dir), "--no-progress"]
    for out in (data, tmp_path / "link.parquet"):
        assert_clean_error(run_cli_any("embed", "--file", data, "--out", out, "--overwrite", *model),
                           "transformer_core embed: out:", f"is the input {data}", "--out")
    assert data.read_bytes() == original and sorted(p.name for p in tmp_path.iterdir()) == ["data.parquet",
                                                                                           "link.parquet"]
    assert pq.read_table(data).column("text").to_pylist() == FILE_SENTENCES


def test_cli_search_refuses_an_incomplete_index(tmp_path, tiny_model_dir):
    f = tmp_path / "c.txt"
    f.write_text("\n".join(corpus_lines(30)) + "\n", encoding="utf-8")
    out = tmp_path / "e.parquet"
    assert run_cli_any("embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--chunk-size", 10,
                       "--no-progress").returncode == 0
    man_path = tmp_path / "e.parquet.manifest.json"
    man = json.loads(man_path.read_text())
    # What an interrupted run leaves: the data under .partial, two of three chunks recorded.
    out.rename(tmp_path / "e.parquet.partial")
    (tmp_path / "e.parquet.partial" / "part-00002.parquet").unlink()
    man.update(complete=False, completed=[[0, 2]])
    man_path.write_text(json.dumps(man))
    assert_clean_error(run_cli_any("search", "--index", out, "q"), "incomplete (2 of 3 chunks", "--allow-incomplete")
    res = run_cli_any("search", "--index", out, "q", "-k", 100, "--allow-incomplete", "--json")
    assert res.returncode == 0 and len(json.loads(res.stdout)[0]["hits"]) == 20


# ------------------------------------------------------------------------------------ chat, generate
def test_cli_chat_one_prompt_streams_the_answer():
    r = _run("chat", "What is the capital of France?", "--max-new-tokens", "32")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert re.search(r"prefill: \d+ tokens, [\d.]+ tokens/s; decode: \d+ tokens, [\d.]+ tokens/s", r.stderr)


def test_cli_chat_reads_turns_from_stdin_and_keeps_the_conversation():
    r = _run("chat", "--max-new-tokens", "24", input="What is the capital of France?\n\nAnd of Italy?\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("prefill:") == 2  # two turns, the blank line skipped
    first, second = (int(n) for n in re.findall(r"prefill: (\d+) tokens", r.stderr))
    assert second < first  # the second turn ran only what the cache lacked
    # a file with CRLF line ends: the same turns (a trailing "\r" was sent to the model)
    crlf = _run("chat", "--max-new-tokens", "24", input="What is the capital of France?\r\n\r\nAnd of Italy?\r\n")
    assert crlf.returncode == 0, crlf.stderr
    assert crlf.stdout == r.stdout
    assert re.findall(r"prefill: (\d+) tokens", crlf.stderr) == [str(first), str(second)]


def test_cli_generate_continues_text():
    r = _run("generate", "Once upon a time", "--max-new-tokens", "12")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon a time") and len(r.stdout) > len("Once upon a time") + 10


def test_cli_chat_errors_are_one_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    for args in (["chat", "hi", "--model", str(bad)], ["chat", "hi", "--temperature", "-1"],
                 ["generate", "", "--max-new-tokens", "4"]):
        r = _run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert r.stderr.startswith(f"transformer_core {args[0]}: ")
    # --system is checked before the model loads: its error, not the missing model's
    r = _run("chat", "hi", "--system", "caf\udce9", "--model", str(tmp_path / "missing.gguf"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("transformer_core chat: system: expected valid Unicode"), r.stderr
    # argparse's own usage errors: the usage, then one error line naming the option
    r = _run("chat", "hi", "--max-new-tokens", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --max-new-tokens: expected an int >= 1, got 0" in r.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------ --quantize int8
def test_cli_embed_quantize_int8_matches_the_int8_encoder():
    data = json.loads(run_cli("embed", "--json", "--quantize", "int8", *PAIR))
    assert data["quantize"] == "int8"
    emb = tc.SentenceEncoder.from_pretrained(MODEL_NAME, quantize="int8").encode(PAIR)
    np.testing.assert_allclose(np.asarray(data["embeddings"]), emb, atol=1e-5)
    np.testing.assert_allclose(np.asarray(data["similarity"]), emb @ emb.T, atol=1e-5)


def test_cli_embed_quantize_help_states_the_measured_minimum():
    """embed --quantize's help said short texts reach a cosine of 0.977 at worst ('I love it.');
    the measured minimum is from_pretrained's docstring's (0.967, "Thanks", checked against the
    model in test_sentence_encoder): the help states that one."""
    doc = " ".join(tc.SentenceEncoder.from_pretrained.__doc__.split())
    measured = re.search(r'one-to-three-word texts, minimum (0\.\d+) \(``"(\w+)"``', doc)
    assert measured, doc
    help_text = " ".join(run_cli("embed", "--help").split())
    assert f"down to {measured[1]} for '{measured[2]}'" in help_text, help_text
    assert "0.977" not in help_text and "I love it" not in help_text


def test_cli_embed_out_quantize_int8_is_recorded_and_kept(tmp_path, tiny_model_dir):
    lines = corpus_lines(60)
    f = tmp_path / "c.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    proc = run_cli_any("embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--quantize", "int8",
                       "--no-progress")
    assert proc.returncode == 0, proc.stderr
    man = json.loads((tmp_path / "e.npy.manifest.json").read_text())
    assert man["model"]["quantize"] == "int8"
    ref = tc.SentenceEncoder.from_pretrained(tiny_model_dir, quantize="int8").encode(lines, normalize=True)
    np.testing.assert_allclose(np.load(out), ref, atol=1e-5)
    # the queries are embedded in int8 too: a text of the corpus finds itself with cosine 1
    hits = json.loads(run_cli_any("search", "--index", out, lines[7], "-k", 1, "--json").stdout)[0]["hits"]
    assert hits[0]["id"] == 7 and abs(hits[0]["score"] - 1) < 1e-5
    # a float32 run does not resume an int8 output, and says that the quantize setting differs
    msg = assert_clean_error(run_cli_any("embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--resume"),
                             f"resume: {out} was embedded with --quantize int8, this run in float32 (no --quantize); "
                             f"--quantize int8 continues it")
    assert "another model" not in msg
    assert_clean_error(run_cli_any("embed", "--file", f, "--out", tmp_path / "d.parquet", "--workers", 1,
                                   "--quantize", "int8"), "--quantize")
    r = _run("embed", "hi", "--quantize", "int4")
    assert r.returncode == 2 and "argument --quantize: invalid choice: 'int4'" in r.stderr


def test_cli_generate_quantize_int8_is_the_int8_model():
    r = _run("generate", "Once upon a time", "--max-new-tokens", "8", "--quantize", "int8")
    assert r.returncode == 0, r.stderr
    model = tc.quantize(tc.LlamaForCausalLM.from_pretrained("SmolLM2-135M-Instruct"), "int8")
    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    ids = np.array([tok.encode("Once upon a time")], np.int64)
    out = model.generate(ids, max_new_tokens=8, eos_token_id=[tok.eos_token_id])
    expected = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert r.stdout.rstrip("\n") == "Once upon a time" + expected


def test_cli_chat_default_model_keeps_the_file_blocks():
    import argparse

    from transformer_core.chat import _load

    model, _ = _load(argparse.Namespace(model=None, quantize=None))
    formats = model.weight_formats()
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "Q4_1"
    assert formats["model.embed_tokens.weight"] == "Q8_0"
    model8, _ = _load(argparse.Namespace(model=None, quantize="int8"))
    assert model8.weight_formats()["model.layers.0.self_attn.q_proj.weight"] == "int8"
    r = _run("chat", "hi", "--quantize", "int4")
    assert r.returncode == 2 and "argument --quantize: invalid choice: 'int4'" in r.stderr


# ------------------------------------------------------------------------------------ review fixes
def _damage_manifest(path, **changes):
    """Rewrites a manifest with fields changed (a value of None deletes the field)."""
    man = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            del man[key]
        else:
            man[key] = value
    path.write_text(json.dumps(man))


def test_cli_damaged_manifest_is_one_error_naming_it(tmp_path, tiny_model_dir):
    f = tmp_path / "c.txt"
    f.write_text("\n".join(corpus_lines(30)) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    embed = ["embed", "--file", f, "--out", out, "--model", tiny_model_dir, "--no-progress"]
    assert run_cli_any(*embed, "--chunk-size", 3).returncode == 0  # 10 chunks
    man_path = tmp_path / "e.npy.manifest.json"
    good = man_path.read_text()
    name = str(man_path)
    # an interrupted run's manifest, hand-edited
    _damage_manifest(man_path, complete=False, completed=None)
    assert_clean_error(run_cli_any(*embed, "--resume"), name, "damaged manifest", "no field 'completed'")
    _damage_manifest(man_path, completed=[[0, 99]])
    assert_clean_error(run_cli_any(*embed, "--resume"), name, "completed:", "within [0, 10]", "got [[0, 99]]")
    man_path.write_text(good)
    _damage_manifest(man_path, complete=None)
    assert_clean_error(run_cli_any("search", "--index", out, "q"), name, "no field 'complete'")
    man_path.write_text(good)
    _damage_manifest(man_path, complete=False, completed="x")
    assert_clean_error(run_cli_any("search", "--index", out, "q", "--allow-incomplete"), name, "completed:",
                       "got 'x'")
    # the refused runs changed nothing
    assert json.loads(man_path.read_text())["completed"] == "x" and np.load(out).shape == (30, 32)


def test_cli_generate_checks_the_context_before_making_the_cache(monkeypatch, capsys):
    from transformer_core.__main__ import main

    def new_cache(self, batch, capacity=0):
        raise AssertionError(f"new_cache({batch}, {capacity}) called before the context was checked")

    monkeypatch.setattr(tc.LlamaForCausalLM, "new_cache", new_cache)
    assert main(["generate", "hi", "--max-new-tokens", "100000"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # the text is not echoed before the error
    assert err == ("transformer_core generate: max_new_tokens: prompt length 1 + 100000 exceeds the context "
                   "(max_position_embeddings = 8192)\n")


def test_cli_bad_options_print_nothing_on_stdout():
    for args, fragment in ((["generate", "hi", "--temperature", "-1"], "temperature: expected a value >= 0"),
                           (["generate", "hi", "--temperature", "1", "--top-p", "2"], "top_p:"),
                           (["chat", "hi", "--temperature", "1", "--top-p", "1.5"], "top_p:"),
                           # greedy (temperature 0) would ignore --top-p: refused, not ignored
                           (["generate", "hi", "--top-p", "0.5"], "top_p: acts only when sampling"),
                           (["chat", "hi", "--top-p", "0.9", "--temperature", "0"], "top_p: acts only when sampling"),
                           # ... and so would --seed
                           (["generate", "hi", "--seed", "3"], "seed: acts only when sampling; give --temperature > 0 "
                                                               "with --seed"),
                           (["chat", "hi", "--seed", "0", "--temperature", "0"], "seed: acts only when sampling"),
                           # a model that is not there is named as the option, as embed names it
                           (["chat", "hi", "--model", "no-such-model"], "model: 'no-such-model'"),
                           (["generate", "hi", "--model", "no-such-model"], "model: 'no-such-model'")):
        r = _run(*args)
        assert r.stdout == "", (args, r.stdout)
        assert_clean_error(r, f"transformer_core {args[0]}: {fragment}")
    # a number out of the flag's range: argparse's usage error, naming the flag (as its other types do)
    r = _run("chat", "hi", "--seed", "-1")
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.endswith("chat: error: argument --seed: expected an int >= 0, "
                                                                     "got -1\n")


def test_cli_empty_prompt_or_query_is_refused(tmp_path):
    assert_clean_error(_run("chat", ""), "transformer_core chat: prompt: expected a message, got an empty string")
    assert_clean_error(_run("chat", "  "), "prompt: expected a message, got only whitespace")
    assert_clean_error(_run("generate", ""), "transformer_core generate: text: expected some text")
    # the queries are checked before the index is opened
    assert_clean_error(run_cli_any("search", "--index", tmp_path / "none.npy", "fine", ""),
                       "transformer_core search: queries: expected some text, got an empty query at index 1")


def test_cli_embed_refuses_an_empty_or_blank_sentence(tmp_path, tiny_model_dir):
    """As every file reader refuses a blank record and `search` a blank query: `embed "" x` is one
    error naming the sentence's index, nothing written (no output with a [CLS] [SEP] row)."""
    model = str(tiny_model_dir)
    r = assert_clean_error(run_cli_any("embed", "--model", model, "", "x", "--out", tmp_path / "e.npy",
                                       "--no-progress"),
                           "transformer_core embed: texts: expected some text, got an empty text at index 0")
    assert r == "transformer_core embed: texts: expected some text, got an empty text at index 0"
    r = run_cli_any("embed", "--model", model, "x", "   ", "--json")
    assert r.stdout == ""
    assert_clean_error(r, "transformer_core embed: texts: expected some text, got an all-whitespace text at index 1")
    assert os.listdir(tmp_path) == []
    data = json.loads(run_cli("embed", "--model", model, "x", "y z", "--json"))
    ref = tc.SentenceEncoder.from_pretrained(model).encode(["x", "y z"], normalize=True)
    np.testing.assert_allclose(np.asarray(data["embeddings"], np.float32), ref, atol=1e-6, rtol=0)


def test_cli_arguments_that_are_not_utf8_are_named():
    # the shell's $'caf\xe9': Python decodes the byte as the lone surrogate U+DCE9
    r = assert_clean_error(_run("embed", "caf\udce9", "b"), "transformer_core embed: texts:",
                           "lone surrogate '\\udce9' at position 3 of the text at index 0")
    assert "TextInputSequence" not in r
    assert_clean_error(_run("chat", "\udcff\udcfe"), "transformer_core chat: prompt:",
                       "lone surrogate '\\udcff' at position 0")
    assert_clean_error(_run("generate", "caf\udce9"), "transformer_core generate: text:", "at position 3")


def test_cli_summary_lists_the_skipped_records(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nnot \xff fine\nlast\n")
    r = run_cli_any("embed", "--file", bad, "--errors", "skip", "--model", tiny_model_dir, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["shape"] == [2, 32], r.stderr
    assert r.stderr.splitlines() == ["skipped 1 records: line 2: invalid UTF-8 (byte 5 of the line: b'\\xff')"]


def test_cli_reader_closing_stdout_early_exits_quietly(tmp_path, tiny_model_dir):
    """`embed ... | head -3`: a reader that closes the pipe before the output is written is not an
    error: no message, exit code 141 (128 + SIGPIPE), no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "transformer_core", "embed", "one", "two", "--model",
                             str(tiny_model_dir), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert err == b""


def test_cli_relative_model_path_is_searchable_from_elsewhere(tmp_path, tiny_model_dir):
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny_model_dir, work / "m")
    (work / "c.txt").write_text("\n".join(corpus_lines(12)) + "\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file", "c.txt", "--out", "e.npy",
                        "--model", "m", "--no-progress"], cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "transformer_core", "search", "hello", "--index", str(work / "e.npy"),
                        "-k", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "query: hello" in r.stdout


# ------------------------------------------------------------------------------------ chat, generate: review fixes
CHAT_CONTEXT = 64


@pytest.fixture(scope="module")
def tiny_chat_dirs(tmp_path_factory):
    """(a tiny random Llama directory with SmolLM2's tokenizer and chat template, the same without
    a chat template, its HF model, our tokenizer); context CHAT_CONTEXT."""
    transformers = pytest.importorskip("transformers")
    import shutil

    import torch

    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=CHAT_CONTEXT,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    chat = tmp_path_factory.mktemp("tiny_chat")
    hf.save_pretrained(chat, safe_serialization=True)
    tok.backend.save(str(chat / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>"}
    (chat / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": tok.chat_template}))
    plain = tmp_path_factory.mktemp("tiny_plain")
    shutil.copytree(chat, plain, dirs_exist_ok=True)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    return chat, plain, hf, tok


def test_cli_generate_keeps_the_space_of_a_sentencepiece_decoder(tmp_path):
    """A Llama-2-style tokenizer (Metaspace; its decoder strips the leading space): the echoed text
    and the continuation printed "HelloHello Hello ..." for HF's decode "Hello Hello Hello ..."."""
    transformers = pytest.importorskip("transformers")
    import torch
    backend = sentencepiece_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=backend.get_vocab_size(), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=None,
                                   tie_word_embeddings=True)
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}')
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
    ids = hf_tok.encode("Hello")
    with torch.no_grad():
        full = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=5, do_sample=False, pad_token_id=0)[0].tolist()
    expected = hf_tok.decode(full, skip_special_tokens=True)
    assert expected.startswith("Hello ") and len(full) > len(ids)
    r = _run("generate", "--model", str(tmp_path), "Hello", "--max-new-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected + "\n"


def test_cli_chat_stdin_with_invalid_utf8_answers_the_lines_before_it(tiny_chat_dirs):
    """One invalid UTF-8 byte anywhere in standard input aborted before any turn, with a message
    naming neither stdin nor the line; now the turns before it are answered, then one line."""
    chat, _, _, _ = tiny_chat_dirs
    r = subprocess.run([sys.executable, "-m", "transformer_core", "chat", "--model", str(chat), "--max-new-tokens",
                        "3"], input=b"hello\nworld\nbad\xff\nnever\n", capture_output=True, timeout=300,
                       env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert err.count("prefill:") == 2 and len(r.stdout.decode().splitlines()) == 2, err
    assert err.splitlines()[-1] == "transformer_core chat: stdin, line 3: invalid UTF-8 (byte 4 of the line: b'\\xff')"
    assert "Traceback" not in err
    # the same turns from valid input: the same replies
    good = subprocess.run([sys.executable, "-m", "transformer_core", "chat", "--model", str(chat),
                           "--max-new-tokens", "3"], input=b"\xef\xbb\xbfhello\nworld\n", capture_output=True,
                          timeout=300)
    assert good.returncode == 0 and good.stdout == r.stdout, good.stderr


@pytest.mark.parametrize("command, fd, message", [
    (["generate", "hi"], 1, "transformer_core generate: stdout: standard output is closed"),
    (["chat", "hi"], 1, "transformer_core chat: stdout: standard output is closed"),
    (["chat"], 0, "transformer_core chat: stdin: standard input is closed"),
])
def test_cli_closed_stdout_or_stdin_is_one_line(tiny_chat_dirs, command, fd, message):
    chat, _, _, _ = tiny_chat_dirs
    r = subprocess.run([sys.executable, "-m", "transformer_core", *command, "--model", str(chat),
                        "--max-new-tokens", "3"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       stdout=subprocess.DEVNULL if fd == 0 else None, preexec_fn=lambda: os.close(fd), text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(message) and len(r.stderr.splitlines()) == 1, r.stderr


def test_cli_generate_default_max_new_tokens_fits_the_context(tiny_chat_dirs):
    """--max-new-tokens not given: up to 256 new tokens, as many as fit the context (the default
    refused a text that fits: "prompt length 4 + 256 exceeds the context"); a value given that does
    not fit is still refused."""
    import torch

    chat, _, hf, tok = tiny_chat_dirs
    text = "Once upon a time"
    ids = tok.encode(text)
    room = CHAT_CONTEXT - len(ids) + 1
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=room, do_sample=False, eos_token_id=tok.eos_token_id,
                          pad_token_id=0)[0, len(ids):].tolist()
    r = _run("generate", "--model", str(chat), text)
    assert r.returncode == 0, r.stderr
    assert r.stdout == text + tok.decode(ref) + "\n"
    assert f"decode: {len(ref) - 1} tokens" in r.stderr
    assert_clean_error(_run("generate", "--model", str(chat), text, "--max-new-tokens", str(room + 1)),
                       f"max_new_tokens: prompt length {len(ids)} + {room + 1} exceeds the context")
    assert _run("generate", "--model", str(chat), text, "--max-new-tokens", str(room)).stdout == r.stdout
    help_text = " ".join(_run("generate", "--help").stdout.split())
    assert "default 256, or as many as fit the model's context after TEXT" in help_text


def test_cli_chat_without_a_chat_template_points_to_generate(tiny_chat_dirs):
    _, plain, _, _ = tiny_chat_dirs
    msg = assert_clean_error(_run("chat", "--model", str(plain), "hi"), "has no chat template")
    assert "the `generate` command" in msg and "continue_text" not in msg


def test_cli_model_errors_of_hostile_files_and_names_are_one_line(tmp_path):
    """``~nosuchuser/m``, a name too long for the file system, a config.json float field holding
    an integer beyond float range, and a GGUF file without a tokenizer: one error line each
    (exit 2) naming the option or file, not a traceback (RuntimeError, OSError, OverflowError) or
    "GGUF tokenizer model None"."""
    import gguf
    from gguf_fakes import random_llama_state, write_llama_gguf

    r = _run("generate", "hi", "--model", "~tc-no-such-user-4f2a9/m", "--max-new-tokens", "1")
    assert_clean_error(r, "model: cannot expand the home directory of '~tc-no-such-user-4f2a9/m'")
    r = _run("generate", "hi", "--model", "x" * 5000, "--max-new-tokens", "1")
    assert_clean_error(r, "model: no model at 'xxx", "the name is too long for the file system")

    folder = tmp_path / "m"
    tc.LlamaForCausalLM(dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                             num_attention_heads=2, max_position_embeddings=8)).save_pretrained(folder)
    tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct").backend.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 10**400}))
    r = _run("generate", "hi", "--model", str(folder), "--max-new-tokens", "1")
    assert_clean_error(r, f"{folder / 'config.json'}: rms_norm_eps: expected a finite float, got int of 1329 bits")

    path = tmp_path / "notok.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), tokenizer=False,
                     metadata={"llama.context_length": (64, gguf.GGUFValueType.UINT32)})
    r = _run("generate", "hi", "--model", str(path), "--max-new-tokens", "1")
    line = assert_clean_error(r, f"{path}: the GGUF file has no tokenizer (tokenizer.ggml.model missing)")
    assert "None" not in line


def test_cli_an_empty_model_is_refused_not_taken_for_the_default():
    """`generate hi --model ""` loaded the default SmolLM2 and ran (exit 0) where `embed --model ""`
    is refused: an empty --model is refused by chat and generate too, before any model loads."""
    for command in (["generate", "hi"], ["chat", "hi"]):
        r = _run(*command, "--model", "", "--max-new-tokens", "1")
        assert r.stdout == "", r.stdout
        assert_clean_error(r, f"transformer_core {command[0]}: model: expected a model name or path, got ''")
    assert_clean_error(_run("embed", "a", "--model", ""), "transformer_core embed: model: expected a model name or "
                                                          "path, got ''")


def test_cli_a_model_that_is_not_one_is_named_as_the_option(tmp_path):
    """A folder that is no model, a file that is not GGUF and a model of another kind were reported
    by the file inside them ("config.json: not found in model directory adir", "bad.txt: not a GGUF
    file", ".../config.json: model_type 'bert' is not supported here"): each error names --model
    ("model: ...") and still says what was found, before any model loads."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in (["generate", "hi", "--max-new-tokens", "1"], ["chat", "hi", "--max-new-tokens", "1"],
                    ["embed", "a"]):
        line = assert_clean_error(run_cli_any(*command, "--model", empty),
                                  f"transformer_core {command[0]}: model: {str(empty)!r} is a directory without "
                                  f"config.json ({empty}), not a model directory (expected ")
        assert line.endswith("modules.json)" if command[0] == "embed" else "config.json and tokenizer.json)"), line
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"model_type": "llama"}')
    assert_clean_error(run_cli_any("generate", "hi", "--model", config_only),
                       f"transformer_core generate: model: {str(config_only)!r} is a directory without tokenizer.json "
                       f"({config_only}), not a model directory")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text('{"model_type": "gpt2"}')
    (gpt2 / "tokenizer.json").write_text("{}")
    assert_clean_error(run_cli_any("chat", "hi", "--model", gpt2),
                       f"transformer_core chat: model: {str(gpt2)!r} is a model of type 'gpt2' ({gpt2 / 'config.json'}),"
                       f" expected a Llama-family causal LM (model_type 'llama')")
    from transformer_core.hub import resolve_model_dir

    bert = resolve_model_dir(MODEL_NAME) / "config.json"
    assert_clean_error(run_cli_any("generate", "hi", "--model", MODEL_NAME),
                       f"transformer_core generate: model: {MODEL_NAME!r} is a model of type 'bert' ({bert}), expected "
                       f"a Llama-family causal LM (model_type 'llama')")
    text = tmp_path / "notes.txt"
    text.write_text("good morning")
    assert_clean_error(run_cli_any("generate", "hi", "--model", text),
                       f"transformer_core generate: model: expected a model directory, a GGUF file or an embedded "
                       f"model name; the file {str(text)!r} is not a GGUF file (it starts with b'good', not b'GGUF')")


def test_cli_chat_a_first_message_longer_than_the_context_is_to_be_shortened(tiny_chat_dirs):
    """A first message over the context was told "the conversation (N tokens) no longer fits the
    model's context ...; start a new session", which cannot help: the message itself is too long."""
    chat, _, _, tok = tiny_chat_dirs
    message = "hello " * CHAT_CONTEXT
    n = len(tok.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                    tokenize=True))
    assert n > CHAT_CONTEXT
    for args, stdin in (([message], None), ([], message + "\n")):
        r = _run("chat", *args, "--model", str(chat), "--max-new-tokens", "1", input=stdin)
        assert r.stdout == "", r.stdout
        assert_clean_error(r, f"transformer_core chat: message: {n} tokens (with the chat template) exceed the "
                              f"model's context ({CHAT_CONTEXT} tokens); shorten it")


class _Terminal(io.StringIO):
    """Standard input typed at a terminal (isatty), as a text stream without ``buffer``."""

    def isatty(self):
        return True


def test_cli_chat_ends_the_prompt_line_at_end_of_input_on_a_terminal(monkeypatch, capsys):
    """Ctrl-D at the interactive "> " prompt left the shell's prompt on that line: a newline ends
    it, on stderr with the prompt; piped input (no terminal) gets no prompt and no newline."""
    from transformer_core.chat import _stdin_turns

    monkeypatch.setattr(sys, "stdin", _Terminal("first\n\nsecond\n"))
    assert list(_stdin_turns()) == ["first", "second"]
    assert capsys.readouterr() == ("", "> > > > \n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\n"))
    assert list(_stdin_turns()) == ["first"]
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("argv0, prog", [
    ("/usr/lib/python3/site-packages/transformer_core/__main__.py", "python -m transformer_core"),
    ("/home/me/.venv/bin/transformer-core", "transformer-core"),
    ("-c", "python -m transformer_core"),  # main() called from Python code
    ("", "python -m transformer_core"),
])
def test_cli_usage_names_the_program_as_it_was_started(monkeypatch, argv0, prog):
    """The usage always said `python -m transformer_core`, also when run as the `transformer-core`
    console script."""
    from transformer_core.__main__ import _parser

    monkeypatch.setattr(sys, "argv", [argv0, "chat"])
    assert _parser().prog == prog
    assert _parser().format_usage().startswith(f"usage: {prog} [-h] COMMAND ...")


def test_cli_console_script_usage_names_transformer_core(tmp_path):
    """Run as the console script pip installs (a file named transformer-core that calls main), the
    usage and the error line name `transformer-core`; run as a module, `python -m transformer_core`."""
    script = tmp_path / "transformer-core"
    script.write_text("import sys\nfrom transformer_core.__main__ import main\nsys.exit(main())\n")
    for command, prog in (([sys.executable, str(script)], "transformer-core"),
                          ([sys.executable, "-m", "transformer_core"], "python -m transformer_core")):
        r = subprocess.run([*command, "chat", "--max-new-tokens", "0"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        lines = r.stderr.splitlines()
        assert lines[0].startswith(f"usage: {prog} chat [-h]"), lines
        assert lines[-1] == f"{prog} chat: error: argument --max-new-tokens: expected an int >= 1, got 0", lines


def test_cli_bounds_workers_and_threads_per_worker(capsys):
    """--workers had no upper bound (10**9 reached Dask's LocalCluster) and --threads-per-worker
    above 1024 failed only inside every worker once the cluster had started: both are usage errors
    now, naming the range, and --help states it."""
    from transformer_core.__main__ import main

    for flag in ("--workers", "--threads-per-worker"):
        for value in ("1025", "1000000000", "0", "x"):
            with pytest.raises(SystemExit) as e:
                main(["embed", "--file", "c.txt", "--out", "e.parquet", flag, value])
            assert e.value.code == 2
            err = capsys.readouterr().err
            shown = repr(value) if value == "x" else value
            assert f"argument {flag}: expected an int in [1, 1024], got {shown}" in err, err
    with pytest.raises(SystemExit):
        main(["embed", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "worker processes (1 to 1024)" in help_text and "C++ threads in each worker, 1 to 1024" in help_text


def test_cli_generate_and_chat_sample_with_top_k_50_as_continue_text(tiny_chat_dirs, capsys):
    """`generate --temperature T` sampled with no top-k filter while `chat`, continue_text and
    Hugging Face's generate keep the 50 most probable tokens: both commands now take --top-k
    (default: the generation config's, else 50; 0 = no filter) and give, for the same seed, exactly
    continue_text's / ChatSession's text. --top-k is refused without sampling (as --top-p) and
    checked as the other options."""
    transformers = pytest.importorskip("transformers")
    from transformer_core.__main__ import main
    from transformer_core.chat import ChatSession, continue_text
    from transformer_core.generation import DECODING_DEFAULTS

    # Hugging Face's default top_k (transformers 5 applies it in generate when the config leaves it unset)
    hf_default = (transformers.GenerationConfig().top_k
                  or transformers.GenerationConfig._get_default_generation_params()["top_k"])
    assert DECODING_DEFAULTS["top_k"] == hf_default == 50
    chat, _, _, tok = tiny_chat_dirs
    model = tc.LlamaForCausalLM.from_pretrained(chat)
    text = "Once upon a time"
    sample = ["--model", str(chat), "--temperature", "1.5", "--seed", "3", "--max-new-tokens", "12"]

    def cli(*args):
        assert main(list(args)) == 0
        return capsys.readouterr().out

    expected = {k: continue_text(model, tok, text, max_new_tokens=12, temperature=1.5, seed=3, top_k=k)[0]
                for k in (50, None, 5)}
    assert len(set(expected.values())) == 3  # the filter changes this model's samples
    assert cli("generate", text, *sample) == text + expected[50] + "\n"
    assert cli("generate", text, *sample, "--top-k", "50") == text + expected[50] + "\n"
    assert cli("generate", text, *sample, "--top-k", "0") == text + expected[None] + "\n"
    assert cli("generate", text, *sample, "--top-k", "5") == text + expected[5] + "\n"
    replies = {k: ChatSession(model, tok, max_new_tokens=12, temperature=1.5, seed=3, top_k=k).send("Hi")
               for k in (50, None)}
    assert replies[50] != replies[None]
    assert cli("chat", "Hi", *sample) == replies[50] + "\n"
    assert cli("chat", "Hi", *sample, "--top-k", "0") == replies[None] + "\n"
    # refused before the model loads: one line, nothing on stdout
    for args, message in (
            (["generate", text, "--top-k", "5"], "generate: top_k: acts only when sampling; give --temperature > 0 "
                                                 "with --top-k (temperature 0, the default, is greedy)"),
            (["chat", "Hi", "--top-k", "0", "--temperature", "0"], "chat: top_k: acts only when sampling")):
        assert main(args + ["--model", str(chat)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"transformer_core {message}") and err.count("\n") == 1, (args, err)
    for command, first in (("generate", text), ("chat", "Hi")):  # a negative one: argparse's, naming the flag
        with pytest.raises(SystemExit) as exit_:
            main([command, first, "--top-k", "-1", "--temperature", "1", "--model", str(chat)])
        out, err = capsys.readouterr()
        assert exit_.value.code == 2 and out == ""
        assert err.endswith(f"{command}: error: argument --top-k: expected an int >= 0, got -1\n"), err
    with pytest.raises(SystemExit) as exit_:
        main(["generate", text, "--top-k", "2.5", "--temperature", "1"])
    assert exit_.value.code == 2 and "argument --top-k: expected an int >= 0, got '2.5'" in capsys.readouterr().err
    for command in ("generate", "chat"):
        help_text = " ".join(_run(command, "--help").stdout.split())
        assert ("--top-k TOP_K sample among the k most probable tokens (with --temperature; default: the model's "
                "generation_config.json top_k, else 50, as Hugging Face's generate; 0 = no top-k filter)") in help_text
        assert ("(with --temperature; default: the model's generation_config.json top_p, else none)") in help_text


def test_cli_embed_prints_a_non_utf8_output_name_on_a_strict_stdout(tmp_path, tiny_model_dir):
    """An output path that is not UTF-8 (bytes 0xff in its name) with stdout strict
    (PYTHONIOENCODING=utf-8:strict): the run succeeded, wrote the manifest complete, and then its
    result line failed to print: exit 2. The name is printed with the byte as \\xff now."""
    model = str(tiny_model_dir)
    d = os.fsencode(tmp_path)
    src, out = d + b"/n\xff.txt", d + b"/o\xff.npy"
    with open(src, "wb") as f:
        f.write(b"The cat sat on the mat.\nInterest rates rose.\n")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    cmd = [sys.executable.encode(), b"-m", b"transformer_core", b"embed", b"--model", os.fsencode(model), b"--file",
           src, b"--out", out, b"--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shown = d.decode("utf-8", "backslashreplace") + "/o\\xff.npy"
    assert re.fullmatch(rf"{re.escape(shown)}: 2 rows x 32 float32 in 1 chunks \(2 embedded now in [0-9.]+ s, "
                        rf"[0-9.]+ sentences/s\)\n", proc.stdout.decode()), proc.stdout
    ref = tc.SentenceEncoder.from_pretrained(model).encode(["The cat sat on the mat.", "Interest rates rose."],
                                                           normalize=True)
    np.testing.assert_array_equal(np.load(os.fsdecode(out)), ref)
    again = subprocess.run(cmd + [b"--resume"], capture_output=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.decode() == f"{shown}: already complete (2 rows, dim 32); nothing to do\n"


@pytest.mark.parametrize("name", [".npy", ".parquet"])
def test_cli_out_named_only_by_its_extension(tmp_path, name):
    f = tmp_path / "c.txt"
    f.write_text("a line\n", encoding="utf-8")
    r = assert_clean_error(run_cli_any("embed", "--file", f, "--out", name, "--no-progress"))
    assert r == (f"transformer_core embed: out: expected a file name before the extension (such as "
                 f"embeddings{name}), got '{name}'")


def test_cli_search_refuses_a_query_of_only_invisible_characters(tmp_path):
    assert_clean_error(run_cli_any("search", "--index", tmp_path / "none.npy", "fine", "\u200b"),
                       "transformer_core search: queries: expected some text, got a query of only characters that "
                       "carry no text (control, zero-width or format characters, combining marks, private-use "
                       "characters, the replacement character U+FFFD) at index 1")


def _closing_stdout():
    os.close(1)


def test_cli_embed_and_search_with_stdout_closed_are_one_line(tmp_path, tiny_model_dir):
    """`embed ... >&-` and `search ... >&-` ended in AttributeError: 'NoneType' object has no
    attribute 'flush' (exit 1), `embed --out` after writing its output; now every command refuses
    before any work, as generate and chat do: one line, exit 2, no output file."""
    f = tmp_path / "c.txt"
    f.write_text("one line\nanother line\n", encoding="utf-8")
    index = tmp_path / "i.npy"
    assert run_cli_any("embed", "--file", f, "--out", index, "--model", tiny_model_dir, "--no-progress").returncode == 0
    before = sorted(os.listdir(tmp_path))
    for args in (["embed", "a", "b", "--json"], ["embed", "--file", f, "--out", tmp_path / "o.npy"],
                 ["search", "--index", index, "one"]):
        command = args[0]
        r = subprocess.run([sys.executable, "-m", "transformer_core", *map(str, args), "--model", str(tiny_model_dir)],
                           stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_closing_stdout, text=True,
                           timeout=300)
        assert r.returncode == 2, r.stderr
        assert r.stderr == (f"transformer_core {command}: stdout: standard output is closed; there is nowhere to "
                            f"write the output\n")
    assert sorted(os.listdir(tmp_path)) == before  # no o.npy, manifest or lock file


def _escaped(text: str, encoding: str, escape) -> str:
    """``text`` with each character ``encoding`` cannot write replaced by ``escape(character)``."""
    def writable(c):
        try:
            c.encode(encoding)
            return True
        except UnicodeEncodeError:
            return False
    return "".join(c if writable(c) else escape(c) for c in text)


def _python_escape(c):
    return c.encode("ascii", "backslashreplace").decode("ascii")


def _json_escape(c):
    """JSON's escape: one \\uXXXX per UTF-16 code unit (a surrogate pair above U+FFFF)."""
    units = c.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_cli_output_is_whole_on_a_stdout_that_is_not_utf8(tmp_path, tiny_model_dir, tiny_chat_dirs, encoding):
    """On an ASCII or Latin-1 stdout (PYTHONIOENCODING, strict) the similarity matrix stopped at its
    first row ("café"), search at its first hit and generate at its first non-ASCII character,
    then an 'ascii' codec error line (exit 2). Now the whole output is written (exit 0, nothing on
    stderr): characters the encoding lacks as Python's backslash escapes in text, as JSON's \\u
    escapes with --json (the JSON reads back as the same text)."""
    texts = ["café au lait", "日本語のテキスト", "naïve 😀 emoji", "plain text"]
    model = ["--model", str(tiny_model_dir)]
    f = tmp_path / "c.txt"
    f.write_text("\n".join(texts) + "\n", encoding="utf-8")
    index = tmp_path / "i.npy"
    assert run_cli_any("embed", "--file", f, "--out", index, *model, "--no-progress").returncode == 0
    chat = tiny_chat_dirs[0]
    commands = {"embed": ["embed", *texts, *model], "embed --json": ["embed", *texts, *model, "--json"],
                "search": ["search", "--index", str(index), "café 日本", "-k", "4"],
                "search --json": ["search", "--index", str(index), "café 日本", "-k", "4", "--json"],
                "generate": ["generate", "Write the word café, 日本", "--model", str(chat), "--max-new-tokens", "8"]}
    for name, args in commands.items():
        want = subprocess.run([sys.executable, "-m", "transformer_core", *args], capture_output=True, timeout=300,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        assert want.returncode == 0, want.stderr
        want = want.stdout.decode("utf-8")
        # a character neither encoding has (embed --json writes ASCII JSON itself)
        assert any(ord(c) > 0xff for c in want) != (name == "embed --json"), (name, want)
        got = subprocess.run([sys.executable, "-m", "transformer_core", *args], capture_output=True, timeout=300,
                             env={**os.environ, "PYTHONIOENCODING": f"{encoding}:strict"})
        err = got.stderr.decode()
        assert got.returncode == 0 and "codec" not in err and "Traceback" not in err, (name, err)
        if name != "generate":
            assert err == "", (name, err)
        got = got.stdout.decode(encoding)
        if name.endswith("--json"):
            assert json.loads(got) == json.loads(want), name
            assert got == _escaped(want, encoding, _json_escape), name
        else:
            assert got == _escaped(want, encoding, _python_escape), name
            assert "\\u65e5" in got, (name, got)  # 日
            assert ("caf\\xe9" in got) == (encoding == "ascii") and ("café" in got) == (encoding == "latin-1"), got
    for command in ("embed", "search", "generate", "chat"):  # the --help says so (and is ASCII itself)
        shown = subprocess.run([sys.executable, "-m", "transformer_core", command, "--help"], capture_output=True,
                               text=True, timeout=300, env={**os.environ, "PYTHONIOENCODING": f"{encoding}:strict"})
        assert shown.returncode == 0, shown.stderr
        note = ("is written as a backslash escape (\\xe9, \\u65e5); with --json as a JSON escape (\\u00e9), so "
                "that the JSON reads back as the same text") if command in ("embed", "search") else \
            "is written as a backslash escape (\\xe9, \\u65e5)."  # chat and generate have no --json
        assert note in " ".join(shown.stdout.split()), shown.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_cli_error_of_writing_stdout_names_it(tiny_model_dir):
    """`embed a b >/dev/full` said "[Errno 28] No space left on device" without saying what it was
    writing; now the message names standard output (exit 2, one line, no traceback)."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "a", "b", "--model",
                            str(tiny_model_dir)], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "transformer_core embed: stdout: cannot write standard output: No space left on device\n"


def test_cli_error_of_a_file_of_the_output_names_out(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`embed --out ro/o.npy` in a read-only directory said "ro/.o.npy.lock: Read-only file system",
    naming a hidden file the user never gave. Now the message names --out and its path first (the
    hidden file after them). In-process, the lock file's creation made to fail as a read-only file system does
    (the tests may run as root, whom permissions do not stop); then on Linux's /proc for real."""
    import errno

    from transformer_core.__main__ import main

    f = tmp_path / "c.txt"
    f.write_text("one line\n", encoding="utf-8")
    out = tmp_path / "ro" / "o.npy"
    out.parent.mkdir()
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if os.fspath(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert main(["embed", "--file", str(f), "--out", str(out), "--model", str(tiny_model_dir), "--no-progress"]) == 2
    monkeypatch.undo()
    captured = capsys.readouterr()
    assert captured.out == "" and os.listdir(out.parent) == []
    assert captured.err == (f"transformer_core embed: out: {out}: Read-only file system "
                            f"(at its run's file {out.parent / '.o.npy.lock'})\n")
    if os.path.isdir("/proc/self"):
        r = assert_clean_error(run_cli_any("embed", "--file", f, "--out", "/proc/self/o.npy", "--model",
                                           tiny_model_dir, "--no-progress"))
        assert r.startswith("transformer_core embed: out: /proc/self/o.npy: "), r


_INTERRUPT_AT_IMPORT = """
import os, signal, sys
class Interrupt:  # a Ctrl-C arriving while the package imports its tokenizer module
    def find_spec(self, name, path=None, target=None):
        if name == "transformer_core.tokenizer":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Interrupt())
sys.orig_argv = {orig_argv!r}
import transformer_core
"""


@pytest.mark.parametrize("orig_argv", [[sys.executable, "-m", "transformer_core", "embed", "x"],
                                       [sys.executable, "-mtransformer_core", "embed", "x"],
                                       [sys.executable, "-um", "transformer_core", "embed"],
                                       [sys.executable, "-B", "-W", "ignore", "-m", "transformer_core"],
                                       [sys.executable, "-mtransformer_core.__main__", "embed"]])
def test_ctrl_c_while_the_cli_imports_the_package_is_one_line(orig_argv):
    """A Ctrl-C in the first fraction of a second (the package's imports, before main can catch it)
    printed a traceback of the imports; the CLI's one line and exit code 2 now, from the SIGINT
    handler the package installs for a CLI run (a KeyboardInterrupt there could also come out of a
    compiled module's initialisation as an ImportError)."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_IMPORT.format(orig_argv=orig_argv)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "transformer_core: interrupted while starting; nothing was done\n"


@pytest.mark.parametrize("orig_argv", [[sys.executable, "prog.py"],
                                       [sys.executable, "prog.py", "-m", "transformer_core"],  # the program's own
                                       [sys.executable, "-c", "import transformer_core", "-m", "transformer_core"]])
def test_ctrl_c_while_a_program_imports_the_package_stays_its_own(orig_argv):
    """Only the CLI turns the interrupt into its one line: a user's program gets KeyboardInterrupt,
    even when its own arguments read "-m transformer_core"."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_IMPORT.format(orig_argv=orig_argv)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 2 and "KeyboardInterrupt" in proc.stderr


def test_ctrl_c_at_the_packages_first_import_is_one_line(tmp_path):
    """The CLI's SIGINT handler is in place before the package's first import (numpy, whose
    compiled modules, interrupted while they initialise, reported "ImportError: initialization
    failed" with a traceback and exit 1: a KeyboardInterrupt raised inside them): the one line."""
    script = tmp_path / "s.py"
    script.write_text("""
import os, signal, sys
sys.orig_argv = [sys.executable, "-m", "transformer_core", "embed", "x"]
sys.argv = ["transformer_core"]
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":  # the package's first import: its handler is installed before it
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Interrupt())
import transformer_core
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (2, "transformer_core: interrupted while starting; nothing was done\n")
    # standard error closed: the line is lost, the exit code is still 2 (the failed write raised: exit 1)
    proc = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          preexec_fn=lambda: os.close(2), timeout=120)
    assert proc.returncode == 2


def test_a_ctrl_c_after_the_cli_returned_changes_nothing(tmp_path):
    """A Ctrl-C while Python exits after a command that succeeded ended the process by SIGINT (a
    shell's 130); once main has returned in a CLI run, SIGINT is ignored. A program that calls
    main itself keeps its own handling (no CLI run: its handler is untouched)."""
    script = tmp_path / "s.py"
    script.write_text("""
import os, signal, sys
sys.orig_argv = [sys.executable, "-m", "transformer_core", "embed", "--help"] if sys.argv[1] == "cli" else sys.orig_argv
import transformer_core
from transformer_core.__main__ import main
try:
    main(["embed", "--help"])
except SystemExit as e:
    code = e.code
os.kill(os.getpid(), signal.SIGINT)
print("still running", code)
""")
    cli = subprocess.run([sys.executable, str(script), "cli"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and cli.stdout.endswith("still running 0\n"), cli.stderr
    program = subprocess.run([sys.executable, str(script), "program"], capture_output=True, text=True, timeout=120)
    assert program.returncode != 0 and "KeyboardInterrupt" in program.stderr


def test_processes_multiprocessing_starts_for_the_cli_keep_pythons_interrupt(tmp_path):
    """A process that multiprocessing's "spawn" starts from the transformer-core script (a Dask
    worker of embed --workers) gets the script's sys.argv: it installed the CLI's starting handler,
    which no main ever took back, so a later Ctrl-C ended its work at once. Python's own handler
    there (a KeyboardInterrupt its own code can clean up after); the script itself has the CLI's."""
    script = tmp_path / "transformer-core"
    script.write_text(f"""#!{sys.executable}
import multiprocessing, signal
def report(queue):
    import transformer_core
    queue.put(getattr(signal.getsignal(signal.SIGINT), "__name__", "?"))
if __name__ == "__main__":
    import transformer_core
    print(signal.getsignal(signal.SIGINT).__name__)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=report, args=(queue,))
    child.start()
    print(queue.get(timeout=120))
    child.join()
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.stdout.split() == ["_interrupted_while_starting", "default_int_handler"], proc.stderr


def test_an_interrupt_from_exec_d_code_still_exits_2_under_python_m(tmp_path, tiny_model_dir):
    """A KeyboardInterrupt that leaves code run by exec of a string (namedtuple's, a Jinja2
    template's) is marked unhandled by CPython even once main caught it; under python -m the process
    then died by SIGINT after printing its line (exit -2, a shell's 130) instead of exiting 2."""
    (tmp_path / "sitecustomize.py").write_text(
        "import transformer_core.corpus as corpus\n"
        "def run_embed(args):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "corpus.run_embed = run_embed\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "x", "--model", str(tiny_model_dir)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert (proc.returncode, proc.stderr) == (2, "transformer_core embed: interrupted\n")


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_standard_error_closed_or_full_loses_the_messages_not_the_run(tmp_path, tiny_model_dir, stderr):
    """2>&- or 2>/dev/full: the progress bar's write failed and ended the run (exit 1, a .partial
    left), and with stderr closed the messages went into standard output's data. Now the run
    completes, stdout holds only its own line, and an error still exits 2 with nothing on stdout."""
    f = tmp_path / "c.txt"
    f.write_text("hello world\nsecond line\nthird\n")
    out = tmp_path / "o.npy"

    def run(*args):
        """The CLI with ``args``, its standard error closed or /dev/full; stdout captured."""
        err = subprocess.DEVNULL if stderr == "closed" else open("/dev/full", "w")
        try:
            return subprocess.run([sys.executable, "-m", "transformer_core", *map(str, args)], capture_output=False,
                                  stdout=subprocess.PIPE, stderr=err, text=True, timeout=300,
                                  preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None)
        finally:
            if err is not subprocess.DEVNULL:
                err.close()

    if stderr == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    proc = run("embed", "--file", f, "--out", out, "--model", tiny_model_dir)
    assert proc.returncode == 0 and proc.stdout.startswith(f"{out}: 3 rows x ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "o.npy", "o.npy.manifest.json",
                                                          "o.npy.texts.jsonl"]
    proc = run("embed", "--file", tmp_path / "missing.txt", "--model", tiny_model_dir)
    assert (proc.returncode, proc.stdout) == (2, "")


# ------------------------------------------------------------------------------------ chat: named templates, empty stdin, help
RAG_TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_cli_chat_named_templates_are_chosen_with_chat_template(tiny_chat_dirs, tmp_path):
    """A model whose tokenizer has named chat templates but no 'default' failed after the model
    loaded, telling the user to pass chat_template, which `chat` did not take. Now it is refused
    before the model loads (a directory without weights gives the same error), naming
    --chat-template and the names; --chat-template NAME renders with that template, the reply
    Hugging Face's greedy one for its prompt."""
    import shutil

    import torch

    chat, _, hf, tok = tiny_chat_dirs
    named = tmp_path / "named"
    shutil.copytree(chat, named)
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "rag", "template": RAG_TEMPLATE},
                               {"name": "tool_use", "template": tok.chat_template}]
    (named / "tokenizer_config.json").write_text(json.dumps(config))
    no_weights = tmp_path / "no_weights"
    shutil.copytree(named, no_weights)
    for f in no_weights.glob("*.safetensors"):
        f.unlink()
    assert_clean_error(_run("chat", "hi", "--model", str(no_weights)),
                       f"transformer_core chat: model: {no_weights}: this model's tokenizer has named chat templates "
                       f"but no 'default'; choose one with --chat-template NAME (names: rag, tool_use)")
    assert_clean_error(_run("chat", "hi", "--model", str(no_weights), "--chat-template", "rgb"),
                       "transformer_core chat: chat_template: expected one of this model's named chat templates "
                       "(rag, tool_use), got 'rgb'")
    assert_clean_error(_run("chat", "hi", "--model", str(chat), "--chat-template", "rag"),
                       "transformer_core chat: chat_template: this model's tokenizer has a single chat template")
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
                                  chat_template=RAG_TEMPLATE)
    assert tok.decode(ids) == "[user] hi\n[assistant] "
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=4, do_sample=False, eos_token_id=tok.eos_token_id,
                          pad_token_id=0)[0, len(ids):].tolist()
    r = _run("chat", "hi", "--model", str(named), "--chat-template", "rag", "--max-new-tokens", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout == tok.decode(ref, skip_special_tokens=True) + "\n"
    assert f"prefill: {len(ids)} tokens" in r.stderr


@pytest.mark.parametrize("stdin", ["", "  \n\n\r\n\t\n"])
def test_cli_chat_stdin_without_a_turn_is_refused_as_an_empty_prompt(tiny_chat_dirs, stdin):
    """`echo "$MSG" | chat` with an empty $MSG loaded the model, printed nothing and exited 0,
    where an empty PROMPT is an error."""
    chat, _, _, _ = tiny_chat_dirs
    r = _run("chat", "--model", str(chat), "--max-new-tokens", "2", input=stdin)
    assert r.stdout == ""
    assert_clean_error(r, "transformer_core chat: stdin: no message to answer (standard input is empty or has only "
                          "blank lines); give the message as PROMPT or pipe the turns in, one a line")


def test_cli_help_mentions_json_only_for_the_commands_that_have_it():
    """chat and generate, which have no --json, described --json output in their --help."""
    for command, has_json in (("chat", False), ("generate", False), ("embed", True), ("search", True)):
        r = _run(command, "--help")
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.split())
        assert ("--json" in text) == has_json, (command, text)
        assert "is written as a backslash escape (\\xe9, \\u65e5)" in text
        assert ("with --json as a JSON escape (\\u00e9), so that the JSON reads back as the same text" in text) == has_json


# ------------------------------------------------------------------------------------ chat, generate: the generation config
def test_cli_chat_and_generate_use_the_generation_configs_options(tiny_chat_dirs, tmp_path, capsys):
    """`chat` and `generate` dropped generation_config.json's repetition_penalty (and sampled with
    top_k 50 and no top-p whatever it said): the reply differed from Hugging Face's generate, with
    nothing on stderr. Now the options not given are the file's, as ChatSession's and HF's."""
    import shutil

    import torch
    from transformer_core.__main__ import main
    from transformer_core.chat import ChatSession, continue_text

    chat, _, hf, tok = tiny_chat_dirs
    folder = tmp_path / "penalized"
    shutil.copytree(chat, folder)
    (folder / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.5, "top_k": 4,
                                                               "top_p": 0.7}))
    message, text = "underweight memories supervision classmates avian", "Once upon a time underweight memories"

    def cli(*args):
        assert main(list(args)) == 0
        return capsys.readouterr().out

    prompt = tok.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                     tokenize=True)
    ids = tok.encode(text)
    for p, command, arg in ((prompt, "chat", message), (ids, "generate", text)):
        with torch.no_grad():
            x = torch.tensor([p])
            ref, plain = (hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                                      eos_token_id=tok.eos_token_id, pad_token_id=0,
                                      repetition_penalty=penalty)[0, len(p):].tolist() for penalty in (1.5, 1.0))
        assert ref != plain  # the penalty changes this model's tokens
        out = cli(command, arg, "--model", str(folder), "--max-new-tokens", "8")
        if command == "chat":
            assert out == tok.decode(ref, skip_special_tokens=True) + "\n"
        else:
            assert out == text + tok.decode(ids + ref, skip_special_tokens=True)[len(tok.decode(ids)):] + "\n"
    model = tc.LlamaForCausalLM.from_pretrained(folder)
    sample = ["--model", str(folder), "--temperature", "1.5", "--seed", "3", "--max-new-tokens", "10"]
    reply = ChatSession(model, tok, max_new_tokens=10, temperature=1.5, seed=3).send(message)
    assert reply != ChatSession(model, tok, max_new_tokens=10, temperature=1.5, seed=3, top_k=50, top_p=None,
                                repetition_penalty=None).send(message)
    assert cli("chat", message, *sample) == reply + "\n"
    assert cli("chat", message, *sample, "--top-k", "0") == \
        ChatSession(model, tok, max_new_tokens=10, temperature=1.5, seed=3, top_k=0).send(message) + "\n"
    continued = continue_text(model, tok, text, max_new_tokens=10, temperature=1.5, seed=3)[0]
    assert cli("generate", text, *sample) == text + continued + "\n"


def test_cli_a_bad_generation_config_value_prints_nothing_on_stdout(tiny_chat_dirs, tmp_path, capsys):
    """`generate` echoed TEXT to stdout and only then checked generation_config.json's values: a
    repetition_penalty of 0 left "Once upon" on stdout before the error. Now the file is checked
    before anything is printed, as every other bad option (and as `chat`)."""
    import shutil

    from transformer_core.__main__ import main

    chat, _, _, _ = tiny_chat_dirs
    folder = tmp_path / "bad_penalty"
    shutil.copytree(chat, folder)
    (folder / "generation_config.json").write_text(json.dumps({"repetition_penalty": 0}))
    for args in (["generate", "Once upon"], ["generate", "Once upon", "--max-new-tokens", "3"],
                 ["generate", "Once upon", "--temperature", "1", "--seed", "0"], ["chat", "Hi"]):
        assert main([*args, "--model", str(folder)]) == 2, args
        out, err = capsys.readouterr()
        assert out == "", (args, out)
        lines = err.splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"transformer_core {args[0]}: generation_config.json: repetition_penalty: "), \
            lines[0]


@pytest.mark.parametrize("module, hint", [
    ("pyarrow", "(an optional dependency: pip install 'transformer_core[parquet]')"),
    ("pyarrow.parquet", "(an optional dependency: pip install 'transformer_core[parquet]')"),
    ("dask", "(an optional dependency: pip install 'transformer_core[distributed]')"),
    ("distributed.comm", "(an optional dependency: pip install 'transformer_core[distributed]')"),
    ("jinja2", "(a dependency of transformer_core is missing: reinstall it)"),
    ("tokenizers", "(a dependency of transformer_core is missing: reinstall it)"),
])
def test_cli_a_missing_module_is_hinted_by_the_extra_that_provides_it(module, hint):
    """Every missing module was "an optional dependency: pip install 'transformer_core[distributed]'
    or '[parquet]'", jinja2 and tokenizers (core dependencies, in no extra) too."""
    from transformer_core.__main__ import _message

    error = ModuleNotFoundError(f"No module named {module!r}", name=module)
    assert _message(error) == f"No module named {module!r} {hint}"


def test_cli_chat_without_jinja2_says_to_reinstall():
    """The reproducer: jinja2 missing (None in sys.modules), `chat` is one line that does not point
    to an extra."""
    code = ("import sys; sys.modules['jinja2'] = None\n"
            "from transformer_core.__main__ import main\n"
            "sys.exit(main(['chat', 'hi', '--max-new-tokens', '2']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == ("transformer_core chat: import of jinja2 halted; None in sys.modules (a dependency of "
                        "transformer_core is missing: reinstall it)\n")
