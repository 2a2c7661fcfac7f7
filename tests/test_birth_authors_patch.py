"""The fourth patch of benchmarks/birth_authors_patch.py (held-out triggers in the authors' code of Bietti et al.
2023; docs/reproductions/birth.md#authors-code-side-by-side): it applies to its anchors only, once, adding lines
and changing none; it fails loudly, leaving the files alone, when their code is not the expected one; its trigger
draw keeps the two pools disjoint and has tdyn's law (π_u restricted to the pool, without replacement). The last
test runs their real sampler and needs a checkout (``TDYN_ANCHOR_BIRTH``); the others use stand-ins."""

import difflib
import importlib.util
import os
import shutil
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tdyn.papers.birth import data as bd

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bp():
    return _load(ROOT / "benchmarks" / "birth_authors_patch.py", "birth_authors_patch")


def _stand_in(bp, root: Path) -> dict[str, str]:
    """A checkout whose two files hold every anchor once, in order, amid filler lines (the main one after the
    three patches)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "meta.pkl").write_bytes(b"")
    files = {bp.DATA: "", bp.MAIN: "x = 1\n" + bp.SEEDED + "    json.dump(OmegaConf.to_container(cfg), f)\n"}
    for i, (name, anchor, _) in enumerate(bp.INSERTS):
        files[name] += f"filler_{i} = {i}\n" + anchor
    for name, text in files.items():
        (root / name).write_text(text + "end = 0\n")
    return {name: (root / name).read_text() for name in files}


def test_the_heldout_trigger_patch_only_adds_lines_once(bp, tmp_path):
    before = _stand_in(bp, tmp_path)
    assert bp.is_patched(tmp_path) and not bp.has_heldout_triggers(tmp_path)
    bp.patch_heldout_triggers(tmp_path)
    after = {name: (tmp_path / name).read_text() for name in before}
    assert bp.has_heldout_triggers(tmp_path)
    for name in before:
        diff = list(difflib.ndiff(before[name].splitlines(), after[name].splitlines()))
        assert not [d for d in diff if d.startswith("- ")], name               # none of their lines changed
        added = [d[2:] for d in diff if d.startswith("+ ")]
        assert added and sum(bp.TAG in line for line in added) >= 1, name
    for name, anchor, new in bp.INSERTS:
        assert after[name].count(new) == 1 and anchor in new
    bp.patch_heldout_triggers(tmp_path)                                        # idempotent
    assert {name: (tmp_path / name).read_text() for name in before} == after


def test_the_heldout_trigger_patch_refuses_other_code_and_leaves_it_alone(bp, tmp_path):
    before = _stand_in(bp, tmp_path)
    # their sampler's draw changed: one anchor missing
    (tmp_path / bp.DATA).write_text(before[bp.DATA].replace(bp.THEIR_DRAW, "        else:\n            idxs = []\n"))
    with pytest.raises(SystemExit, match=r"ihead_data\.py is not the code of commit 165e11a"):
        bp.patch_heldout_triggers(tmp_path)
    assert not bp.has_heldout_triggers(tmp_path)
    assert (tmp_path / bp.MAIN).read_text() == before[bp.MAIN]                 # nothing written
    # an anchor twice
    (tmp_path / bp.DATA).write_text(before[bp.DATA] + bp.DECODE)
    with pytest.raises(SystemExit, match="occurs 2 times"):
        bp.patch_heldout_triggers(tmp_path)
    # the three patches first
    (tmp_path / bp.DATA).write_text(before[bp.DATA])
    (tmp_path / bp.MAIN).write_text(before[bp.MAIN].replace(bp.SEEDED, bp.SEED_AT))
    with pytest.raises(SystemExit, match="lacks the three patches"):
        bp.patch_heldout_triggers(tmp_path)
    # half a patch
    (tmp_path / bp.MAIN).write_text(before[bp.MAIN])
    (tmp_path / bp.DATA).write_text(before[bp.DATA] + bp.TAG + "\n")
    with pytest.raises(SystemExit, match="half"):
        bp.patch_heldout_triggers(tmp_path)


def _pool_triggers(bp):
    ns = {"np": np}
    exec(textwrap.dedent(bp.POOL_DRAW), ns)
    return ns["pool_triggers"]


def test_the_patched_trigger_draw_keeps_the_pools_apart_with_tdyns_law(bp):
    """20 000 draws of K = 5 triggers per pool by the patch's draw (numpy's successive draws without replacement)
    against tdyn's sampler (Gumbel top-K on the pool): every trigger in its pool, K distinct, the pools' split the
    one tdyn uses (48 | 17 of tiny Shakespeare's 65; the rarest characters may go undrawn), and each token's
    inclusion frequency equal within 5 standard errors of the difference of two independent frequencies (a
    uniform draw on the pool would miss by ≫ that)."""
    draw = _pool_triggers(bp)
    tb = bd.tables(bd.BirthData())
    N, K, n = tb.N, 5, 20_000
    seen = {}
    for pool in ("train", "test"):
        ds = types.SimpleNamespace(num_tokens=N, tok_range=list(np.arange(N)), marginal=tb.unigram.numpy(),
                                   trigger_pool=pool, k=K)
        rng = np.random.default_rng(0)
        q = np.array([draw(ds, rng) for _ in range(n)])
        lo, hi = bd.output_pool(N, pool)
        assert q.min() >= lo and q.max() < hi
        assert all(len(set(row)) == K for row in q[:500])
        ours = np.bincount(q.ravel(), minlength=N) / n
        g = torch.Generator().manual_seed(1)
        tq = bd.sample(n, 1, tb, K, g, fixed_triggers=False, triggers=pool)["q"].numpy()
        theirs = np.bincount(tq.ravel(), minlength=N) / n
        pbar = (ours + theirs) / 2
        tol = 5 * np.sqrt(2 * pbar * (1 - pbar) / n) + 1e-12
        assert (np.abs(ours - theirs) <= tol).all(), np.abs(ours - theirs).max()
        seen[pool] = set(np.flatnonzero(ours))
    assert seen["train"].isdisjoint(seen["test"])
    assert max(seen["train"]) < bd.output_pool(N, "train")[1] == 48 <= min(seen["test"])


@pytest.mark.skipif(not os.environ.get("TDYN_ANCHOR_BIRTH"), reason="TDYN_ANCHOR_BIRTH names no checkout of the "
                                                                     "authors' code")
def test_their_patched_sampler_draws_triggers_from_the_pool_only(bp, tmp_path, monkeypatch):
    """Their own ``Dataset.gen_batch``, patched: 64 sequences of T = 128 per pool; every position their counter
    marks as a trigger (occ ≥ 1) holds a token of the pool; held-out tokens still occur as ordinary tokens in
    training sequences; with the option left at None the batch is the unpatched file's, draw for draw."""
    src = Path(os.environ["TDYN_ANCHOR_BIRTH"])
    for name in (bp.MAIN, bp.DATA, "ihead_basic_model.py", "data/meta.pkl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / name, tmp_path / name)
    pristine = bp.TAG not in (src / bp.DATA).read_text()
    bp.patch(tmp_path)
    bp.patch_heldout_triggers(tmp_path)
    monkeypatch.chdir(tmp_path)                                                # they open data/meta.pkl
    new = _load(tmp_path / bp.DATA, "ihead_data_patched")
    n_train = int(0.75 * 65)
    for pool, (lo, hi) in (("train", (0, n_train)), ("test", (n_train, 65))):
        ds = new.Dataset(new.DataArgs(k=5, seq_length=128, trigger_pool=pool))
        x, outs = ds.gen_batch(np.random.default_rng(3), 64)
        trig = x[outs >= 1]
        assert trig.size > 64 and trig.min() >= lo and trig.max() < hi, pool
        if pool == "train":
            assert (x[outs == 0] >= n_train).any()                             # held-out tokens, as ordinary ones
    with pytest.raises(ValueError, match="fixed_special_toks"):
        new.Dataset(new.DataArgs(k=5, fixed_special_toks=True, trigger_pool="train"))
    if pristine:
        old = _load(src / bp.DATA, "ihead_data_original")
        a = old.Dataset(old.DataArgs(k=5, seq_length=64)).gen_batch(np.random.default_rng(4), 16)
        b = new.Dataset(new.DataArgs(k=5, seq_length=64)).gen_batch(np.random.default_rng(4), 16)
        assert all((u == v).all() for u, v in zip(a, b))
