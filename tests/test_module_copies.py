"""Copies of modules and partial loads, as torch's: ``copy.copy`` (the same weights, no backward
pending), ``copy.deepcopy`` and ``pickle`` (an independent module: weights, gradients, training mode
and the attributes it carries, shared submodules kept within one call), and
``load_state_dict(strict=False)`` with torch's ``_IncompatibleKeys``; for layers and models (GPT-2,
Llama, BERT). Not in the sanitizer's reduced build (it has no models)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import module_state_to_numpy, randn, to_torch


def _logits(out):
    return np.asarray(getattr(out, "logits", out))


def _tiny_models():
    gpt2 = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=4),
                              dtype=np.float64)
    llama = tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=16), dtype=np.float64, rope_layout="interleaved")
    return {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("kind", ["linear", "mha", "encoder_layer", "gpt2", "llama"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_give_an_independent_module(rng, kind, how):
    """copy.deepcopy / pickle of any module used to fail ("cannot pickle '..._core...' object"). As
    torch's: the copy has the same class, outputs (checked against torch for the layers), training
    mode and attributes, and changing its weights leaves the original alone; it keeps the gradients
    too, which torch's drop (see test_copies_keep_the_gradients_that_torchs_drop)."""
    import copy
    import pickle

    if kind in ("gpt2", "llama"):
        ours = _tiny_models()[kind]
        x = rng.integers(0, 40, (2, 5))
        reference = _logits(ours(x))
        ours.train()
        ours.loss(x, x)
        ours.backward()
    else:
        if kind == "linear":
            ref = torch.nn.Linear(6, 4).double()
            ours = tc.nn.Linear(6, 4, dtype=np.float64)
        elif kind == "mha":
            ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
            ours = tc.nn.MultiheadAttention(8, 2, dtype=np.float64)
        else:
            ref = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double().eval()
            ours = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64, dropout=0.25)
            ours.dropout = 0.0  # an attribute changed after construction travels with the copy
        ours.load_state_dict(module_state_to_numpy(ref))
        x = randn(rng, (2, 3, 6 if kind == "linear" else 8), np.float64)
        with torch.no_grad():
            out = ref(*[to_torch(x)] * (3 if kind == "mha" else 1))
        reference = (out[0] if kind == "mha" else out).numpy()
        ours.train()
        ours(x)
        ours.backward(np.ones_like(x if kind != "linear" else np.zeros((2, 3, 4))))
    grads = ours.gradients()
    assert grads
    dup = copy.deepcopy(ours) if how == "deepcopy" else pickle.loads(pickle.dumps(ours))
    assert type(dup) is type(ours) and dup.training and dup.dtype == ours.dtype
    assert vars(dup).keys() == vars(ours).keys() - {"_parameters_cache", "_weight_names", "_saved"} | {"_init_args"}
    if kind == "encoder_layer":
        assert dup.dropout == 0.0
    assert dup.gradients().keys() == grads.keys()
    for name, g in grads.items():
        np.testing.assert_array_equal(dup.gradients()[name], g, err_msg=name)
    with pytest.raises(tc.NoTrainingStateError):  # what the forward kept is not copied
        dup.backward() if kind in ("gpt2", "llama") else dup.backward(np.ones((2, 3, 4 if kind == "linear" else 8)))
    ours.eval()
    dup.eval()
    run = (lambda m: _logits(m(x))) if kind in ("gpt2", "llama") else (
        lambda m: np.asarray(m(x, x, x)[0] if kind == "mha" else m(x)))
    np.testing.assert_allclose(run(dup), reference, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(run(dup), run(ours))
    for _, p in dup.named_parameters():
        p.data[...] = 0.5
        p.grad = None
    np.testing.assert_allclose(run(ours), reference, rtol=1e-12, atol=1e-12)
    assert ours.gradients().keys() == grads.keys()
    assert not np.allclose(run(dup), reference)


def test_deepcopy_of_a_quantized_module_names_the_way_to_copy():
    import copy

    q = tc.quantize(tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=32,
                                                       num_hidden_layers=1, num_attention_heads=4,
                                                       max_position_embeddings=16)))
    with pytest.raises(TypeError, match="quantized.*state_dict"):
        copy.deepcopy(q)


def test_load_state_dict_strict_false_and_its_result_match_torch(rng):
    """load_state_dict had no ``strict`` and returned None; torch's takes ``strict=False`` (loads the
    keys present) and returns ``(missing_keys, unexpected_keys)``."""
    ref = torch.nn.Linear(5, 3).double()
    ours = tc.nn.Linear(5, 3, dtype=np.float64)
    bias_before = ours.state_dict()["bias"]
    w = rng.standard_normal((3, 5))
    theirs = ref.load_state_dict({"weight": torch.from_numpy(w), "extra": torch.zeros(2)}, strict=False)
    got = ours.load_state_dict({"weight": w, "extra": np.zeros(2)}, strict=False)
    assert (got.missing_keys, got.unexpected_keys) == (theirs.missing_keys, theirs.unexpected_keys)
    assert got == (["bias"], ["extra"])
    np.testing.assert_array_equal(ours.state_dict()["weight"], ref.weight.detach().numpy())
    np.testing.assert_array_equal(ours.state_dict()["bias"], bias_before)
    full = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    result = ours.load_state_dict(full)
    assert result == ([], []) and repr(result) == repr(ref.load_state_dict(ref.state_dict()))
    with pytest.raises(ValueError, match="missing keys"):
        ours.load_state_dict({"weight": w})
    # strict=False still refuses a mis-shaped weight (as torch), before anything changes
    with pytest.raises(ValueError, match="mis-shaped"):
        ours.load_state_dict({"weight": np.zeros((3, 5)), "bias": np.zeros(4)}, strict=False)
    np.testing.assert_array_equal(ours.state_dict()["weight"], ref.weight.detach().numpy())
    with pytest.raises(TypeError, match="strict"):
        ours.load_state_dict(full, strict=1)
    model = _tiny_models()["llama"]  # a subclass renaming the checkpoint's names: rotary buffers dropped
    state = model.state_dict()
    got = model.load_state_dict({"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2),
                                 "lm_head.weight": state["lm_head.weight"] * 2}, strict=False)
    assert got.unexpected_keys == [] and "lm_head.weight" not in got.missing_keys
    assert len(got.missing_keys) == len(state) - 1
    np.testing.assert_array_equal(model.state_dict()["lm_head.weight"], state["lm_head.weight"] * 2)


def test_deepcopy_keeps_shared_module_identity_within_one_call():
    """copy.deepcopy((enc, enc.layers[0])) gave a layer that was not the copied stack's (torch's:
    ``a.layers[0] is b``), so loading into it left the copied stack unchanged. Every module under a
    copied one is registered in the call's memo."""
    import copy

    te = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
                                     enable_nested_tensor=False)
    ta, tb = copy.deepcopy((te, te.layers[0]))
    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), 2,
                                   tc.nn.LayerNorm(8, dtype=np.float64))
    a, b, norm = copy.deepcopy((enc, enc.layers[0], enc.norm))
    assert (a.layers[0] is b) == (ta.layers[0] is tb) is True
    assert a.norm is norm and b is not enc.layers[0]
    b.load_state_dict({k: v * 0 for k, v in b.state_dict().items()})
    np.testing.assert_array_equal(a.state_dict()["layers.0.linear1.weight"], 0)
    assert np.abs(enc.state_dict()["layers.0.linear1.weight"]).max() > 0  # the original untouched
    t = tc.nn.Transformer(8, 2, 1, 1, 16, dtype=np.float64)
    c, layer = copy.deepcopy((t, t.decoder.layers[0]))
    assert c.decoder.layers[0] is layer


def _cfg_models():
    bert = tc.BertModel(tc.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=12, max_position_embeddings=8, hidden_dropout_prob=0.1),
                        dtype=np.float64)
    gpt2 = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                            resid_pdrop=0.1, embd_pdrop=0.1), dtype=np.float64)
    llama = tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=20, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                               num_attention_heads=2, max_position_embeddings=8), dtype=np.float64)
    return {"bert": (bert, {"hidden_dropout_prob": 0.0}), "gpt2": (gpt2, {"resid_pdrop": 0.0, "embd_pdrop": 0.0}),
            "llama": (llama, {"rms_norm_eps": 1e-3})}


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_carry_a_replaced_config(kind, how):
    """A config replaced on the model (``m.config = copy.copy(m.config)``, then a field changed)
    came back as the constructor's in a deepcopy / unpickled copy (BERT's hidden_dropout_prob 0.0 set
    on the original, 0.1 in the copies: their training forwards dropped what the original's kept).
    Every attribute carried is restored, non-scalar ones included."""
    import copy
    import dataclasses
    import pickle

    model, changes = _cfg_models()[kind]
    model.config = dataclasses.replace(model.config, **changes)
    dup = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert dup.config == model.config and dup.config is not model.config
    for key, value in changes.items():
        assert getattr(dup.config, key) == value
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    if kind == "bert":  # no dropout now: a training forward is the eval one
        expected = model(ids).last_hidden_state
        dup.train()
        np.testing.assert_array_equal(dup(ids).last_hidden_state, expected)
    elif kind == "gpt2":
        expected = model.loss(ids, ids)
        dup.train()
        assert dup.loss(ids, ids) == expected


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_carry_changed_attributes_of_children(how):
    """The dropout of a stack's layers changed after construction travels with the copy, and its
    training forward is then the original's (no dropout: the eval output)."""
    import copy
    import pickle

    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64, dropout=0.3), 2)
    for layer in enc.layers:
        layer.dropout = 0.0
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    expected = enc(x)
    dup = copy.deepcopy(enc) if how == "deepcopy" else pickle.loads(pickle.dumps(enc))
    assert [layer.dropout for layer in dup.layers] == [0.0, 0.0]
    dup.train()
    np.testing.assert_array_equal(dup(x), expected)


def _built_models():
    """``{kind: (model, its config, {field: a value of the same shapes})}``: float64 GPT-2, Llama, BERT."""
    gpt2_cfg = tc.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=4)
    llama_cfg = tc.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    bert_cfg = tc.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=24, max_position_embeddings=16)
    return {"gpt2": (tc.GPT2LMHeadModel(gpt2_cfg, dtype=np.float64), gpt2_cfg, {"layer_norm_epsilon": 0.5}),
            "llama": (tc.LlamaForCausalLM(llama_cfg, dtype=np.float64), llama_cfg,
                      {"rms_norm_eps": 0.5, "rope_theta": 7.0}),
            "bert": (tc.BertModel(bert_cfg, dtype=np.float64), bert_cfg, {"layer_norm_eps": 0.5})}


def _hidden(model, ids):
    out = model(ids)
    return np.asarray(out.last_hidden_state if hasattr(out, "last_hidden_state") else _logits(out))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle", "quantize"])
def test_copies_compute_as_the_original_after_the_callers_config_changed(kind, how):
    """The module kept its constructor's config BY REFERENCE (``model.config is cfg``) and copies were
    built from it when made: a caller that changed its config object afterwards (a norm's eps, the
    rope base) got a deepcopy / unpickled copy that computed otherwise (max diff 1.3 on Llama), and a
    quantized copy built from the changed config. As torch's deepcopy, the copy computes bit for bit
    as the original (whose computation the change does not touch either); the arguments are a
    snapshot taken when the module is built."""
    import copy
    import pickle

    model, cfg, changes = _built_models()[kind]
    ids = np.array([[1, 5, 7, 3], [2, 9, 4, 0]])
    reference = _hidden(model, ids)
    if how == "quantize":
        model = tc.BertModel(cfg) if kind == "bert" else type(model)(cfg)  # float32: quantize's input
        model.load_state_dict(_built_models()[kind][0].state_dict())
        reference = _hidden(tc.quantize(model), ids)
    for field, value in changes.items():
        setattr(cfg, field, value)
    assert model.config is cfg  # as Hugging Face's: the model's config is the caller's object
    if how == "quantize":
        np.testing.assert_array_equal(_hidden(tc.quantize(model), ids), reference)
        return
    np.testing.assert_array_equal(_hidden(model, ids), reference)
    dup = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(_hidden(dup, ids), reference)
    assert dup.config == model.config and dup.config is not cfg  # the attribute: a copy of the original's
    again = copy.deepcopy(dup)  # a copy of the copy too: its snapshot is the original's
    np.testing.assert_array_equal(_hidden(again, ids), reference)


def test_snapshot_keeps_arrays_by_reference_and_modules_as_recipes():
    """The snapshot deep-copies configs, not the weights a loader passes (BertEmbeddings' ``weights``).
    The modules a stack is built from are kept as what it takes to build them again (class,
    arguments, attributes), not as the modules: their weights are in no copy's snapshot."""
    from transformer_core.module import _Recipe

    bert = _built_models()["bert"][0]
    sd = {k: v for k, v in bert.state_dict().items() if k.startswith("embeddings.")}
    emb = tc.BertEmbeddings(bert.config, np.float64, weights=sd)
    args, kwargs = emb._init_args
    assert kwargs["weights"] is not sd and all(kwargs["weights"][k] is sd[k] for k in sd)
    assert args[0] == bert.config and args[0] is not bert.config
    norm = tc.nn.LayerNorm(8, dtype=np.float64)
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64, dropout=0.25)
    enc = tc.nn.TransformerEncoder(layer, 2, norm)
    recipe, _, norm_recipe = enc._init_args[0]
    assert type(recipe) is _Recipe and recipe.cls is tc.nn.TransformerEncoderLayer
    assert recipe.init_args is layer._init_args and recipe.attributes["dropout"] == 0.25
    assert type(norm_recipe) is _Recipe and norm_recipe.cls is tc.nn.LayerNorm and enc.norm is norm


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "quantize"])
def test_copies_keep_modules_attached_by_the_caller(how):
    """A module attribute holding a module that is not one of its children (torch's
    ``model.classifier = nn.Linear(...)``, a dict of heads) was silently dropped by deepcopy, pickle
    and quantize's copy. As torch's deepcopy: the copy has its own equal head (the same outputs;
    training it leaves the original's alone), a head referred to twice is copied once, and an
    attribute referring to a module under the copied one refers to the copy's. The classifier,
    assigned to an attribute, is a registered child (as torch's): quantize's copy quantizes it with
    the rest, as torch's ``quantize_dynamic`` does; the head in a dict is not one."""
    import copy
    import pickle

    bert = tc.BertModel(tc.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=24, max_position_embeddings=16))
    bert.classifier = tc.nn.Linear(16, 2)
    bert.heads = {"a": bert.classifier, "b": tc.nn.Linear(16, 3)}
    bert.pair = (bert.heads["b"], bert)
    dup = {"deepcopy": copy.deepcopy, "pickle": lambda m: pickle.loads(pickle.dumps(m)), "quantize": tc.quantize}[how](
        bert)
    assert dup.classifier is not bert.classifier and dup.heads["b"] is not bert.heads["b"]
    assert dup.heads["a"] is dup.classifier and dup.pair[0] is dup.heads["b"] and dup.pair[1] is dup
    ids = np.array([[1, 5, 7, 3]])
    h = bert(ids).last_hidden_state
    np.testing.assert_array_equal(dup.heads["b"](h), bert.heads["b"](h))
    if how == "quantize":
        assert dup.weight_formats()["classifier.weight"] == "int8" and "heads" not in dup.weight_formats()
        np.testing.assert_allclose(dup.classifier(h), bert.classifier(h), atol=0.05)
        return
    np.testing.assert_array_equal(dup.heads["a"](h), bert.heads["a"](h))
    for name, value in bert.classifier.state_dict().items():
        np.testing.assert_array_equal(dup.classifier.state_dict()[name], value)
    # torch's: a step on the copy's head leaves the original's unchanged
    ref = torch.nn.Linear(16, 2).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(bert.classifier.state_dict()["weight"]))
        ref.bias.copy_(torch.from_numpy(bert.classifier.state_dict()["bias"]))
    twin = copy.deepcopy(ref)
    before = bert.classifier.state_dict()
    head = dup.classifier.train()
    opt = tc.optim.SGD(head.parameters(), lr=0.5)
    head.backward(np.ones_like(head(h)))
    opt.step()
    twin(torch.from_numpy(h.astype(np.float64))).sum().backward()
    with torch.no_grad():
        for p in twin.parameters():
            p -= 0.5 * p.grad
    for name, value in before.items():
        np.testing.assert_array_equal(bert.classifier.state_dict()[name], value)
        np.testing.assert_allclose(head.state_dict()[name], twin.state_dict()[name].numpy(), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(head.state_dict()["bias"], before["bias"])
    np.testing.assert_array_equal(dup.heads["a"].state_dict()["bias"], head.state_dict()["bias"])


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_keep_attributes_referring_to_modules_under_the_copied_one(how):
    """``enc.first = enc.layers[0]`` refers, in the copy, to the copy's first layer (not dropped, not
    a module of its own)."""
    import copy
    import pickle

    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), 2)
    enc.first = enc.layers[0]
    enc.by_name = {"last": enc.layers[1]}
    dup = copy.deepcopy(enc) if how == "deepcopy" else pickle.loads(pickle.dumps(enc))
    assert dup.first is dup.layers[0] and dup.by_name["last"] is dup.layers[1]
    assert dup.layers is not enc.layers and dup.layers[0] is not enc.layers[0]


def test_quantized_copy_of_a_stack_has_a_norm_of_its_own():
    """quantize's copy of a stack was built from the stack's arguments as they were, its LayerNorm the
    ORIGINAL's object: loading into the copy's norm changed the original. The arguments' modules are
    deep-copied for the copy."""
    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(32, 2, 32), 2, tc.nn.LayerNorm(32))
    x = np.random.default_rng(0).standard_normal((2, 3, 32)).astype(np.float32)
    expected = enc(x)
    q = tc.quantize(enc)
    assert q.norm is not enc.norm and q.norm is q._children()[-1][1]
    q.norm.load_state_dict({"weight": np.full(32, 2.0), "bias": np.zeros(32)})
    np.testing.assert_array_equal(enc(x), expected)
    np.testing.assert_array_equal(enc.norm.state_dict()["weight"], np.ones(32))


def _torch_twin(enc):
    """A torch TransformerEncoder (batch-first, float64, eval) holding ``enc``'s weights."""
    te = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                     len(enc.layers), torch.nn.LayerNorm(8), enable_nested_tensor=False).double()
    te.load_state_dict({k: to_torch(v) for k, v in enc.state_dict().items()})
    return te.eval()


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_keep_identity_at_any_depth_of_the_attributes(how):
    """A child referred to one container deeper (``enc.groups = {"a": [enc.layers[1]]}``) was, in a
    deepcopy or unpickled copy, a second full copy of the layer (writes through it left the copy's
    stack unchanged), and ``enc.meta = {"x": {"owner": enc}}`` referred to another copy of the stack
    (pickle raised a 20,000-character TypeError). As torch's: the copy's own layer and the copy
    itself, and the copy computes as torch's with the same write through ``groups``."""
    import copy
    import pickle

    def dup(m):
        return copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))

    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), 2,
                                   tc.nn.LayerNorm(8, dtype=np.float64))
    te = _torch_twin(enc)
    for m in (enc, te):
        m.groups = {"a": [m.layers[1]]}
        m.meta = {"x": {"owner": m, "norm": (m.norm,)}}
    tc_copy, t_copy = dup(enc), dup(te)
    for c in (tc_copy, t_copy):
        assert c.groups["a"][0] is c.layers[1] and c.meta["x"]["owner"] is c and c.meta["x"]["norm"][0] is c.norm
        assert c.layers[1] is not (enc if c is tc_copy else te).layers[1]
    state = tc_copy.groups["a"][0].state_dict()
    tc_copy.groups["a"][0].load_state_dict({**state, "linear2.weight": state["linear2.weight"] * -2})
    with torch.no_grad():
        t_copy.groups["a"][0].linear2.weight.mul_(-2)
    x = np.random.default_rng(3).standard_normal((2, 5, 8))
    expected = t_copy(to_torch(x)).detach().numpy()
    np.testing.assert_allclose(tc_copy(x), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tc_copy.meta["x"]["owner"](x), expected, rtol=1e-10, atol=1e-12)
    assert np.abs(enc(x) - expected).max() > 1e-3  # the original's layer unchanged
    np.testing.assert_allclose(enc(x), te(to_torch(x)).detach().numpy(), rtol=1e-10, atol=1e-12)


def test_pickle_keeps_a_module_attached_that_refers_back_to_its_owner():
    """``enc.head = Linear``, ``head.backbone = enc``: pickling raised a TypeError of 57,760
    characters (each part was test-pickled on its own, re-entering the owner without pickle's memo).
    As torch's: the unpickled head's ``backbone`` is the unpickled stack, which computes as the
    original; an attribute that truly cannot be pickled is still named in a short TypeError."""
    import pickle
    import threading

    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), 1,
                                   tc.nn.LayerNorm(8, dtype=np.float64))
    te = _torch_twin(enc)
    enc.head = tc.nn.Linear(8, 3, dtype=np.float64)
    enc.head.backbone = enc
    te.head = torch.nn.Linear(8, 3).double()
    te.head.__dict__["backbone"] = te  # a plain attribute (torch's __setattr__ would make it a child)
    t = pickle.loads(pickle.dumps(te))
    c = pickle.loads(pickle.dumps(enc))
    assert (c.head.backbone is c) == (t.head.backbone is t) is True
    assert c.head is not enc.head and c.head.backbone is not enc
    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    np.testing.assert_array_equal(c.head(c.head.backbone(x)), enc.head(enc(x)))
    with torch.no_grad():
        t.head.weight.copy_(to_torch(enc.head.state_dict()["weight"]))
        t.head.bias.copy_(to_torch(enc.head.state_dict()["bias"]))
        np.testing.assert_allclose(c.head(c(x)), t.head(t(to_torch(x))).numpy(), rtol=1e-10, atol=1e-12)
    enc.head.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"TransformerEncoder: cannot be pickled, attribute head\.lock cannot") as err:
        pickle.dumps(enc)
    assert len(str(err.value)) < 300
    del enc.head.lock
    enc.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"TransformerEncoder: cannot be pickled, attribute lock cannot") as err:
        pickle.dumps(enc)
    assert len(str(err.value)) < 300


@pytest.mark.parametrize("how", ["deepcopy", "quantize"])
def test_copies_share_the_arrays_and_template_layer_of_the_arguments(how):
    """quantize's copy deep-copied the arguments it was built from: its snapshot held a second float
    copy of a stack's template layer (12.6 MB for TransformerEncoderLayer(512, 8, 2048)) and of the
    weights a BertEmbeddings was loaded from. The arrays are shared, as the original's snapshot
    shares them; the template is a recipe (no weights) equal to the original's; the copy's norm is
    its own."""
    import copy

    make = copy.deepcopy if how == "deepcopy" else tc.quantize
    layer = tc.nn.TransformerEncoderLayer(32, 2, 32)
    enc = tc.nn.TransformerEncoder(layer, 2, tc.nn.LayerNorm(32))
    x = np.random.default_rng(0).standard_normal((2, 3, 32)).astype(np.float32)
    expected = enc(x)
    q = make(enc)
    assert q._init_args[0][0] == enc._init_args[0][0] and q.norm is not enc.norm
    q.norm.load_state_dict({"weight": np.full(32, 2.0), "bias": np.zeros(32)})
    np.testing.assert_array_equal(enc(x), expected)
    np.testing.assert_array_equal(enc.norm.state_dict()["weight"], np.ones(32))
    bert = tc.BertModel(tc.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=24, max_position_embeddings=16))
    emb = tc.BertEmbeddings.from_model(bert)
    given = emb._init_args[1]["weights"]
    ids = np.array([[1, 5, 7, 3]])
    copied = make(emb)
    held = copied._init_args[1]["weights"]
    assert set(held) == set(given) and all(np.shares_memory(held[k], given[k]) for k in given)
    for name, value in emb.state_dict().items():  # the copy's own weights: equal, not shared
        assert not np.shares_memory(copied.state_dict()[name], value)
    if how == "deepcopy":
        np.testing.assert_array_equal(copied(ids), emb(ids))
    else:
        np.testing.assert_allclose(copied(ids), emb(ids), atol=0.05)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_keep_the_gradients_that_torchs_drop(rng, how):
    """A documented difference from torch (Module.__deepcopy__ / __reduce_ex__, Parameter): torch's
    ``Parameter.__deepcopy__`` and pickles drop ``.grad``, so a copied torch module has every ``grad``
    None; this library's copies keep a copy of each gradient a backward wrote (the others stay None),
    so a copy taken between a backward and the step steps as the original would. ``zero_grad()``
    on the copy gives torch's state and leaves the original's gradients alone."""
    import copy
    import pickle

    dup_of = copy.deepcopy if how == "deepcopy" else (lambda m: pickle.loads(pickle.dumps(m)))
    ref = torch.nn.Linear(6, 4).double()
    ours = tc.nn.Linear(6, 4, dtype=np.float64)
    ours.load_state_dict(module_state_to_numpy(ref))
    x = randn(rng, (3, 6), np.float64)
    ours.train()
    ours(x)
    ours.backward(np.ones((3, 4)))
    ref(to_torch(x)).sum().backward()
    assert all(p.grad is None for p in dup_of(ref).parameters())  # torch's copies drop them
    dup = dup_of(ours)
    for (name, p), q in zip(dup.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    opt, twin = tc.optim.SGD(ours.named_parameters(), lr=0.5), tc.optim.SGD(dup.named_parameters(), lr=0.5)
    opt.step()
    twin.step()
    for name, value in ours.state_dict().items():
        np.testing.assert_array_equal(dup.state_dict()[name], value, err_msg=name)
    dup.zero_grad()
    assert all(p.grad is None for p in dup.parameters()) and ours.gradients().keys() == {"weight", "bias"}
    assert "unlike torch's" in tc.nn.Linear.__deepcopy__.__doc__ and "unlike torch's" in tc.nn.Linear.__reduce_ex__.__doc__
