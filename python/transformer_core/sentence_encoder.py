"""Sentence embeddings from a BERT encoder, as sentence-transformers computes them
(all-MiniLM-L6-v2: mean pooling over the attention mask, then L2 normalisation)."""

from __future__ import annotations

import numpy as np

from ._runtime import core
from ._validation import as_bool, as_float, check_allocatable, check_bool, check_int
from .bert import BertModel
from .hub import DEFAULT_MODEL
from .tokenizer import Tokenizer, check_unicode

__all__ = ["SentenceEncoder", "mean_pool", "cosine_similarity"]


def mean_pool(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean of the token vectors over real tokens: ``Σ_l mask[n, l] h[n, l] / Σ_l mask[n, l]``.

    Args:
        last_hidden_state: ``(N, L, H)``.
        attention_mask: ``(N, L)``, 1 = real token.

    Returns:
        ``(N, H)``, dtype of ``last_hidden_state`` (float32 unless float64). A row with no real token
        gives zeros.

    Raises:
        TypeError: non-numeric ``last_hidden_state``; a mask neither bool nor 0/1 numbers.
        ValueError: wrong ranks, shapes that disagree, empty input, mask values other than 0/1.
    """
    last_hidden_state = as_float(last_hidden_state, "last_hidden_state", ndim=3)
    mask = as_bool(attention_mask, "attention_mask")
    if mask.shape != last_hidden_state.shape[:2]:
        raise ValueError(f"attention_mask: expected shape {last_hidden_state.shape[:2]} (last_hidden_state's N, L), "
                         f"got {mask.shape}")
    m = mask.astype(last_hidden_state.dtype)[..., None]                         # (N, L, 1)
    summed = (last_hidden_state * m).sum(axis=1)                                # (N, H)
    counts = np.maximum(m.sum(axis=1), 1e-9)                                     # (N, 1)
    return summed / counts


def cosine_similarity(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity matrix ``(N, M)`` between rows of ``a (N, H)`` and ``b (M, H)`` (``b = a``
    by default). A zero row has similarity 0 with everything.

    Returns:
        ``(N, M)``, float64 if ``a`` (or ``b``) is float64, else float32.

    Raises:
        TypeError: non-numeric arrays. ValueError: not 2-D, empty, widths that differ, an
            ``(N, M)`` result larger than this machine's memory.
    """
    a_in, b_in = a, b
    a = as_float(a_in, "a", ndim=2)
    b = a if b_in is None else as_float(b_in, "b", ndim=2)
    if a.dtype != b.dtype:
        a, b = a.astype(np.float64), b.astype(np.float64)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"b: expected rows of width {a.shape[1]} (a's), got shape {b.shape}")
    check_allocatable((a.shape[0], b.shape[0]), a.dtype.itemsize, "a, b: the (N, M) similarity matrix")
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return an @ bn.T


class SentenceEncoder:
    """Sentence embeddings: tokenizer -> :class:`BertModel` -> mean pooling -> L2 normalisation.

    Args:
        model: a loaded :class:`BertModel`.
        tokenizer: its :class:`Tokenizer` (an encoder tokenizer: ``max_length`` at most the model's
            ``max_position_embeddings``).

    Raises:
        TypeError: ``model`` or ``tokenizer`` of another class. ValueError: a tokenizer that would
            let sequences longer than the model's positions through.
    """

    def __init__(self, model: BertModel, tokenizer: Tokenizer):
        if not isinstance(model, BertModel):
            raise TypeError(f"model: expected a transformer_core.BertModel, got {type(model).__name__}")
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer: expected a transformer_core.Tokenizer, got {type(tokenizer).__name__}")
        positions = model.config.max_position_embeddings
        if tokenizer.max_length is None or tokenizer.max_length > positions:
            raise ValueError(f"tokenizer: expected an encoder tokenizer truncating to at most {positions} tokens "
                             f"(the model's max_position_embeddings), got max_length={tokenizer.max_length}")
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, name_or_path=DEFAULT_MODEL, dtype=np.float32, quantize: str | None = None
                        ) -> "SentenceEncoder":
        """Loads model and tokenizer from a Hugging Face directory or an embedded model name.

        Args:
            name_or_path: a directory or an embedded model's name (default all-MiniLM-L6-v2).
            dtype: ``np.float32`` or ``np.float64``.
            quantize: None, or ``"int8"``: every linear layer of the encoder int8 per output
                channel (:func:`transformer_core.quantize`; attention, norms, softmax and pooling
                stay float32). Needs ``dtype=np.float32``.

        Raises:
            FileNotFoundError, ValueError: as :meth:`BertModel.from_pretrained`; ValueError: an
                unknown ``quantize`` format, or ``quantize`` with float64.
        """
        model = BertModel.from_pretrained(name_or_path, dtype=dtype)
        if quantize is not None:
            from .quantization import quantize as _quantize

            model = _quantize(model, quantize, inplace=True)
        return cls(model, Tokenizer.from_pretrained(name_or_path))

    @property
    def dim(self) -> int:
        """Embedding width H (384 for all-MiniLM-L6-v2)."""
        return self.model.config.hidden_size

    def encode(self, sentences, batch_size: int = 32, normalize: bool = True, progress: bool | None = None) -> np.ndarray:
        """Embeds sentences.

        The sentences are sorted by length (characters, longest first, as sentence-transformers'
        ``SentenceTransformer.encode`` does) before they are cut into batches, so that each batch
        holds sentences of similar length and padding costs little; the rows come back in the
        order given. A row does not depend on the other sentences of its batch beyond float
        rounding (about 1e-7).

        Args:
            sentences: a list (or any iterable) of str, or one str.
            batch_size: sentences per forward pass; each batch is padded to its longest member.
            normalize: L2-normalise each embedding (cosine similarity = dot product).
            progress: show a tqdm bar (on stderr); None = only for more than 4 batches.

        Returns:
            ``(N, H)`` in the model's dtype (float32 by default; ``(N, 384)`` for
            all-MiniLM-L6-v2), row ``i`` the embedding of ``sentences[i]``.

        Raises:
            TypeError: ``sentences`` not str or an iterable of str (the first offending index is
                named); ``batch_size`` not an int; ``normalize`` not a bool; ``progress`` not a
                bool or None.
            ValueError: ``batch_size`` < 1; a sentence that is not valid Unicode (a lone
                surrogate, from bytes that were not UTF-8; its index and position are named).
        """
        if isinstance(sentences, str):
            sentences = [sentences]
        elif sentences is None or isinstance(sentences, (bytes, bytearray, dict)) or not hasattr(sentences, "__iter__"):
            raise TypeError(f"sentences: expected a str or an iterable of str, got {type(sentences).__name__}")
        sentences = list(sentences)
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentences: expected a list of str, got {type(s).__name__} at index {i}")
            check_unicode(s, "sentences", i)
        batch_size = check_int(batch_size, "batch_size", 1)
        normalize = check_bool(normalize, "normalize")
        if progress is not None:
            progress = check_bool(progress, "progress")
        out = np.zeros((len(sentences), self.dim), dtype=self.model.dtype)
        if not sentences:
            return out
        # Longest first (a stable sort: equal lengths keep their order); out[order[j]] is the j-th sorted.
        order = np.argsort([-len(s) for s in sentences], kind="stable")
        starts = range(0, len(sentences), batch_size)
        if progress is None:
            progress = len(starts) > 4
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encode", unit="batch")
        batches = self.tokenizer.encode_batches([sentences[i] for i in order], batch_size)
        # One packing of each weight for all the batches (the same bits as packing it per batch).
        with core.PackedWeightScope():
            for start, enc in zip(starts, batches):
                rows = order[start:start + batch_size]
                mask = enc["attention_mask"] == 1  # (N, L) bool, True = a real token
                hidden = self.model(enc["input_ids"], mask, enc["token_type_ids"]).last_hidden_state
                # mean_pool's sum: the model's hidden states at padding positions are zeros, so the
                # plain sum over L is the masked sum (the same values added in the same order)
                counts = np.maximum(mask.sum(axis=1, keepdims=True), 1).astype(hidden.dtype)
                out[rows] = hidden.sum(axis=1) / counts
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out
