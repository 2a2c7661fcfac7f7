"""Patch a checkout of the authors' code of Bietti et al. 2023 (github.com/albietz/transformer-birth, commit
165e11a) so that ``ihead_basic_main.py`` runs on a CPU, as docs/reproductions/birth.md#authors-code-side-by-side
describes; then ``TDYN_ANCHOR_BIRTH=<checkout> tdyn bench --only birth_authors`` times it against tdyn.

    git clone https://github.com/albietz/transformer-birth /tmp/tb && git -C /tmp/tb checkout 165e11a
    python benchmarks/birth_authors_patch.py /tmp/tb
    pip install --target /tmp/tb-lib omegaconf       # their one dependency beyond torch and numpy, outside tdyn's venv

The three patches, to ``ihead_basic_main.py`` only (idempotent: a patched file is left as it is):

1. every ``.cuda()`` removed (their script moves the model and every tensor to a GPU);
2. ``torch.manual_seed(cfg.seed)`` before the model is built (their initialisation is otherwise unseeded);
3. ``json.dump(dict(cfg), …)`` → ``json.dump(OmegaConf.to_container(cfg), …)`` (newer OmegaConf's nested configs
   are not JSON; only reached with ``save_dir``).

Their data, model and training loop are not otherwise touched; pass ``num_data_workers=1`` on their command line
(their default starts 60 sampling processes). Nothing of their code is committed to tdyn.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAIN = "ihead_basic_main.py"
SEED_AT = "    model = Transformer(cfg.model_args)\n"
SEEDED = "    torch.manual_seed(cfg.seed)\n" + SEED_AT
JSON_OLD = "json.dump(dict(cfg), f"
JSON_NEW = "json.dump(OmegaConf.to_container(cfg), f"


def patch(checkout: str | Path) -> Path:
    """Apply the three patches to ``checkout``'s ``ihead_basic_main.py`` in place; returns its path. Raises
    ``SystemExit`` with one line when the checkout is not the expected code."""
    path = Path(checkout) / MAIN
    if not path.is_file() or not (Path(checkout) / "data" / "meta.pkl").is_file():
        raise SystemExit(f"birth_authors_patch: {checkout} is no checkout of albietz/transformer-birth "
                         f"(no {MAIN} or data/meta.pkl)")
    src = path.read_text(encoding="utf-8")
    if SEED_AT not in src or (JSON_OLD not in src and JSON_NEW not in src):
        raise SystemExit(f"birth_authors_patch: {path} is not the code of commit 165e11a (a patch point is missing)")
    src = src.replace(".cuda()", "")
    if SEEDED not in src:
        src = src.replace(SEED_AT, SEEDED, 1)
    src = src.replace(JSON_OLD, JSON_NEW)
    path.write_text(src, encoding="utf-8")
    return path


def is_patched(checkout: str | Path) -> bool:
    """Whether ``checkout``'s main script carries the three patches."""
    path = Path(checkout) / MAIN
    src = path.read_text(encoding="utf-8") if path.is_file() else ""
    return bool(src) and ".cuda()" not in src and SEEDED in src and JSON_OLD not in src


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/birth_authors_patch.py CHECKOUT")
    print("patched", patch(sys.argv[1]))
