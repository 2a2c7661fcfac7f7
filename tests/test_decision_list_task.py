"""The decision_list trainer task: population-loss GD through `train` equals a hand-written GD loop."""

import math

import pytest
import torch

from tdyn import runs
from tdyn.data import decision_list as dl
from tdyn.models.decision_list import DecisionListModel, DecisionListModelConfig
from tdyn.theory import decision_list as th
from tdyn.train.seeding import generator
from tdyn.train.trainer import train


def test_trainer_runs_exact_population_gd(tmp_path):
    L, M, n, lr, steps = 6, 2, 3, 0.5, 10
    cfg = {"task": "decision_list", "data": {"L": L, "M": M, "n": n, "sampler": "B"},
           "model": {"init_std": 0.1, "c": 2.0}, "seeds": [0],
           "optim": {"steps": steps, "groups": {"all": {"params": ["W", "V"], "optimizer": "sgd", "lr": lr,
                                                        "momentum": 0.0}}},
           "checkpoint": {"schedule": "none", "steps": []}, "dtype": "float64"}
    d = train(cfg, tmp_path / "r", progress=False)[0]
    final = runs.params_of(runs.load_checkpoint(d, "final"))

    task = dl.make_task(L, M, 0)
    types = th.enumerate_types(task, n, "B")
    model = DecisionListModel(DecisionListModelConfig(L))
    g = generator(0, "init")
    with torch.no_grad():
        model.W[0] = 0.1 * torch.randn(L, L, generator=g, dtype=torch.float64)
        model.V[0] = 0.1 * torch.randn(L, L, generator=g, dtype=torch.float64) + 2.0 * task.P
    for _ in range(steps):
        model.W.grad = model.V.grad = None
        th.population_loss(model, task, types, backward=True)
        with torch.no_grad():
            model.W -= lr * model.W.grad
            model.V -= lr * model.V.grad
    assert torch.allclose(final["W"].double(), model.W[0].detach(), atol=1e-10)
    assert torch.allclose(final["V"].double(), model.V[0].detach(), atol=1e-10)
    losses = [r["loss"] for r in runs.read_metrics(d) if r.get("loss") is not None]
    assert losses[-1] < losses[0]


def test_result2_admissibility_threshold():
    from tdyn.experiments.decision_lists import admissibility

    rng = __import__("numpy").random.default_rng(0)
    checked = 0
    for _ in range(300):
        n, m, L0 = int(rng.integers(2, 80)), int(rng.integers(1, 7)), float(rng.uniform(0.2, 5))
        if abs(n * L0 ** 2 / (162 * m) - 1) < 1e-6:
            continue
        eps_star = admissibility(L0, n, m, 1.0)["eps_star"]
        a = admissibility(L0, n, m, eps_star)
        assert a["admissible"] == a["threshold_holds"] == (n * L0 ** 2 > 162 * m)
        checked += a["admissible"]
    assert 0 < checked < 300


def test_bound_reading_definitions_hand_made():
    """γ readings of result (1): hand-made rows whose verdicts are known; T = 0 is the best case, not ∞."""
    from tdyn.experiments.decision_lists import GAMMAS, _bound_reading, _gamma_max

    def row(T, b, t_max=100.0, M=2, L=10):
        return {"L": L, "n": 3, "M": M, "T_sup": T, "t_max": t_max} | {f"bound_gamma_{g}": b for g in GAMMAS}

    assert _bound_reading([row(1.0, 2.0), row(0.0, 2.0)], "T_sup", "1")["verdict"] == "holds"
    r = _bound_reading([row(0.0, 2.0), row(3.0, 2.0)], "T_sup", "1")
    assert r["verdict"] == "fails" and r["numbers"]["worst"]["T_sup"] == 3.0      # T = 0 is not the worst
    assert _bound_reading([row(None, 2.0, t_max=50.0)], "T_sup", "1")["verdict"] == "fails"   # t_max ≥ bound
    assert _bound_reading([row(None, 200.0, t_max=50.0)], "T_sup", "1")["verdict"] == "inconclusive"
    assert _gamma_max([row(2.0, 1.0, M=2, L=10)], "T_sup") == pytest.approx(4 * 2 / (2.0 * math.log(10)))


def test_inside_claim_readings_hand_made():
    """Result (2): k* inside ε/(2η) but above 2mℒ₀/(A²η) → the two quantifier readings disagree; a run with
    η·λ_max(t) > 1 before k* is outside the hypotheses and left out."""
    from tdyn.experiments.decision_lists import _inside_claim

    base = {"steps": 100, "max_eta_lambda_to_kstar": 1.0, "L": 30, "n": 29, "M": 2, "eps": 5.0, "L0": 3.4,
            "A_lo": 2.2, "A_hi": 2.3, "v_drift_max": 0.0}
    st = {"inside": [(30, 29, 2)]}
    c = _inside_claim([base | {"k_star": 5, "step_range_hi": 10.0, "k_bound": 8.0}], st)
    assert c["verdict"] == "holds"
    c = _inside_claim([base | {"k_star": 9, "step_range_hi": 10.0, "k_bound": 8.0}], st)
    assert c["verdict"] == "inconclusive" and [r["verdict"] for r in c["readings"]] == ["holds", "fails"]
    c = _inside_claim([base | {"k_star": 50, "step_range_hi": 10.0, "k_bound": 8.0}], st)
    assert c["verdict"] == "fails"
    c = _inside_claim([base | {"k_star": 50, "step_range_hi": 10.0, "k_bound": 8.0,
                               "max_eta_lambda_to_kstar": 1.01}], st)
    assert c["verdict"] == "inconclusive" and c["numbers"]["outside_eta_condition"] == 1


def _quick(name, tmp_path):
    from tdyn.experiments.common import write_results
    from tdyn.experiments.registry import ReproduceContext, get

    torch.set_num_threads(1)
    ctx = ReproduceContext(out=tmp_path / "out", quick=True, progress=False)
    res = get(name).reproduce(ctx)
    write_results(ctx.out, res)
    r = __import__("json").loads((ctx.out / "results.json").read_text())
    assert all(c.get("paper") and c.get("definition") for c in r["claims"])
    return r, {c["id"]: c for c in r["claims"]}, ctx.out


@pytest.mark.slow
def test_quick_claim1_verdicts(tmp_path):
    r, c, out = _quick("decision-list/claim1", tmp_path)
    assert c["result1_B_strict"]["verdict"] == "holds"
    a = c["result1_A_strict"]
    assert a["verdict"] == "inconclusive"
    assert a["numbers"]["holds_under"] == ["pattern"] and a["numbers"]["fails_under"] == ["1", "delta", "joint"]
    assert all(x["M"] == 1 for x in r["degenerate_M1"]) and r["degenerate_M1"]
    assert {f.name for f in out.glob("*.png")} >= {"claim1_tsup_logL.png", "claim1_overtaking.png",
                                                   "claim1_tsup_vs_n_M.png"}


@pytest.mark.slow
def test_quick_claim2_and_uniform_attention_verdicts(tmp_path):
    _, c, _ = _quick("decision-list/claim2", tmp_path / "c2")
    assert c["result2_inside_hypotheses"]["verdict"] == "holds"
    assert c["result2_inside_hypotheses"]["numbers"]["outside_eta_condition"] == 0
    assert c["result2_V_moves_exploratory"]["numbers"]["runs"][0]["v_drift_max"] > 1.0
    _, c, _ = _quick("decision-list/uniform-attention", tmp_path / "ua")
    assert c["first_gradient_recovers_P"]["verdict"] == "holds"
    assert c["frozen_W_recovers_P"]["verdict"] == "holds"
