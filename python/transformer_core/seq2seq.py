"""The encoder–decoder Transformer as a whole model: token embeddings, sinusoidal positions,
:class:`~transformer_core.nn.Transformer` and an output projection (Vaswani et al. 2017, Figure 1;
the encoder–decoder tutorial; PyTorch's "Language Translation with nn.Transformer" tutorial's
``Seq2SeqTransformer``, whose parameter names it keeps), trainable with an explicit backward.

    x   = src_tok_emb[src] · √d_model + PE        y = tgt_tok_emb[tgt] · √d_model + PE
    out = Transformer(x, y, causal target mask)   logits = generator(out)
    loss = cross-entropy(logits, labels)          (teacher forcing: tgt is the labels shifted right)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ._validation import (
    as_bool,
    as_float,
    as_ids,
    check_float,
    check_int,
    check_positive_int,
    ids_shape,
    physical_memory_bytes,
    to_numpy,
)
from .backward import cross_entropy_with_grad, dropout_backward
from .functional import dropout as _dropout
from .module import Module, NonFiniteLossError, NoTrainingStateError, check_dropout
from .nn import Embedding, Linear, Transformer, _activation_named_in_snapshot, _check_feedforward_activations
from .positional import sinusoidal_positional_encoding

__all__ = ["Seq2SeqTransformer"]


class Seq2SeqTransformer(Module):
    """An encoder–decoder Transformer with its embeddings and output layer.

    Args:
        src_vocab_size, tgt_vocab_size: the two vocabularies (>= 1), the only positional arguments.
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, activation,
            layer_norm_eps, norm_first, bias: (keyword) as :class:`~transformer_core.nn.Transformer`
            (torch's defaults).
        dropout: in training forwards: on the embedded inputs (the tutorial's PositionalEncoding
            dropout) and in every layer, where torch's ``nn.Transformer(dropout=p)`` applies it
            (dropout1/2/3, the feed-forward's and the attention probabilities'); 0 = none. The
            masks are this library's (seeded by :func:`transformer_core.manual_seed`), not
            torch's.
        max_len: the longest sequence (rows of the sinusoidal table).
        dtype: ``np.float32`` (default) or ``np.float64``.

    Everything after the two vocabulary sizes is keyword-only: the translation tutorial's
    ``Seq2SeqTransformer(num_encoder_layers, num_decoder_layers, emb_size, nhead, src_vocab_size,
    tgt_vocab_size, dim_feedforward)`` takes seven ints in another order, which read positionally
    here would build another model without a word; they are a ``TypeError`` instead. The
    tutorial's call, by keyword: ``Seq2SeqTransformer(src_vocab_size, tgt_vocab_size,
    d_model=emb_size, nhead=nhead, num_encoder_layers=..., num_decoder_layers=...,
    dim_feedforward=...)``.

    Starts in eval mode (``training`` False), unlike torch's modules (the tutorial's among them),
    which start in training mode: call ``train()`` before training (then :meth:`loss` applies dropout and keeps
    what :meth:`backward` needs).

    Weights: ``src_tok_emb.weight (src_vocab, E)``, ``tgt_tok_emb.weight (tgt_vocab, E)``,
    ``transformer.*`` (torch's ``nn.Transformer`` names), ``generator.weight (tgt_vocab, E)``,
    ``generator.bias``. The tutorial's module names its tables ``src_tok_emb.embedding.weight`` and
    ``tgt_tok_emb.embedding.weight`` (its ``TokenEmbedding`` wrappers) and keeps a
    ``positional_encoding.pos_embedding`` buffer. Its ``state_dict`` loads here as is: the wrapped
    names are read as ours, and the buffer is checked to be the sinusoidal table and then kept (the
    model adds the tutorial's float32-computed rows, so its outputs are the tutorial's: see
    :meth:`load_state_dict`; :meth:`state_dict` then holds that table too). The other way, ours into
    the tutorial's module, needs the two tables renamed and, unless one was loaded, the buffer added
    (``positional_encoding.pos_embedding``: the sinusoidal table of ``(max_len, 1, E)``).

    Raises (the constructor): TypeError / ValueError naming the argument; the Transformer's
    arguments (``nhead`` dividing ``d_model``, ``activation``, ``dim_feedforward``,
    ``layer_norm_eps``, ``norm_first``, ``bias``, the layer counts) are checked before the
    embedding tables are built.

    Training: ``model.train(); loss = model.loss(src, tgt_in, labels); model.backward()``.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, d_model: int = 512, nhead: int = 8,
                 num_encoder_layers: int = 6, num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.0, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 norm_first: bool = False, bias: bool = True, max_len: int = 5000, dtype=np.float32):
        self._init_dtype(dtype)
        self.src_vocab_size = check_positive_int(src_vocab_size, "src_vocab_size")
        self.tgt_vocab_size = check_positive_int(tgt_vocab_size, "tgt_vocab_size")
        self.d_model = check_positive_int(d_model, "d_model")
        self.max_len = check_positive_int(max_len, "max_len")
        self.dropout = check_dropout(dropout)
        tables = [("src_vocab_size, d_model", "the source embedding table", self.src_vocab_size, self.d_model),
                  ("tgt_vocab_size, d_model", "the target embedding table", self.tgt_vocab_size, self.d_model),
                  ("tgt_vocab_size, d_model", "the output layer (generator)", self.tgt_vocab_size, self.d_model),
                  ("max_len, d_model", "the sinusoidal position table", self.max_len, self.d_model)]
        # the Transformer first: its constructor checks its arguments, then its stacks and these tables
        # (each, and all together) against memory, before it builds anything, so a bad nhead or layer
        # count, or a model too large as a whole, is refused before the (possibly large) embedding
        # tables are built and filled (each module's init draws the package generator's next seed,
        # in this order: manual_seed, then the same model, gives the same weights)
        self.transformer = Transformer._within(tables, d_model=d_model, nhead=nhead,
                                               num_encoder_layers=num_encoder_layers,
                                               num_decoder_layers=num_decoder_layers,
                                               dim_feedforward=dim_feedforward, activation=activation,
                                               layer_norm_eps=layer_norm_eps, norm_first=norm_first, bias=bias,
                                               dtype=self.dtype, dropout=dropout)
        _activation_named_in_snapshot(self)  # a torch callable kept by its name, as the layers keep it
        self.src_tok_emb = Embedding(self.src_vocab_size, d_model, self.dtype)
        self.tgt_tok_emb = Embedding(self.tgt_vocab_size, d_model, self.dtype)
        self.generator = Linear(d_model, self.tgt_vocab_size, True, self.dtype)
        self.pe = sinusoidal_positional_encoding(self.max_len, d_model, dtype=self.dtype)  # (max_len, E)
        self.pe_loaded = False  # True while self.pe holds a loaded tutorial's table (see load_state_dict)
        self.scale = math.sqrt(d_model)

    _PE_NAME = "positional_encoding.pos_embedding"

    def _rename_state_dict(self, state: dict) -> dict:
        """The translation tutorial's own names: its ``TokenEmbedding`` wrappers'
        ``{src,tgt}_tok_emb.embedding.weight`` (its ``pos_embedding`` buffer: :meth:`load_state_dict`)."""
        for side in ("src", "tgt"):
            wrapped = f"{side}_tok_emb.embedding.weight"
            if wrapped in state and f"{side}_tok_emb.weight" not in state:
                state[f"{side}_tok_emb.weight"] = state.pop(wrapped)
        return state

    def _loaded_table(self, value) -> np.ndarray:
        """The model's position table ``(max_len, E)`` of ``self.dtype`` from a tutorial's
        ``pos_embedding`` ``(maxlen, 1, E)`` (or ``(maxlen, E)``): its first ``min(maxlen, max_len)``
        rows as they are (cast), the exact sinusoidal rows after them.

        Raises:
            ValueError: a table of another width, or not the sinusoidal table (to 4e-3: the tutorial
                computes it in float32, and a model cast to bfloat16 rounds it by up to 2^-9).
            TypeError: not floating-point data (an int or bool table).
        """
        name = self._PE_NAME
        given = to_numpy(value, f"state_dict['{name}']")
        if given.dtype.kind != "f":
            raise TypeError(f"state_dict['{name}']: expected a floating-point table, got dtype {given.dtype}")
        shape = given.shape
        table = as_float(given, f"state_dict['{name}']", np.float64)
        if table.ndim == 3 and table.shape[1] == 1:
            table = table[:, 0]
        if table.ndim != 2 or table.shape[1] != self.d_model:
            raise ValueError(f"state_dict['{name}']: expected shape (maxlen, 1, {self.d_model}) (the tutorial's "
                             f"sinusoidal table of d_model {self.d_model}), got {shape}")
        exact = sinusoidal_positional_encoding(self.max_len, self.d_model, dtype=np.float64)
        n = min(len(table), self.max_len)
        err = float(np.abs(table[:n] - exact[:n]).max()) if n else 0.0
        if not err <= 4e-3:  # float32's table, rounded to bfloat16 at worst (half an ulp of 1: 2^-9)
            raise ValueError(f"state_dict['{name}']: not the sinusoidal table this model adds (off by {err:.3g} "
                             f"in its first {n} rows)")
        exact[:n] = table[:n]
        return exact.astype(self.dtype)

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False) -> dict[str, np.ndarray]:
        """Every weight (:meth:`Module.state_dict`, its arguments as there), and, while the model
        holds a table loaded from a tutorial's ``state_dict`` (``pe_loaded``), that table as
        ``positional_encoding.pos_embedding`` ``(max_len, 1, E)`` (the tutorial's buffer, a copy),
        so that a model saved and loaded again (or a
        :func:`~transformer_core.training.save_checkpoint`) keeps it."""
        out = super().state_dict(destination, prefix, keep_vars)
        if self.pe_loaded:
            out[prefix + self._PE_NAME] = self.pe[:, None, :].copy()
        return out

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """:meth:`Module.load_state_dict`, with the translation tutorial's names (see
        :meth:`_rename_state_dict`) and its ``positional_encoding.pos_embedding`` buffer ``(maxlen,
        1, E)``: checked to be the sinusoidal table (to 4e-3), then kept (cast to ``self.dtype``):
        the model adds its first ``min(maxlen, max_len)`` rows as the tutorial computed them (in
        float32), so that its outputs are the tutorial's, and the exact rows past them. (With the
        exact table instead, a float32 model of the tutorial's weights gave logits 1.9e-5 off the
        tutorial's at target length 3000: the float32 table is off the exact one by up to ~2e-4 over
        positions 0..3000 and 3.9e-4 over 0..5000 at d_model 512, see
        :func:`~transformer_core.positional.sinusoidal_positional_encoding`.) Without that key,
        ``strict=True`` sets the exact table back (as a model built anew has it), and
        ``strict=False`` keeps the table the model holds. The table is set only once every weight
        was loaded.

        Raises:
            ValueError: a ``pos_embedding`` of another width, or not the sinusoidal table; as
                :meth:`Module.load_state_dict`. Nothing is changed.
        """
        table = None
        if isinstance(state_dict, Mapping) and self._PE_NAME in state_dict:
            state_dict = dict(state_dict)
            table = self._loaded_table(state_dict.pop(self._PE_NAME))  # checked before anything changes
        result = super().load_state_dict(state_dict, strict, assign)
        if table is not None:
            self.pe, self.pe_loaded = table, True
        elif strict and self.pe_loaded:
            self.pe = sinusoidal_positional_encoding(self.max_len, self.d_model, dtype=self.dtype)
            self.pe_loaded = False
        return result

    def _children(self):  # a child set to None or deleted is left out (Module._registered_children)
        return [(name, getattr(self, name, None)) for name in ("src_tok_emb", "tgt_tok_emb", "transformer", "generator")]

    # ---- pieces -----------------------------------------------------------------------------------
    def _check_shape(self, table: Embedding, x, name: str) -> tuple:
        """The ids ``x`` of the argument ``name`` (``"src"`` or ``"tgt"``, for ``table``): their
        dtype and rank, then what their shape ``(N, L)`` alone decides, before any copy of them.
        Returns ``(N, L)``.

        Raises:
            TypeError: non-integer ids. ValueError: not 1-D or 2-D; ``L > max_len``; embeddings of
                ``(N, L, d_model)`` whose three temporaries (the lookup, its scaling, the positions
                added) exceed this machine's memory, or feed-forward activations (``N · L`` rows ×
                ``dim_feedforward``) that do.
        """
        N, L = ids_shape(x, name)
        if L > self.max_len:
            raise ValueError(f"{name}: length {L} exceeds max_len ({self.max_len})")
        need, limit = 3 * N * L * self.d_model * np.dtype(self.dtype).itemsize, physical_memory_bytes()
        if need > limit:
            raise ValueError(f"{name}: shape {(N, L)} gives embeddings of shape ({N}, {L}, {self.d_model}), whose "
                             f"three temporaries need {need} bytes, more than this machine's memory ({limit} bytes)")
        stack = self.transformer.encoder if table is self.src_tok_emb else self.transformer.decoder
        _check_feedforward_activations(N * L, stack.layers[0].dim_feedforward, self.dtype, name, (N, L))
        return N, L

    def _check_ids(self, table: Embedding, ids: np.ndarray, name: str) -> None:
        """``ids``, the ``(N, L)`` int64 array of the argument ``name`` whose shape passed
        :meth:`_check_shape`, fits ``table``.

        Raises:
            ValueError: an id outside ``[0, table rows)`` (its position named).
        """
        V = table.num_embeddings
        bad = (ids < 0) | (ids >= V)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            vocab = "src_vocab_size" if table is self.src_tok_emb else "tgt_vocab_size"
            raise ValueError(f"{name}: expected ids in [0, {V}) ({vocab}), got {int(ids[pos])} at {pos}")

    def _embed(self, table: Embedding, ids: np.ndarray, p: float):
        """``table[ids] · √E + PE[:L]``, then dropout of probability ``p`` (0 in eval mode):
        ``((N, L, E), drawn)``, drawn the dropout's ``(p, seed)`` for the backward (None when none
        was applied); ``ids`` already checked (:meth:`_check_ids`)."""
        x = table(ids) * self.dtype(self.scale) + self.pe[:ids.shape[1]]
        if p == 0:
            return x, None
        seed = self._dropout_seed(p)
        return _dropout(x, p, seed), (p, seed)

    def _masks(self, src, tgt, src_key_mask, tgt_key_mask):
        """``(src, tgt, src_key_mask, tgt_key_mask)`` checked: ids as ``(N, L)`` int64 (in range,
        :meth:`_check_ids`), masks as bool of their shapes or None; every check on the shapes
        alone comes before the ids are copied."""
        src_shape = self._check_shape(self.src_tok_emb, src, "src")
        tgt_shape = self._check_shape(self.tgt_tok_emb, tgt, "tgt")
        if src_shape[0] != tgt_shape[0]:  # before either copy
            raise ValueError(f"tgt: expected batch size {src_shape[0]} (src's), got shape {tgt_shape}")
        src = as_ids(src, "src")
        tgt = as_ids(tgt, "tgt")
        self._check_ids(self.src_tok_emb, src, "src")  # both, before any work or dropout seed
        self._check_ids(self.tgt_tok_emb, tgt, "tgt")
        sk = tk = None
        if src_key_mask is not None:
            sk = as_bool(src_key_mask, "src_key_mask")
            if sk.shape != src.shape:
                raise ValueError(f"src_key_mask: expected shape {src.shape} (src's), got {sk.shape}")
        if tgt_key_mask is not None:
            tk = as_bool(tgt_key_mask, "tgt_key_mask")
            if tk.shape != tgt.shape:
                raise ValueError(f"tgt_key_mask: expected shape {tgt.shape} (tgt's), got {tk.shape}")
        return src, tgt, sk, tk

    def forward(self, src, tgt, src_key_mask=None, tgt_key_mask=None) -> np.ndarray:
        """Next-token logits of the target given the source (teacher forcing).

        Args:
            src: ``(N, S)`` source token ids.  tgt: ``(N, T)`` target ids (start token first).
            src_key_mask: ``(N, S)`` True = a real source token (padding is not attended to, by the
                encoder nor by the decoder's cross-attention).  tgt_key_mask: ``(N, T)``.

        Returns:
            ``(N, T, tgt_vocab_size)`` logits; position t predicts target token t + 1. The decoder's
            self-attention is causal.

        Raises:
            ValueError: ids out of range, batch sizes that differ, lengths over ``max_len``, masks
                of the wrong shape; a ``src`` or ``tgt`` whose embeddings or feed-forward activations
                (``N · L`` rows × ``dim_feedforward``) exceed this machine's memory (naming it, before
                any work). TypeError: non-integer ids.
            TypeError, ValueError: in training mode, a ``dropout`` attribute assigned since that is
                not a probability in [0, 1) (checked as the constructor checks it, before any work).
        """
        p = check_dropout(self.dropout) if self.training else 0.0  # an attribute: may have been changed
        src, tgt, sk, tk = self._masks(src, tgt, src_key_mask, tgt_key_mask)
        if self.training:  # a new training forward: a loss kept for backward is no longer this one's
            self._saved = None
        try:
            x, src_drawn = self._embed(self.src_tok_emb, src, p)
            y, tgt_drawn = self._embed(self.tgt_tok_emb, tgt, p)
            out = self.transformer(x, y, src_key_mask=sk, tgt_key_mask=tk, memory_key_mask=sk, tgt_is_causal=True)
            logits = self.generator(out)
        except BaseException:
            if self.training:  # nothing half-kept: a backward now raises instead of mixing two forwards
                self._discard()
            raise
        if self.training:
            self._embed_dropout = (src_drawn, tgt_drawn)
        return logits

    def loss(self, src, tgt, labels, src_key_mask=None, tgt_key_mask=None, *, ignore_index: int = -100,
             label_smoothing: float = 0.0) -> np.float64:
        """Mean cross-entropy of ``labels`` under :meth:`forward`'s logits (no shift: ``labels[:, t]``
        is the token that position t predicts, usually the target without its start token).

        Args:
            src, tgt, src_key_mask, tgt_key_mask: as :meth:`forward`.
            labels: ``(N, T)`` ints in ``[0, tgt_vocab_size)`` or ``ignore_index``.
            ignore_index, label_smoothing: as torch's ``cross_entropy``.

        Returns:
            The loss, a ``np.float64`` (a subclass of Python's float, with ``.item()`` as torch's
            0-d tensor). In training mode the call keeps what :meth:`backward` needs.

        Raises:
            NonFiniteLossError: the loss is NaN or inf; nothing is kept, no gradient was touched.
            ValueError: labels of the wrong shape or out of range, ``ignore_index`` outside the int64
                range; as :meth:`forward` (all before the forward runs: a pending backward stays).
            TypeError: ``ignore_index`` not an int; as :meth:`forward`.
        """
        # an int64 (the labels' dtype), as functional.cross_entropy checks it: before the forward
        ignore_index = check_int(ignore_index, "ignore_index", -2**63, 2**63 - 1)
        label_smoothing = check_float(label_smoothing, "label_smoothing", minimum=0.0, maximum=1.0)
        self._check_shape(self.tgt_tok_emb, tgt, "tgt")  # tgt's shape, before labels' and tgt's copies
        lab = as_ids(labels, "labels", shape=ids_shape(tgt, "tgt"), shape_of="tgt's")
        bad = (lab != ignore_index) & ((lab < 0) | (lab >= self.tgt_vocab_size))
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"labels: expected values in [0, {self.tgt_vocab_size}) or ignore_index "
                             f"({ignore_index}), got {int(lab[pos])} at {pos}")
        logits = self.forward(src, tgt, src_key_mask, tgt_key_mask)
        try:
            value, dlogits = cross_entropy_with_grad(logits, lab, ignore_index, label_smoothing)
        except BaseException:
            self._discard()
            raise
        value = np.float64(value)  # a float with torch's 0-d tensor's .item()
        if not math.isfinite(value):
            self._discard()
            raise NonFiniteLossError(f"loss: the loss is {value} (non-finite); no gradient was touched and nothing "
                                     "was kept for backward", value)
        if self.training:
            self._saved = dlogits
        return value

    def _discard(self) -> None:
        """Drops what the training forwards kept (every child's)."""
        self._drop_training_state()
        self._embed_dropout = None

    def backward(self) -> None:
        """The backward pass of the last :meth:`loss` in training mode: every parameter's gradient added
        (generator, decoder, encoder through the memory, both embeddings).

        Raises:
            NoTrainingStateError: no training loss since the last backward.
            WeightsChangedError (a NoTrainingStateError): the weights were written since the loss (an
                optimizer ``step()``, ``load_state_dict``): the state is dropped, run the loss again.
                Values assigned into ``p.data`` by hand are not detected. Also when a module under it
                holds no state of this loss (a child's own backward ran since): the state is dropped,
                no gradient added.
        """
        if not self.training:
            raise NoTrainingStateError("Seq2SeqTransformer.backward: no training loss to differentiate (mode: eval; "
                                       "call .train(), then run the loss again)")
        self._check_backward_ready()  # before the generator adds anything
        dlogits = self._take_saved()
        g = self.generator.backward(dlogits)
        grad_src, grad_tgt = self.transformer.backward(g)
        src_drawn, tgt_drawn = self._embed_dropout
        for table, grad, drawn in ((self.src_tok_emb, grad_src, src_drawn), (self.tgt_tok_emb, grad_tgt, tgt_drawn)):
            if drawn is not None:  # the forward's p and seed, whatever self.dropout is now
                grad = dropout_backward(grad, *drawn)
            table.backward(grad * self.dtype(self.scale))

    # ---- inference ---------------------------------------------------------------------------------
    def encode(self, src, src_key_mask=None) -> np.ndarray:
        """The encoder's output (the memory) ``(N, S, E)`` (eval mode).

        Args:
            src: ``(N, S)`` source ids in ``[0, src_vocab_size)``.  src_key_mask: ``(N, S)``, True = real.

        Raises:
            ValueError: training mode; ``src`` ids out of range (named ``src``), ``S > max_len``,
            a mask of another shape. TypeError: non-integer ids.
        """
        self._require_eval("encode")
        self._check_shape(self.src_tok_emb, src, "src")
        src = as_ids(src, "src")
        sk = None if src_key_mask is None else as_bool(src_key_mask, "src_key_mask")
        self._check_ids(self.src_tok_emb, src, "src")
        x, _ = self._embed(self.src_tok_emb, src, 0.0)  # eval mode: no dropout
        return self.transformer.encoder(x, src_key_mask=sk)

    def decode(self, tgt, memory, src_key_mask=None) -> np.ndarray:
        """Logits ``(N, T, tgt_vocab_size)`` of ``tgt`` over ``memory`` (eval mode).

        Args:
            tgt: ``(N, T)`` target ids in ``[0, tgt_vocab_size)``.  memory: ``(N, S, E)`` from
            :meth:`encode`.  src_key_mask: ``(N, S)``, True = a real source token.

        Raises:
            ValueError: training mode; ``tgt`` ids out of range (named ``tgt``), ``T > max_len``,
            a memory or mask of another shape. TypeError: non-integer ids.
        """
        self._require_eval("decode")
        self._check_shape(self.tgt_tok_emb, tgt, "tgt")
        tgt = as_ids(tgt, "tgt")
        sk = None if src_key_mask is None else as_bool(src_key_mask, "src_key_mask")
        mem_shape = tuple(np.shape(memory))
        if sk is not None and len(mem_shape) == 3 and sk.shape != mem_shape[:2]:
            raise ValueError(f"src_key_mask: expected shape {mem_shape[:2]} (memory's (N, S)), got {sk.shape}")
        self._check_ids(self.tgt_tok_emb, tgt, "tgt")
        y, _ = self._embed(self.tgt_tok_emb, tgt, 0.0)  # eval mode: no dropout
        return self.generator(self.transformer.decoder(y, memory, memory_key_mask=sk, tgt_is_causal=True))

    def greedy_decode(self, src, max_len: int, start_token: int, end_token: int | None = None,
                      src_key_mask=None) -> np.ndarray:
        """Greedy decoding, as the translation tutorial's ``greedy_decode``: from ``start_token``,
        append the argmax of the last position's logits until the sequence holds ``max_len`` tokens
        **counting the start token** (the tutorial's ``for i in range(max_len - 1)``: ``max_len - 1``
        decoder steps at most) or until every sequence emitted ``end_token``. Batched: a sequence
        that emitted ``end_token`` goes on with ``end_token`` until all have (with N = 1, the
        tutorial's ``break``).

        Args:
            src: ``(N, S)`` source ids.  src_key_mask: ``(N, S)``, True = a real source token.
            max_len: tokens to return at most, the start token included; 1 <= ``max_len`` <= the
                model's ``max_len`` (so the result is a target the model reads); 1 returns the start
                token alone.
            start_token: the first target id (BOS).  end_token: stops a sequence (EOS); None = run
                all ``max_len - 1`` steps.

        Returns:
            ``(N, T)`` int64 ids, ``1 <= T <= max_len``, the start token first (the tutorial's ``ys``
            is ``(T, 1)``, sequence first).

        Raises:
            ValueError: in training mode (call ``.eval()``), ``max_len`` < 1 or over the model's
            ``max_len``, ``start_token`` / ``end_token`` out of ``[0, tgt_vocab_size)``; as
            :meth:`encode` — all before any decoding.
            TypeError: ``max_len``, ``start_token`` or ``end_token`` not an int.
        """
        self._require_eval("greedy_decode")
        max_len = check_positive_int(max_len, "max_len")
        if max_len > self.max_len:
            raise ValueError(f"max_len: expected <= the model's max_len ({self.max_len}), the longest target it "
                             f"reads, got {max_len}")
        start_token = check_int(start_token, "start_token", 0)
        if start_token >= self.tgt_vocab_size:
            raise ValueError(f"start_token: expected an id in [0, {self.tgt_vocab_size}), got {start_token}")
        if end_token is not None:
            end_token = check_int(end_token, "end_token", 0)
            if end_token >= self.tgt_vocab_size:
                raise ValueError(f"end_token: expected an id in [0, {self.tgt_vocab_size}), got {end_token}")
        memory = self.encode(src, src_key_mask)
        N = memory.shape[0]
        ys = np.full((N, 1), start_token, np.int64)
        done = np.zeros(N, bool)
        for _ in range(max_len - 1):  # the tutorial's loop: max_len tokens at most, the start token included
            nxt = self.decode(ys, memory, src_key_mask)[:, -1].argmax(-1)
            if end_token is not None:
                nxt = np.where(done, end_token, nxt)
                done |= nxt == end_token
            ys = np.concatenate([ys, nxt[:, None]], axis=1)
            if end_token is not None and done.all():
                break
        return ys

    def _require_eval(self, what: str) -> None:
        if self.training:
            raise ValueError(f"{what}: runs the inference path; call .eval() first")
