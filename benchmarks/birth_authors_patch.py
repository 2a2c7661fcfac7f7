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

``--heldout-triggers`` adds a fourth patch, a new option ``data_args.trigger_pool`` (default ``None``: their code
runs as before) for the side-by-side run of tdyn's ``birth/heldout-triggers`` (docs/reproductions/birth.md#authors-
code-side-by-side), with tdyn's definitions:

* ``ihead_data.py``: with ``trigger_pool=train`` (and ``fixed_special_toks=False``) each sequence's K triggers are
  drawn ∝ π_u without replacement (their ``rng.choice(..., p=marginal, replace=False)``) from the first
  ⌊0.75 N⌋ = 48 tokens only, with ``test`` from the other 17 — their ``train_test`` output split applied to the
  triggers, tdyn's ``data.triggers``; outputs and the chain are theirs, unchanged;
* ``ihead_basic_main.py``: with ``trigger_pool=train`` their test batch (512 sequences, ``default_rng(0)``) has
  training-pool triggers (the seen set) and a second batch of 512 (``default_rng(1)``) has held-out-pool triggers;
  at every evaluation it logs one line ``heldout triggers: {json}`` (and adds the keys to ``res.jsonl``):
  ``acc_seen`` / ``acc_heldout``, the top-1 accuracy at occ ≥ 2 (their ``acc_end_test``; tdyn's ``acc_out`` /
  ``acc_out_tood``), ``attn2_seen`` / ``attn2_heldout``, the fraction of occ ≥ 2 positions whose layer-2 attention
  peaks on a position s ≥ 1 with z_{s−1} = z_t (their ``score2_acc``; tdyn's ``attn2_ind`` / ``attn2_ind_tood``),
  and ``wk1_seen`` / ``wk1_heldout``, their ``test_wk1`` restricted to the 48 / 17 tokens of each pool (argmax among
  the pool; tdyn's ``recall_W_K2`` / ``recall_W_K2_ood``).
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


# ---------------------------------------------------------------- the fourth patch: held-out triggers
DATA = "ihead_data.py"
TAG = "# tdyn patch: held-out triggers"
#: (file, anchor, the anchor's replacement): each anchor must occur exactly once in the file at 165e11a, and every
#: replacement keeps its anchor (insertions: their code is only added to, never changed)
POOL_DRAW = f"""    def pool_triggers(self, rng: np.random.Generator):  {TAG}
        # the K triggers drawn without replacement, prop. to the unigram law restricted to the pool: the first
        # int(0.75 N) tokens ('train') or the others ('test'), their train_test output split applied to triggers
        n_train = int(0.75 * self.num_tokens)
        pool = self.tok_range[:n_train] if self.trigger_pool == 'train' else self.tok_range[n_train:]
        p = self.marginal[pool] / self.marginal[pool].sum()
        return list(rng.choice(pool, p=p, size=self.k, replace=False))

"""
DECODE = "        return ''.join(self.itos[idx] for idx in idxs)\n\n"
THEIR_DRAW = ("        else:\n"
              "            idxs = list(rng.choice(self.tok_range, p=self.marginal, size=self.k, replace=False))\n")
WK1_END = ("        return ((toksq @ toksk.t()).argmax(-1) == range_toks[:wk1_range_toks.shape[0]]).float().mean()"
           ".item()\n")
ACC_TEST = ("                acc_end_test = (pred_t[:,-el:].argmax(-1)[outs_t[:,-el:] >= 2] == "
            "y_t[:,-el:][outs_t[:,-el:] >= 2]).float().mean().item()\n")
SAVE = ("                if cfg.save_dir is not None:\n"
        "                    print(json.dumps(curr_res), file=outfile, flush=True)\n")
INSERTS = [
    (DATA, "    no_repeat: bool = False\n", "    no_repeat: bool = False\n"
     f"    trigger_pool: Optional[str] = None  {TAG}: None (theirs), 'train' or 'test'\n"),
    (DATA, "        self.bigram_outs = bigram_outs\n", "        self.bigram_outs = bigram_outs\n"
     f"        self.trigger_pool = args.trigger_pool  {TAG}\n"
     "        if self.trigger_pool is not None and (self.trigger_pool not in ('train', 'test') or "
     "args.fixed_special_toks):\n"
     "            raise ValueError(f'trigger_pool={self.trigger_pool!r}: train or test, with fixed_special_toks=False')\n"),
    (DATA, DECODE, DECODE + POOL_DRAW),
    (DATA, THEIR_DRAW, f"        elif self.trigger_pool is not None:  {TAG}: the pool's draw\n"
                       "            idxs = self.pool_triggers(rng)\n" + THEIR_DRAW),
    (MAIN, "    ds_test.idxs = ds.idxs\n", "    ds_test.idxs = ds.idxs\n"
     f"    ds_tood = None  {TAG}: a test set whose triggers come from the held-out pool\n"
     "    if cfg.data_args.trigger_pool == 'train':\n"
     "        ds_tood = Dataset(OmegaConf.merge(cfg.data_args, {'trigger_pool': 'test'}), train_test=None,\n"
     "                          bigram_outs=cfg.bigram_outs_test)\n"),
    (MAIN, WK1_END, WK1_END +
     f"\n    def test_wk1_pool(lo, hi):  {TAG}: test_wk1 over the tokens lo .. hi - 1 only\n"
     "        toks = full_range_toks[lo:hi]\n"
     "        toksk = model.layers[1].attention.wk(model.layers[0].attention.wo(model.layers[0].attention.wv(\n"
     "            model.tok_embeddings(toks))))\n"
     "        toksq = model.layers[1].attention.wq(model.tok_embeddings(toks))\n"
     "        return ((toksq @ toksk.t()).argmax(-1) == torch.arange(hi - lo)).float().mean().item()\n"),
    (MAIN, "    outs_t = torch.from_numpy(out_test[:,:ds.seq_length])\n",
     "    outs_t = torch.from_numpy(out_test[:,:ds.seq_length])\n"
     f"    if ds_tood is not None:  {TAG}: 512 sequences, rng 1\n"
     "        x_tood, out_tood = ds_tood.gen_batch(np.random.default_rng(1), 512)\n"
     "        x_tood, y_tood, outs_tood = (torch.from_numpy(x_tood[:,:ds.seq_length]),\n"
     "                                     torch.from_numpy(x_tood[:,1:ds.seq_length + 1]),\n"
     "                                     torch.from_numpy(out_tood[:,:ds.seq_length]))\n"),
    (MAIN, ACC_TEST, ACC_TEST +
     f"                if ds_tood is not None:  {TAG}: seen (their test batch) / held-out\n"
     "                    tood = {}\n"
     "                    for split, (xx, yy, oo) in (('seen', (x_t, y_t, outs_t)), ('heldout', (x_tood, y_tood, outs_tood))):\n"
     "                        with torch.no_grad():\n"
     "                            pp = model(xx) if split == 'heldout' else pred_t  # attn_scores2: this batch's\n"
     "                        j1, j2 = torch.where(oo >= 2)\n"
     "                        tood['acc_' + split] = (pp[j1, j2].argmax(-1) == yy[j1, j2]).float().mean().item()\n"
     "                        a2 = attn_scores2.squeeze(1)[j1, j2, :].argmax(-1)\n"
     "                        tood['attn2_' + split] = ((a2 >= 1) & (xx[j1, (a2 - 1).clamp(min=0)] == xx[j1, j2])"
     ").float().mean().item()\n"
     "                    n_train = int(0.75 * ds.num_tokens)\n"
     "                    tood['wk1_seen'], tood['wk1_heldout'] = test_wk1_pool(0, n_train), "
     "test_wk1_pool(n_train, ds.num_tokens)\n"
     "                    logging.info('heldout triggers: ' + json.dumps(tood))\n"),
    (MAIN, SAVE, f"                if ds_tood is not None:  {TAG}: the keys join the saved line\n"
                 "                    curr_res.update(tood)\n" + SAVE),
]


def patch_heldout_triggers(checkout: str | Path) -> list[Path]:
    """Apply the fourth patch (the module docstring) to ``checkout``'s ``ihead_data.py`` and ``ihead_basic_main.py``
    in place (after :func:`patch`); returns their paths. Idempotent; raises ``SystemExit`` with one line when an
    anchor is missing or not unique (the authors' files changed) and leaves both files untouched then."""
    root = Path(checkout)
    if not is_patched(root):
        raise SystemExit(f"birth_authors_patch: {root} lacks the three patches (patch() first)")
    texts = {}
    for name in (DATA, MAIN):
        path = root / name
        if not path.is_file():
            raise SystemExit(f"birth_authors_patch: {path} is missing (no checkout of albietz/transformer-birth)")
        texts[name] = path.read_text(encoding="utf-8")
    if all(TAG in t for t in texts.values()):
        return [root / DATA, root / MAIN]
    if any(TAG in t for t in texts.values()):
        raise SystemExit(f"birth_authors_patch: {root} carries half of the held-out-trigger patch")
    for name, anchor, new in INSERTS:
        if texts[name].count(anchor) != 1:
            raise SystemExit(f"birth_authors_patch: {root / name} is not the code of commit 165e11a (the anchor "
                             f"{anchor.strip()[:60]!r} occurs {texts[name].count(anchor)} times, not once)")
        texts[name] = texts[name].replace(anchor, new, 1)
    for name in (DATA, MAIN):
        (root / name).write_text(texts[name], encoding="utf-8")
    return [root / DATA, root / MAIN]


def has_heldout_triggers(checkout: str | Path) -> bool:
    """Whether ``checkout`` carries the fourth patch in both files."""
    root = Path(checkout)
    return all((root / n).is_file() and TAG in (root / n).read_text(encoding="utf-8") for n in (DATA, MAIN))


if __name__ == "__main__":
    args = sys.argv[1:]
    held = "--heldout-triggers" in args
    args = [a for a in args if a != "--heldout-triggers"]
    if len(args) != 1:
        raise SystemExit("usage: python benchmarks/birth_authors_patch.py CHECKOUT [--heldout-triggers]")
    print("patched", patch(args[0]))
    if held:
        print("patched (held-out triggers)", *patch_heldout_triggers(args[0]))
