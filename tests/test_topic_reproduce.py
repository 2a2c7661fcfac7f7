"""The topic reproductions run from the CLI in quick mode, write the outputs the issue names, and give
the verdicts that are stable at quick settings.

"Stable" = the same verdict at --seed 0, 1, 2 and 3 (quick settings, checked when the tests were written).
A claim whose verdict changed with the seed is checked only to be decided or inconclusive with a reason,
or, where it took two verdicts only, to be one of them (e.g. never "holds")."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _reproduce(name, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "tdyn", "reproduce", name, "--quick", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "results.json").read_text())


def _verdicts(res):
    return {c["id"]: c["verdict"] for c in res["claims"]}


def _check_claims(res, stable):
    """Every claim is decided or inconclusive with a reason, and has its paper anchor and definition; the
    claims in ``stable`` have that verdict (a set: one of those)."""
    for c in res["claims"]:
        assert c["verdict"] in ("holds", "fails", "inconclusive"), c
        assert c["verdict"] != "inconclusive" or c.get("reason"), c["id"]
        assert c.get("paper") and c.get("definition"), c["id"]
    got = _verdicts(res)
    assert set(stable) <= set(got), set(stable) - set(got)
    bad = {k: got[k] for k, v in stable.items() if got[k] not in ({v} if isinstance(v, str) else v)}
    assert not bad, bad


@pytest.mark.slow
def test_stage1_quick(tmp_path):
    res = _reproduce("topic/stage1", tmp_path)
    assert {"dev_loss", "convex_optimum_dev_loss", "wv_block_contrast_per_topic", "claims", "setting",
            "train_vs_fitted_minimum", "dev_vs_heldout", "r2_over_training", "l2_run"} <= set(res)
    assert res["setting"]["preset"] == "clean"
    assert len(res["wv_block_contrast_per_topic"][0]) == 10 and len(res["l2_run"]["block_contrast_per_topic"][0]) == 10
    h = res["dev_vs_heldout"]
    # the dev-fit floor is the class's minimum dev loss: below the model and every fit (the unregularised
    # fit's held-out loss, the old "convex optimum", is no bound: it overfits)
    assert h["dev_fit_floor"] <= min(res["dev_loss"], h["l2_tuned"]["dev_loss"], h["unregularised_fit_dev_loss"])
    assert h["l2_tuned"]["dev_loss"] <= h["unregularised_fit_dev_loss"]
    assert min(res["train_vs_fitted_minimum"]["difference"]) >= -1e-3      # the fitted minimum bounds train loss
    assert all(len(t) > 5 for t in res["r2_over_training"].values())
    # verdicts at quick settings (300 steps, 2000 documents: undertrained, far from the class's optimum; one
    # seed: the seed-noise comparison of e2-convex has no band, so it is inconclusive, issue 32)
    assert _verdicts(res) == {"e2-train-bound": "fails", "e2-convex": "inconclusive", "e2-blocks": "holds",
                              "e2-blocks-l2": "holds", "e2-form": "inconclusive",
                              "e2-form-unregularised": "inconclusive"}
    assert all(c.get("paper") and c.get("definition") for c in res["claims"])
    assert {c["id"]: c["source"] for c in res["claims"]}["e2-blocks"] == "paper"
    assert "single-seed rule" in {c["id"]: c for c in res["claims"]}["e2-convex"]["reason"]
    for f in res["files"]:
        assert (tmp_path / f).stat().st_size > 0


@pytest.mark.slow
def test_stage1_authors_preset_quick(tmp_path):
    out = tmp_path / "a"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "tdyn", "reproduce", "topic/stage1", "--quick", "--out", str(out),
                        "--quiet", "--preset", "authors"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["setting"]["preset"] == "authors" and res["setting"]["analysed_state"] == "best-dev checkpoint"
    assert res["config"]["model"]["emb_layernorm"] is True
    assert all(row["best_dev_step"] in (1, 101, 201, 301, 401) for row in res["runs"])
    v = _verdicts(res)
    assert v["e2-blocks"] == "holds" and v["e2-form-unregularised"] == "inconclusive"


@pytest.mark.slow
def test_two_stage_quick(tmp_path):
    res = _reproduce("topic/two-stage", tmp_path)
    assert {"grid", "init_scale_effect", "adam_init_scale_note", "claims", "runs"} <= set(res)
    clean = {("clean", o, lr, e) for o, lrs in (("adam", (0.001, 0.01)), ("sgd", (1.0, 10.0))) for lr in lrs
             for e in (0.001, 0.01)}
    authors = {("authors", "adam", lr, 0.001) for lr in (0.001, 0.01)}
    assert {(c["param"], c["optimizer"], c["lr"], c["eps"]) for c in res["grid"]} == clean | authors
    assert len(res["claims"]) == 2 * len(clean | authors)                 # literal and order per cell
    for c in res["claims"]:                                     # one seed: no noise band, or stage 2 not reached
        assert c["verdict"] == "inconclusive" and c["source"] == "paper" and c["quote"] and c["definition"]
        assert "not in any text reachable offline" in c["definition"]
        assert len(c["readings"]) == (2 if c["id"].endswith("-literal") else 6)
    for f in ("two_stage.png", "two_stage_grid.csv", "two_stage.csv", "two_stage_matrices.png"):
        assert (tmp_path / f).stat().st_size > 0


def test_embeddings_quick(tmp_path):
    res = _reproduce("topic/embeddings", tmp_path)
    _check_claims(res, {"e1-blocks": "holds"})
    assert all(r["d"] < 104 and r["decoder"] == "trained" for r in res["runs"])
    assert all(r["gram_vs_logit_rel_diff"] > 0.1 for r in res["runs"])
    for f in res["files"]:
        assert (tmp_path / f).stat().st_size > 0


def test_stage2_quick(tmp_path):
    res = _reproduce("topic/stage2", tmp_path)
    _check_claims(res, {"e3-attention": "holds", "e3-kq-blocks": "holds"})
    assert set(_verdicts(res)) == {"e3-attention", "e3-kq-blocks"}
    assert len(res["kappa_per_topic"][0]) == 10


def test_no_unchanged_mask_quick(tmp_path):
    res = _reproduce("topic/no-unchanged-mask", tmp_path)
    # one seed at quick settings: no seed noise band, so inconclusive (issue 32; it held on a made-up band before)
    _check_claims(res, {"pc0-vanishes": "inconclusive"})
    (c,) = res["claims"]
    assert c["source"] == "derived" and "single-seed rule" in c["reason"]
    assert c["numbers"]["gap_pc_01"] > 0.1 and abs(c["numbers"]["gap_pc_0"]) <= 0.25 * c["numbers"]["gap_pc_01"]


NOT_HOLDS = {"fails", "inconclusive"}


@pytest.mark.slow
def test_robustness_quick(tmp_path):
    res = _reproduce("topic/robustness", tmp_path)
    variants = ["adam lr 0.01 (E4)", "adam lr 0.001", "sgd lr 1", "sgd lr 10", "2 heads", "2 layers",
                "bert block (default init, trained decoder)", "dynamic masking, selected keys visible",
                "embedding LayerNorm + token type"]
    ids = {f"e5-{v}-{k}" for v in variants for k in ("value-blocks", "value-blocks-stage1", "two-stage-literal",
                                                      "two-stage-order")}
    ids |= {f"e5-{v}-attention" for v in variants if v != "2 layers"}
    ids |= {"e5-2 layers-attention-layer0", "e5-2 layers-attention-layer1"}      # attention on every layer
    assert set(_verdicts(res)) == ids
    # the value block on each architecture's value path (W_V⁽²⁾W_V⁽¹⁾, W_dec W_O W_V, the effective map)
    stable = {f"e5-{v}-value-blocks": "holds" for v in variants if v not in ("2 layers", variants[6])}
    stable |= {f"e5-{v}-two-stage-literal": "inconclusive" for v in variants}     # one seed: no noise band
    stable |= {"e5-2 layers-attention-layer0": NOT_HOLDS, f"e5-{variants[6]}-attention": "holds",
               "e5-sgd lr 1-attention": "inconclusive", "e5-sgd lr 10-attention": "inconclusive"}
    _check_claims(res, stable)
    sources = {c["id"]: c["source"] for c in res["claims"]}
    assert {sources[f"e5-{v}-value-blocks"] for v in variants[:4]} == {"paper"}
    assert {sources[f"e5-{v}-value-blocks"] for v in variants[4:]} == {"derived"}
    assert "run too short to reach stage 2" in {c["id"]: c for c in res["claims"]}["e5-sgd lr 1-attention"]["reason"]
    # two layers, the BERT block: the probes' layer-0 value contrast is no reading of their value path
    for v in ("2 layers", variants[6]):
        order = {c["id"]: c for c in res["claims"]}[f"e5-{v}-two-stage-order"]
        assert {r["verdict"] for r in order["readings"] if not r["name"].startswith("probe loss")} == {"not applicable"}
    for f in res["files"]:
        assert (tmp_path / f).stat().st_size > 0


def test_squared_loss_quick(tmp_path):
    res = _reproduce("topic/squared-loss", tmp_path)
    stable = {f"e6-{e} {loss}-value-blocks": "holds" for e in ("E2", "E4") for loss in ("ce", "squared")}
    stable |= {"e6-E4 squared-attention": "holds", "e6-E4 ce-attention": {"holds", "inconclusive"},
               "e6-E4 ce-two-stage-literal": "inconclusive", "e6-E4 squared-two-stage-literal": "inconclusive",
               "e6-E4 ce-two-stage-order": {"holds", "fails", "inconclusive"},
               "e6-E4 squared-two-stage-order": {"holds", "fails", "inconclusive"},
               "e6-E4 ce-value-blocks-stage1": {"holds", "inconclusive"},
               "e6-E4 squared-value-blocks-stage1": {"holds", "inconclusive"}}
    _check_claims(res, stable)
    assert set(_verdicts(res)) == set(stable)
    sources = {c["id"]: c["source"] for c in res["claims"]}
    assert sources["e6-E2 ce-value-blocks"] == "paper" and sources["e6-E2 squared-value-blocks"] == "derived"
    for f in res["files"]:
        assert (tmp_path / f).stat().st_size > 0
