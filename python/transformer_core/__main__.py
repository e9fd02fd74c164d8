"""Command line: ``python -m transformer_core <command> ...`` (also installed as ``transformer-core``).

Commands:
    embed    sentence embeddings. A few sentences (arguments, or ``--file`` with <= 20 texts): their
             cosine-similarity matrix. ``--file F --out OUT.npy|OUT.parquet``: the whole corpus,
             written in chunks with a progress bar, resumable (``--resume``), on a Dask cluster
             with ``--scheduler ADDRESS`` or ``--workers N``. Without ``--out``, a longer input is
             only summarised.
    search   the k nearest texts of an ``embed --out`` output to a query, with cosine scores.
    chat     a conversation with a chat model (default SmolLM2-135M-Instruct): one PROMPT, or turns
             read from standard input (one per line), the reply streamed, then tokens/s.
    generate continues raw text (no chat template), streamed, then tokens/s.

This module holds the parser, the dispatch and the one error handler; each command's work lives
in its module (embed and search: ``corpus.py``). To add a command: write ``_add_<name>(subparsers)``
declaring its arguments with ``set_defaults(run="<module>:<function>")`` (the module is imported
only when the command runs; the function takes the parsed arguments and returns the exit code),
and list it in ``COMMANDS``.

Errors: a command raises; :func:`main` turns an expected error (ValueError, TypeError, OSError
and its FileNotFoundError, ImportError of an optional dependency, KeyboardInterrupt and SIGTERM)
into one line on stderr, ``transformer_core <command>: <message>``, and exit code 2, never a
traceback. Usage errors are argparse's (exit code 2 too). A reader that closes standard output
early (``embed --file F | head -3``) is not an error: the command stops quietly with exit code 141
(128 + SIGPIPE, what a shell reports for a command killed by SIGPIPE), its remaining output
discarded, as Python's documentation of SIGPIPE recommends. Standard output closed before the
command starts (``>&-``) is refused before any work (``stdout: standard output is closed``); an
error of writing it (``>/dev/full``) is named as standard output's (``stdout: cannot write
standard output: No space left on device``); an error of a hidden file of ``--out``'s run (its
lock file, a temporary) names ``out:`` and the output's path first. Standard error closed
(``2>&-``) or failing (``2>/dev/full``) loses the progress bar and the messages, not the run: the
exit code still tells an error, and nothing meant for stderr is written into standard output. A
Ctrl-C while the command is still starting (importing the package) gives the one line
``transformer_core: interrupted while starting; nothing was done`` and exit code 2 as well; one
after the command has finished (while Python exits) is ignored: the exit code is the command's.

Standard output's encoding: every command writes its whole output whatever the encoding
(``PYTHONIOENCODING=ascii``, a Latin-1 terminal). A character the encoding cannot write is written
as an escape, never a UnicodeEncodeError halfway through: as Python's ``backslashreplace`` in
text (``caf\\xe9`` for ``café``: sentences, search hits, chat replies and generated text), as
JSON's ``\\u`` escape with ``--json`` (``caf\\u00e9``), so that the JSON stays valid and reads back
as the same text. The numbers (scores, similarities, embeddings) are ASCII anyway.
"""

from __future__ import annotations

# A Ctrl-C before main runs (these imports, the package's own in its __init__) ends the run with
# the one line and exit code 2 there: the package's _interrupted_while_starting.
import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import threading

from . import _cli_finished, _cli_started
from .hub import DEFAULT_MODEL

#: Exit code when standard output's reader went away (128 + SIGPIPE, as a shell reports it).
EXIT_BROKEN_PIPE = 141

#: Errors that are the user's input or environment, reported in one line (anything else is a bug
#: and keeps its traceback).
EXPECTED_ERRORS = (ValueError, TypeError, OSError, ImportError, KeyboardInterrupt)

#: The end of every command's --help: what is written for a character stdout's encoding lacks
#: (chat and generate, which have no --json: this one).
#: ASCII only: --help is printed before a command's output is made safe for the encoding.
ENCODING_NOTE_TEXT = ("Output: a character that standard output's encoding cannot write (PYTHONIOENCODING=ascii, "
                      "a Latin-1 terminal) is written as a backslash escape (\\xe9, \\u65e5).")
#: The same for the commands that have --json (and the program's own --help).
ENCODING_NOTE = (ENCODING_NOTE_TEXT[:-1] + "; with --json as a JSON escape (\\u00e9), so that the JSON reads back as "
                 "the same text.")


def _count(maximum: int = 2**63 - 1, minimum: int = 1):
    """An argparse ``type``: an int in ``[minimum, maximum]`` (by default >= 1 and within int64, the
    library's bound: a larger one was refused later under its Python name, not the flag's; the
    message names the range)."""
    upper = "2**63 - 1" if maximum == 2**63 - 1 else str(maximum)
    expected = f"an int >= {minimum}" if maximum == 2**63 - 1 else f"an int in [{minimum}, {upper}]"

    def parse(text: str) -> int:
        """``text`` as such an int; argparse.ArgumentTypeError (expected vs got) otherwise."""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected an int in [{minimum}, {upper}], got {value}")
        return value

    return parse


_positive_int = _count()


def _add_embed(sub) -> None:
    e = sub.add_parser("embed", help="sentence embeddings: a similarity matrix, or a corpus into .npy/.parquet",
                       description="Embeds sentences with a sentence encoder (default all-MiniLM-L6-v2). Up to 20 "
                                   "sentences: their cosine-similarity matrix. --out: every text of --file into a "
                                   ".npy or .parquet output, in chunks, resumable.",
                       epilog=ENCODING_NOTE)
    e.set_defaults(run="corpus:run_embed")
    e.add_argument("sentences", nargs="*", help="sentences to embed (or --file)")
    src = e.add_argument_group("input")
    src.add_argument("--file", help="the corpus: text (one per line, blank lines skipped), .jsonl, .csv or .parquet; "
                     "a text's id is its 0-based position among the texts kept (blank lines and records "
                     "skipped under --errors skip do not count), not its line number")
    src.add_argument("--format", choices=("text", "jsonl", "csv", "parquet"),
                     help="the input's format (default: from the extension; anything unknown is text)")
    src.add_argument("--text-field", help="the JSON field or column that holds the text (default 'text')")
    src.add_argument("--errors", choices=("strict", "skip"), default="strict",
                     help="a record that cannot be read (invalid UTF-8, bad JSON, missing field): stop with its "
                          "line number (strict, default) or skip it")
    out = e.add_argument_group("output")
    out.add_argument("--out", help="write the embeddings to OUT.npy (float32, texts in OUT.npy.texts.jsonl) or "
                                   "OUT.parquet (a directory: id, text, embedding), with OUT.npy.manifest.json / OUT.parquet.manifest.json beside")
    again = out.add_mutually_exclusive_group()  # argparse names both flags when both are given
    again.add_argument("--resume", action="store_true",
                       help="continue an interrupted --out run (same input and model; its chunk and batch sizes are "
                            "kept)")
    again.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    out.add_argument("--chunk-size", type=_positive_int, default=None,
                     help="texts per chunk, the unit of saving, resuming and memory (default 1000)")
    e.add_argument("--model", default=DEFAULT_MODEL, help="model directory or embedded name")
    # default None: --resume takes the batch size its run recorded (another would change the rows' last bits)
    e.add_argument("--batch-size", type=_positive_int, default=None,
                   help="texts per forward pass (default 32; with --resume, the interrupted run's)")
    e.add_argument("--quantize", choices=("int8",), default=None,
                   help="int8: the encoder's linear layers int8 per output channel (faster; cosine to float32, measured on "
                        "all-MiniLM-L6-v2: >= 0.994 for the benchmark's sentences; short texts lose more, down to 0.967 for "
                        "'Thanks' among 79 everyday texts of one to three words)")
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    e.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    dist = e.add_argument_group("distributed (needs transformer_core[distributed]; --out must be .parquet)")
    dist.add_argument("--scheduler", metavar="ADDRESS", help="run the chunks on this Dask scheduler's workers")
    # the bounds of distributed.MAX_WORKERS and the core's most threads (not imported here: the
    # distributed module needs dask, and --help must work without it)
    dist.add_argument("--workers", type=_count(1024),
                      help="start a local Dask cluster of N worker processes (1 to 1024)")
    dist.add_argument("--threads-per-worker", type=_count(1024),
                      help="C++ threads in each worker, 1 to 1024 (default: the host's cores / its workers)")


def _add_search(sub) -> None:
    s = sub.add_parser("search", help="the k nearest texts of an embed --out output",
                       description="Exact top-k search by cosine similarity over the output of `embed --out`. "
                                   "A hit's [id] is the 0-based position of its text among the texts embed kept "
                                   "(blank lines and records skipped under --errors skip do not count), not its "
                                   "line number.",
                       epilog=ENCODING_NOTE)
    s.set_defaults(run="corpus:run_search")
    s.add_argument("queries", nargs="+", metavar="QUERY", help="the query text(s)")
    s.add_argument("--index", required=True, help="the --out of an embed run (OUT.npy or OUT.parquet)")
    s.add_argument("-k", type=_positive_int, default=5, help="results per query (default 5)")
    s.add_argument("--model", default=None, help="model for the queries (default: the index's)")
    s.add_argument("--allow-incomplete", action="store_true", help="search the chunks done of an interrupted run")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")


def _add_generation_options(p, max_new_tokens_help: str) -> None:
    p.add_argument("--model", default=None,
                   help="a GGUF file, a Hugging Face Llama directory or an embedded name (default SmolLM2-135M-Instruct)")
    # default None: the command knows whether the value was given (generate refuses a given value
    # that does not fit the context, and caps its default at the context)
    p.add_argument("--max-new-tokens", type=_positive_int, default=None, help=max_new_tokens_help)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=_count(minimum=0), default=None,
                   help="sample among the k most probable tokens (with --temperature; default: the model's "
                        "generation_config.json top_k, else 50, as Hugging Face's generate; 0 = no top-k filter)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling: keep the smallest set of tokens whose probability reaches this (with "
                        "--temperature; default: the model's generation_config.json top_p, else none)")
    p.add_argument("--seed", type=_count(minimum=0), default=None, help="seed of the sampling (reproducible replies)")
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="int8: every linear layer int8 per output channel (from the float32 weights). Default: "
                        "a GGUF file's own blocks (Q4_1, Q8_0, ...) are used as stored, a float checkpoint in float32")


def _add_chat(sub) -> None:
    c = sub.add_parser("chat", help="chat with a Llama-family model (SmolLM2-135M-Instruct)",
                       description="Chats with a chat model: the reply to PROMPT, streamed as it is generated, then "
                                   "the prefill and decode tokens/s on stderr. Without PROMPT, each line of standard "
                                   "input is a turn of one conversation (the KV cache is kept between turns).",
                       epilog=ENCODING_NOTE_TEXT)
    c.set_defaults(run="chat:run_chat")
    c.add_argument("prompt", nargs="?", help="the message (default: read turns from standard input)")
    c.add_argument("--system", help="a system message")
    c.add_argument("--chat-template", metavar="NAME", default=None,
                   help="one of the model's named chat templates (default: its only one, or the one named 'default')")
    _add_generation_options(c, "the most tokens of a reply (default 256); fewer when the conversation comes near the "
                               "end of the model's context")


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="continue raw text with a causal LM",
                       description="Continues TEXT without a chat template, streamed, then tokens/s on stderr.",
                       epilog=ENCODING_NOTE_TEXT)
    g.set_defaults(run="chat:run_generate")
    g.add_argument("text", help="the text to continue")
    _add_generation_options(g, "the most new tokens (default 256, or as many as fit the model's context after "
                               "TEXT); a value given here that does not fit the context is refused")


#: The commands, in the order ``--help`` lists them.
COMMANDS = {"embed": _add_embed, "search": _add_search, "chat": _add_chat, "generate": _add_generate}


#: The program's name in the usage when it was not started as a program of its own name.
MODULE_PROG = "python -m transformer_core"


def _prog() -> str:
    """The program's name for the usage, from how it was started (``sys.argv[0]``): ``python -m
    transformer_core`` for the module (``.../transformer_core/__main__.py``), else the name of the
    command that ran it (``transformer-core``, the console script). An ``argv[0]`` that names no
    program (``-c``, empty: :func:`main` called from Python code) gives the module's form too."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if not name or name.startswith("-") or name == "__main__.py":
        return MODULE_PROG
    return name


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=_prog(),
                                description="transformer_core from the command line: `COMMAND --help` for each.",
                                epilog=ENCODING_NOTE)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS.values():
        add(sub)
    return p


class _StandardOutput:
    """``sys.stdout`` while a command runs (:func:`main` puts it there): the stream it wraps, with
    two differences.

    - A text is written whole whatever the stream's encoding: each character the encoding cannot
      write becomes an escape first (``caf\\xe9``, or JSON's ``caf\\u00e9`` when ``json_escapes``;
      JSON has no ``\\x``). Written as it is, it would raise UnicodeEncodeError at that character,
      the lines before it already written.
    - An OSError of writing or flushing (a full disk: ``>/dev/full``) gets ``on_stdout = True``:
      such an error names no file, and its message must say where the write failed.

    Everything else (``encoding``, ``fileno``, ``buffer``, ...) is the wrapped stream's.
    """

    def __init__(self, stream, json_escapes: bool):
        """Wraps ``stream`` (the real ``sys.stdout``); ``json_escapes``: the command prints JSON."""
        self._stream = stream
        self._escape = _json_escape if json_escapes else _backslash_escape
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        """Writes ``text`` whole (escaped where the encoding cannot write it); returns the stream's count."""
        try:
            return self._stream.write(self._writable(text))
        except OSError as error:
            error.on_stdout = True
            raise

    def flush(self) -> None:
        """Flushes the stream; an OSError is marked as standard output's."""
        try:
            self._stream.flush()
        except OSError as error:
            error.on_stdout = True
            raise

    def __getattr__(self, name):
        """Every other attribute: the wrapped stream's."""
        return getattr(self._stream, name)

    def _writable(self, text: str) -> str:
        """``text`` with the characters the encoding cannot write escaped (most texts: unchanged)."""
        try:
            text.encode(self._encoding)
            return text
        except UnicodeEncodeError:
            return "".join(c if _encodable(c, self._encoding) else self._escape(c) for c in text)


def _encodable(character: str, encoding: str) -> bool:
    """Whether ``encoding`` can write ``character``."""
    try:
        character.encode(encoding)
        return True
    except UnicodeEncodeError:
        return False


def _backslash_escape(character: str) -> str:
    """Python's ``backslashreplace``: ``\\xe9``, ``\\u65e5``, ``\\U0001f600``."""
    return character.encode("ascii", "backslashreplace").decode("ascii")


def _json_escape(character: str) -> str:
    """JSON's escape of a character inside a string: ``\\u00e9``, a surrogate pair above U+FFFF."""
    return json.dumps(character)[1:-1]


def _hidden_file_of_the_output(filename, args) -> bool:
    """Whether ``filename`` (an OSError's) is one of the hidden files that a run of ``--out`` keeps
    beside it, named after it: the lock ``.OUT.npy.lock``, the temporaries ``.OUT.npy.tmp-...``.
    The user never gave these names; the visible ones (``OUT.npy.partial``, the manifest) are
    named as they are."""
    out = getattr(args, "out", None)
    if not out or not isinstance(filename, (str, bytes, os.PathLike)):
        return False
    path = os.path.abspath(os.fsdecode(filename))
    out = os.path.abspath(os.path.expanduser(out))
    return (os.path.dirname(path) == os.path.dirname(out)
            and os.path.basename(path).startswith(f".{os.path.basename(out)}."))


#: The modules that an extra of pyproject.toml's ``optional-dependencies`` installs, and that extra
#: (a module missing that is not here is a core dependency: reinstalling the package brings it).
EXTRA_OF_MODULE = {"pyarrow": "parquet", "dask": "distributed", "distributed": "distributed"}


def _message(error: BaseException, args=None) -> str:
    """One line for an expected error (``args``: the command's, to name the output it concerns)."""
    if isinstance(error, KeyboardInterrupt):
        text = str(error) or "interrupted"
    elif isinstance(error, OSError) and getattr(error, "on_stdout", False):
        text = f"stdout: cannot write standard output: {error.strerror or error}"
    elif isinstance(error, OSError) and error.strerror and _hidden_file_of_the_output(error.filename, args):
        # `--out ro/o.npy`: not "ro/.o.npy.lock: Read-only file system", a file the user never gave
        text = f"out: {args.out}: {error.strerror} (at its run's file {os.fsdecode(error.filename)})"
    elif isinstance(error, OSError) and error.strerror and error.filename is not None:
        text = f"{error.filename}: {error.strerror}"  # raised by the OS, not by us
    elif isinstance(error, ImportError) and type(error) is ModuleNotFoundError and error.name:
        extra = EXTRA_OF_MODULE.get(error.name.partition(".")[0])
        hint = (f"an optional dependency: pip install 'transformer_core[{extra}]'" if extra else
                "a dependency of transformer_core is missing: reinstall it")
        text = f"{error} ({hint})"
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (``kill``) raises KeyboardInterrupt, so a command ends as after Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        """The SIGTERM handler (``signal.signal``'s signature): raises KeyboardInterrupt."""
        raise KeyboardInterrupt("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports POLLERR), so that a
    BrokenPipeError of another pipe or socket (a Dask worker's) is still reported as an error."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll, or stdout without a file descriptor
        return False


def _discard_stdout() -> None:
    """After an error of writing standard output (a reader gone, a full disk): points stdout at
    devnull, so that the interpreter's flush at exit does not fail again on what is left."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (a test's capture)
        pass


def main(argv=None) -> int:
    """Entry point of the CLI; returns the exit code (0; 2 for a usage or expected error; 141 when
    standard output's reader closed it early)."""
    _cli_started()  # a Ctrl-C is a KeyboardInterrupt from here on, reported below
    stderr = sys.stderr
    sys.stderr = _Diagnostics(stderr)
    try:
        return _run(argv)
    finally:
        sys.stderr = stderr
        _cli_finished()  # the run is over: a Ctrl-C while Python exits changes nothing


def _run(argv) -> int:
    """:func:`main` with its diagnostics stream in place."""
    try:
        args = _parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command is known: the same one line and exit code
        print("transformer_core: interrupted while starting; nothing was done", file=sys.stderr)
        return 2
    if sys.stdout is None:  # started with `>&-`: Python made sys.stdout None, every print would be lost
        print(f"transformer_core {args.command}: stdout: standard output is closed; there is nowhere to write "
              f"the output", file=sys.stderr)
        return 2
    stdout = sys.stdout
    sys.stdout = _StandardOutput(stdout, json_escapes=getattr(args, "json", False))
    try:
        with _sigterm_as_interrupt():
            module, function = args.run.split(":")
            code = getattr(importlib.import_module(f".{module}", __package__), function)(args)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
            return code
    except BrokenPipeError as e:
        if _stdout_closed():
            _discard_stdout()
            return EXIT_BROKEN_PIPE
        print(f"transformer_core {args.command}: {_message(e, args)}", file=sys.stderr)
        return 2
    except EXPECTED_ERRORS as e:
        if getattr(e, "on_stdout", False):
            _discard_stdout()
        if isinstance(e, KeyboardInterrupt):
            _interrupt_handled()
        print(f"transformer_core {args.command}: {_message(e, args)}", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout


def _interrupt_handled() -> None:
    """Tells the interpreter that the KeyboardInterrupt being handled is handled. CPython (3.11 at
    least) marks one that leaves code run by ``exec`` or ``eval`` of a string (namedtuple's,
    dataclasses', a Jinja2 template's) as unhandled even when it is caught later, and under
    ``python -m`` then ends the process by SIGINT after our exit code 2 (a shell's 130). Each
    ``exec`` of a string clears that mark before it runs: this one runs nothing else."""
    exec("None")


class _Diagnostics:
    """``sys.stderr`` while :func:`main` runs: progress bars, the one-line errors and the tokens/s
    line. Standard error closed (``2>&-``: Python's ``sys.stderr`` is None, and ``print`` would
    write to standard output, into the data) or failing (``2>/dev/full``, a reader gone) loses
    these, never the run or its output: writes that fail are dropped. Every other attribute is the
    wrapped stream's (a closed one: ``isatty()`` False)."""

    def __init__(self, stream):
        """Wraps ``stream`` (the real ``sys.stderr``, or None)."""
        self._stream = stream

    def write(self, text: str) -> int:
        """Writes ``text``, or drops it when standard error cannot take it; returns its length."""
        if self._stream is not None:
            try:
                self._stream.write(text)
            except (OSError, ValueError):  # ValueError: the stream was closed
                pass
        return len(text)

    def flush(self) -> None:
        """Flushes the stream; a failure is dropped, as :meth:`write`'s."""
        if self._stream is not None:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                pass

    def isatty(self) -> bool:
        """Whether standard error is a terminal (False when it is closed or cannot tell)."""
        try:
            return self._stream is not None and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name):
        """Every other attribute: the wrapped stream's."""
        return getattr(self._stream, name)


if __name__ == "__main__":
    sys.exit(main())
