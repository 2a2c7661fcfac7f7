"""Example (b): your own ``nn.Module``, written the usual way, trained by tdyn as an ensemble.

A one-layer attention block (token embedding, one softmax attention head reading the context from the
last position, a linear decoder) — nothing in it knows about ensembles. ``tdyn.PlainTask`` builds one
copy per seed (each initialised as PyTorch would, from the member's seed), stacks them and runs
forward and loss under ``torch.func.vmap``; learning rates, init scales, freeze rules, checkpoints and
resume work as for tdyn's own models. The data are Scan and Snap's Syn-Small sequences
(``tdyn.papers.scan_snap.data``); a probe records how much of the last position's attention goes to the
class's distinct tokens; a sweep trains three learning rates × two seeds.

    python examples/plain_attention_block.py --out runs/plain          # a few minutes on 2 cores
    python examples/plain_attention_block.py --small --out /tmp/plain
Then read it back: examples/read_results.py --sweep runs/plain
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

import tdyn
from tdyn.papers.scan_snap import data as scan_snap
from tdyn.schema import Strict


class AttentionBlock(nn.Module):
    """Embedding → one attention head from the last position → decoder over the vocabulary."""

    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.q, self.k, self.v = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """The last position's attention over the sequence, [B, L]."""
        e = self.embed(x)                                               # [B, L, d]
        scores = self.k(e) @ self.q(e[:, -1:]).transpose(1, 2)          # [B, L, 1]
        return torch.softmax(scores.squeeze(-1) / math.sqrt(e.shape[-1]), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, vocab]."""
        e = self.embed(x)
        a = self.attention(x)
        return self.out(self.ln((a[..., None] * self.v(e)).sum(1)))


class BlockModel(Strict):
    d: int = Field(32, ge=1)


class SynSmallBlock(tdyn.PlainTask):
    def __init__(self, cfg, members):
        self.data_cfg = scan_snap.ScanSnapDataConfig.model_validate(cfg.data)
        self.dist = scan_snap.build(self.data_cfg)
        self.d = BlockModel.model_validate(cfg.model).d
        self.facts = {"distinct": self.dist.distinct}
        super().__init__(cfg, members)                  # builds one AttentionBlock per member and stacks them

    def make_model(self) -> nn.Module:
        return AttentionBlock(self.dist.M, self.d)

    def sample(self, gen):
        return self.dist.sample(self.data_cfg.batch_size, self.data_cfg.seq_len, gen)

    def member_loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)


@tdyn.register_task("syn_small_block", scan_snap.ScanSnapDataConfig, BlockModel,
                    "a plain attention block (nn.Module) on Scan and Snap's Syn-Small sequences")
def _build(cfg, members):
    return SynSmallBlock(cfg, members)


@tdyn.probe("block.distinct_attention")
def distinct_attention(ctx):
    """Per member: the last position's attention mass on its class's distinct tokens (probe batch)."""
    x, y = ctx.batch                                                     # [S, B, L], [S, B]
    cls = y - ctx.task.dist.next_token[0]                                # next tokens are consecutive ids
    distinct = ctx.task.facts["distinct"][cls]                           # [S, B, M]
    on = distinct.gather(-1, x)                                          # [S, B, L]: token is distinct for its class

    def mass(model, xb, onb):
        return (model.attention(xb) * onb).sum(-1).mean()

    return {"mass": ctx.model.map(mass, x, on.to(torch.get_default_dtype()))}


def config(small: bool) -> dict:
    return {"task": "syn_small_block", "data": {"batch_size": 32 if small else 128, "seq_len": 64},
            "model": {"d": 16 if small else 32}, "seeds": [0, 1],
            "optim": {"steps": 40 if small else 1000,
                      "groups": {"all": {"params": ["embed__weight", "q__weight", "k__weight", "v__weight",
                                                    "ln__weight", "ln__bias", "out__weight", "out__bias"],
                                         "optimizer": "adam", "lr": 1e-3}}},
            "probes": {"names": ["block.distinct_attention"], "every": 10 if small else 50}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="a few steps (CI)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tdyn.plugins.add([__file__])    # sweep workers are fresh processes: they import this file for the task
    spec = {"config": config(args.small), "axes": {"grid": {"optim.groups.all.lr": [3e-4, 1e-3, 3e-3]}},
            "seeds": [0, 1]}
    status = tdyn.sweep(spec, args.out, workers=args.workers, progress=not args.small)
    print(", ".join(f"{k}: {v}" for k, v in sorted(status.items())))
    return status


if __name__ == "__main__":
    main()
