"""Example (a): a new synthetic distribution trained with one of the papers' models.

Scan and Snap's classes (Tian et al. 2023 §3.2) each own their *distinct* tokens. Here neighbouring
classes share some of them: class k's block of distinct tokens overlaps class k+1's by ``shared`` tokens.
Does the attention of the paper's Y/Z model still concentrate on each class's truly distinct tokens
(the ones no other class uses), or do the shared ones take part of it? The task reuses tdyn's Y/Z
model, loss and probes unchanged: only the distribution is new (``build_distribution``).

    python examples/shared_distinct_tokens.py --out runs/shared        # ~1 min on one core
    python examples/shared_distinct_tokens.py --small --out /tmp/shared
"""

from __future__ import annotations

import argparse

import torch
from pydantic import Field, model_validator

import tdyn
from tdyn.papers.scan_snap.data import SequenceClasses
from tdyn.errors import ConfigError
from tdyn.papers.scan_snap.model import YZConfig
from tdyn.papers.scan_snap.probes import c_n
from tdyn.schema import Strict
from tdyn.papers.scan_snap.task import ScanSnapTask, yz_config


class SharedDistinctData(Strict):
    """K classes, one query each; ``distinct_per_class`` distinct tokens per class of which the last
    ``shared`` also belong to the next class; ``num_common`` global common tokens."""

    num_classes: int = Field(4, ge=2)
    num_common: int = Field(10, ge=0)
    distinct_per_class: int = Field(10, ge=1)
    shared: int = Field(4, ge=0)
    seq_len: int = Field(128, ge=2)
    batch_size: int = Field(128, ge=1)

    @model_validator(mode="after")
    def _check(self):
        """A bad value is checked here, with the config: one line, exit 2 (docs/library.md)."""
        if self.shared >= self.distinct_per_class:
            raise ConfigError(f"data.shared = {self.shared}: must be below data.distinct_per_class = "
                              f"{self.distinct_per_class}")
        return self


def build_distribution(cfg: SharedDistinctData) -> SequenceClasses:
    """Token ids: commons, then the overlapping distinct blocks, then K query ids, then K next tokens."""
    K, D, o = cfg.num_classes, cfg.distinct_per_class, cfg.shared
    step = D - o                                     # block k starts here: it overlaps block k+1 by o tokens
    off_q = cfg.num_common + step * (K - 1) + D
    M = off_q + 2 * K
    weights = torch.zeros(K, M, dtype=torch.float64)
    weights[:, :cfg.num_common] = 1.0
    for k in range(K):
        a = cfg.num_common + k * step
        weights[k, a:a + D] = torch.linspace(0.1, 1.0, D, dtype=torch.float64)
    table = weights / weights.sum(1, keepdim=True)
    in_support = table > 0
    only_k = in_support & (in_support.sum(0) == 1)   # tokens no other class uses
    only_k[:, off_q:] = False
    return SequenceClasses(M=M, K=K, table=table, query=off_q + torch.arange(K),
                           next_token=off_q + K + torch.arange(K), group=torch.arange(K), distinct=only_k,
                           common=in_support.sum(0) > 1, num_contextual=off_q)


class SharedDistinctTask(ScanSnapTask):
    data_config = SharedDistinctData

    def build_distribution(self, data_cfg):
        return build_distribution(data_cfg)


@tdyn.register_task("shared_distinct", SharedDistinctData, YZConfig,
                    "Scan and Snap's Y/Z model on classes that share part of their distinct tokens")
def _build(cfg, members):
    return SharedDistinctTask(cfg, members)


def attention_split(run: tdyn.Run) -> dict[str, float]:
    """Class-averaged attention c_{l|n} (Eqn 5, long-sequence limit) on the truly distinct tokens, the
    shared ones and the global commons, from the run's final Z."""
    task = run.task()
    d = task.dist
    Z = run.param("Z").double()
    c = c_n(Z[None], d.table, d.query)[0]                       # [K, M]
    shared = d.common.clone()
    shared[:task.data_cfg.num_common] = False
    return {"distinct": float((c * d.distinct).sum(1).mean()), "shared": float((c * shared).sum(1).mean()),
            "commons": float(c[:, :task.data_cfg.num_common].sum(1).mean())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="a few steps (CI)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = yz_config({}, steps=30 if args.small else 600, lr_y=1.0, lr_z=1.0, seeds=(0, 1))
    cfg["task"] = "shared_distinct"
    cfg["data"] = {"shared": 4, "batch_size": 32 if args.small else 128}
    cfg["probes"] = {"names": ["scan_snap.attention"], "every": 10 if args.small else 50}
    dirs = tdyn.train(cfg, args.out, force=True, progress=not args.small)
    out = {}
    for d in dirs:
        run = tdyn.load_run(d)
        split = attention_split(run)
        ent = run.df["scan_snap.attention/entropy"]
        out[d.name] = split | {"entropy_first": float(ent[0]), "entropy_last": float(ent[len(ent) - 1])}
        print(f"{d.name}: attention on distinct {split['distinct']:.3f}, shared {split['shared']:.3f}, "
              f"commons {split['commons']:.3f}; distinct-token entropy {out[d.name]['entropy_first']:.3f} → "
              f"{out[d.name]['entropy_last']:.3f}")
    return out


if __name__ == "__main__":
    main()
