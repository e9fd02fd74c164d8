"""Command line: ``python -m transformer_core embed "sentence one" "sentence two" ...``

Prints the embeddings' shape and their cosine-similarity matrix (``--json`` for JSON, ``--file``
to read one sentence per line, ``--model`` for another model directory)."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from .hub import DEFAULT_MODEL


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m transformer_core", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="sentence embeddings and their cosine similarities")
    e.add_argument("sentences", nargs="*", help="sentences to embed")
    e.add_argument("--file", help="a text file, one sentence per line (blank lines skipped)")
    e.add_argument("--model", default=DEFAULT_MODEL, help="model directory or embedded name")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--json", action="store_true", help="print JSON: shape, similarity, embeddings")
    return p


def main(argv=None) -> int:
    """Entry point of the CLI; returns the exit code."""
    args = _parser().parse_args(argv)
    from . import SentenceEncoder, cosine_similarity

    sentences = list(args.sentences)
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                sentences += [line.strip() for line in f if line.strip()]
        except OSError as e:
            print(f"embed: --file: cannot read {args.file!r}: {e.strerror}", file=sys.stderr)
            return 2
    if not sentences:
        print("embed: give sentences as arguments or with --file", file=sys.stderr)
        return 2
    try:
        encoder = SentenceEncoder.from_pretrained(args.model)
    except (FileNotFoundError, ValueError) as e:
        print(f"embed: --model: {e}", file=sys.stderr)
        return 2
    emb = encoder.encode(sentences, batch_size=args.batch_size)
    sim = cosine_similarity(emb)
    if args.json:
        print(json.dumps({"model": args.model, "sentences": sentences, "shape": list(emb.shape),
                          "similarity": sim.round(6).tolist(), "embeddings": emb.tolist()}))
        return 0
    print(f"model: {args.model}")
    print(f"embeddings: shape {emb.shape}, dtype {emb.dtype}")
    print("cosine similarity:")
    short = [s if len(s) <= 40 else s[:37] + "..." for s in sentences]
    width = max(len(s) for s in short)
    for i, s in enumerate(short):
        row = " ".join(f"{x:6.3f}" for x in sim[i])
        print(f"  [{i}] {s:<{width}}  {row}")
    with np.printoptions(precision=4, suppress=True):
        print(f"first embedding, first 8 values: {emb[0, :8]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
