"""The decision_list trainer task: population-loss GD through `train` equals a hand-written GD loop."""

import math
from pathlib import Path

import pytest
import torch

from tdyn import runs
from tdyn.papers.decision_list import data as dl
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig
from tdyn.papers.decision_list import theory as th
from tdyn.seeding import generator
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
    from tdyn.papers.decision_list.claim2 import admissibility

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
    from tdyn.papers.decision_list.claim1 import GAMMAS, _bound_reading, _gamma_max

    def row(T, b, t_max=100.0, M=2, L=10):
        return {"L": L, "n": 3, "M": M, "T_sup": T, "t_max": t_max} | {f"bound_gamma_{g}": b for g in GAMMAS}

    assert _bound_reading([row(1.0, 2.0), row(0.0, 2.0)], "T_sup", "delta")["verdict"] == "holds"
    r = _bound_reading([row(0.0, 2.0), row(3.0, 2.0)], "T_sup", "delta")
    assert r["verdict"] == "fails" and r["numbers"]["worst"]["T_sup"] == 3.0      # T = 0 is not the worst
    assert r["numbers"]["family"] == "determining-event"
    assert _bound_reading([row(None, 2.0, t_max=50.0)], "T_sup", "joint")["verdict"] == "fails"   # t_max ≥ bound
    assert _bound_reading([row(None, 200.0, t_max=50.0)], "T_sup", "pattern")["verdict"] == "inconclusive"
    assert _gamma_max([row(2.0, 1.0, M=2, L=10)], "T_sup") == pytest.approx(4 * 2 / (2.0 * math.log(10)))


def test_inside_claim_readings_hand_made():
    """Result (2): k* inside ε/(2η) but above 2mℒ₀/(A²η) → the two quantifier readings disagree; a run with
    η·λ_max(t) > 1 before k* is outside the hypotheses and left out."""
    from tdyn.papers.decision_list.claim2 import _inside_claim, claim2_settings

    base = {"steps": 100, "max_eta_lambda_to_kstar": 1.0, "L": 30, "n": 29, "M": 2, "eps": 5.0, "L0": 3.4,
            "A_lo": 2.2, "A_hi": 2.3, "v_drift_max": 0.0, "c": 1e5}
    st = claim2_settings(True)      # inside: [(30, 29, 2)]
    c = _inside_claim([base | {"k_star": 5, "step_range_hi": 10.0, "k_bound": 8.0},
                       base | {"k_star": 7, "step_range_hi": 12.0, "k_bound": 9.0, "v_drift_max": 3e-9}], st)
    assert c["verdict"] == "holds" and c["source"] == "paper" and "encounters a t" in c["quote"]
    lim = c["numbers"]["existence_only"]
    assert (lim["v_drift_max"], lim["k_star_max"], lim["window_lo_min"]) == (3e-9, 7, 8.0)
    assert "V moves by at most 3e-09" in c["claim"] and "k* ≤ 7 steps" in c["claim"] and "≥ 8 steps" in c["claim"]
    c = _inside_claim([base | {"k_star": 9, "step_range_hi": 10.0, "k_bound": 8.0}], st)
    assert c["verdict"] == "inconclusive" and [r["verdict"] for r in c["readings"]] == ["holds", "fails"]
    c = _inside_claim([base | {"k_star": 50, "step_range_hi": 10.0, "k_bound": 8.0}], st)
    assert c["verdict"] == "fails"
    c = _inside_claim([base | {"k_star": 50, "step_range_hi": 10.0, "k_bound": 8.0,
                               "max_eta_lambda_to_kstar": 1.01}], st)
    assert c["verdict"] == "inconclusive" and c["numbers"]["outside_eta_condition"] == 1


def _quick(name, tmp_path):
    from tdyn.reproduce.common import write_results
    from tdyn.reproduce.registry import ReproduceContext, get

    torch.set_num_threads(1)
    ctx = ReproduceContext(out=tmp_path / "out", quick=True, progress=False)
    res = get(name).reproduce(ctx)
    write_results(ctx.out, res)
    r = __import__("json").loads((ctx.out / "results.json").read_text())
    assert all(c.get("paper") and c.get("definition") for c in r["claims"])
    return r, {c["id"]: c for c in r["claims"]}, ctx.out


PAPER_TEXT = " ".join((Path(__file__).resolve().parents[2] / "shared" / "papers" /
                      "decision_lists_extended_abstract.txt").read_text().split()) \
    if (Path(__file__).resolve().parents[2] / "shared" / "papers").exists() else None


@pytest.mark.slow
def test_quick_claim1_verdicts(tmp_path):
    r, c, out = _quick("decision-list/claim1", tmp_path)
    assert c["result1_B_strict"]["verdict"] == "holds"
    a = c["result1_A_strict"]
    assert a["verdict"] == "inconclusive"
    assert a["numbers"]["holds_under"] == ["pattern"] and a["numbers"]["fails_under"] == ["delta", "joint"]
    assert a["numbers"]["by_family"] == {"multiplicity-pattern": "holds", "determining-event": "fails"}
    assert "fails if γ is a determining-event mass" in a["reason"] and a["source"] == "paper" and a["quote"]
    assert c["result1_B_kappa_0.1"]["source"] == "derived" and c["law_1_over_logL_A"]["source"] == "derived"
    assert all(c_["source"] in ("paper", "derived") for c_ in r["claims"])
    assert all(x["M"] == 1 for x in r["degenerate_M1"]) and r["degenerate_M1"]
    assert {f.name for f in out.glob("*.png")} >= {"claim1_tsup_logL.png", "claim1_overtaking.png",
                                                   "claim1_tsup_vs_n_M.png"}


def test_claim1_rows_do_not_depend_on_the_worker_count(tmp_path):
    """claim1 solves its flows in a process pool: each flow is a pure function of its spec and the seed,
    so the CSVs are byte-equal with 1 and 2 workers (N > 0: the keyed sample streams included)."""
    from tdyn.papers.decision_list.claim1 import Claim1Options
    from tdyn.reproduce.registry import ReproduceContext, get

    outs = []
    for w in (1, 2):
        ctx = ReproduceContext(out=tmp_path / f"w{w}", quick=True, progress=False,
                               options=Claim1Options(L=[10, 30], n=[3], M=[1, 2], N=50, workers=w))
        ctx.out.mkdir()
        get("decision-list/claim1").reproduce(ctx)
        outs.append({f: (ctx.out / f).read_bytes() for f in ("claim1.csv", "claim1_fixed_c.csv")})
    assert outs[0] == outs[1] and outs[0]["claim1.csv"].count(b"\n") == 1 + 2 * 2 * 2


@pytest.mark.slow
def test_quick_claim2_and_uniform_attention_verdicts(tmp_path):
    _, c, _ = _quick("decision-list/claim2", tmp_path / "c2")
    assert c["result2_inside_hypotheses"]["verdict"] == "holds"
    assert c["result2_inside_hypotheses"]["numbers"]["outside_eta_condition"] == 0
    assert c["result2_V_moves_exploratory"]["numbers"]["runs"][0]["v_drift_max"] > 1.0
    # provenance: only the claim inside the hypotheses is the abstract's (with its quote); the rest are derived
    assert {k: v["source"] for k, v in c.items()} == {
        "result2_inside_hypotheses": "paper", "result2_eta_below_1_over_lambda_along_path": "derived",
        "result2_perfect_iterate_exploratory": "derived", "result2_V_moves_exploratory": "derived",
        "sampler_A_c_fixed_point_diverges": "derived"}
    assert "Only existence is tested" in c["result2_inside_hypotheses"]["claim"]
    _, c, _ = _quick("decision-list/uniform-attention", tmp_path / "ua")
    assert c["first_gradient_recovers_P"]["verdict"] == "holds"
    assert c["frozen_W_recovers_P"]["verdict"] == "holds"
    assert {k: v["source"] for k, v in c.items()} == {
        "first_gradient_recovers_P": "paper", "frozen_W_recovers_P": "paper",
        "first_gradient_cosine_rises_with_L": "derived", "joint_training_perfect": "derived"}
    if PAPER_TEXT:   # the abstract's text (outside the repository; where the checkout has it)
        assert all(v["quote"] in PAPER_TEXT for v in c.values() if v["source"] == "paper")


def test_dl_task_init_options_and_probes(tmp_path):
    """W_init: zero keeps V₀'s draw; V_noise adds uniform_perturbation; the probes match direct computations;
    the Hessian probe measures at non-perfect steps and on its grid only."""
    from tdyn.papers.decision_list.model import uniform_perturbation
    from tdyn.papers.decision_list.probes import centred_cosine, member_model, perm_recovery

    L, M, n = 6, 2, 3
    base = {"task": "decision_list", "data": {"L": L, "M": M, "n": n}, "seeds": [3], "dtype": "float64",
            "optim": {"steps": 6, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}},
            "checkpoint": {"schedule": "none"}}
    drawn = train(base | {"model": {"init_std": 0.5}}, tmp_path / "a", progress=False)[0]
    zero = train(base | {"model": {"init_std": 0.5, "W_init": "zero"}}, tmp_path / "b", progress=False)[0]
    a0, b0 = runs.Run(drawn).params(0), runs.Run(zero).params(0)
    assert torch.equal(a0["V"], b0["V"]) and not b0["W"].any() and a0["W"].abs().sum() > 0

    cfg = base | {"model": {"c": 2.0, "V_noise": 0.3, "V_noise_seed": 5},
                  "ensemble": {"lrs": [{"all": 0.5}, {"all": 2.0}]},
                  "probes": {"names": ["decision_list.classify", "decision_list.V", "decision_list.hessian"],
                             "options": {"decision_list.hessian": {"every": 4}}}}
    d0, d1 = train(cfg, tmp_path / "c", progress=False)
    task = dl.make_task(L, M, 0)
    types = th.enumerate_types(task, n, "B")
    V0 = 2.0 * task.P + uniform_perturbation(L, 0.3, 5)
    assert torch.equal(runs.Run(d0).params(0)["V"], V0)
    run = runs.Run(d1)
    rec = {r["step"]: r for r in run.metrics}
    model = run.model("final")
    cl = th.classify(model, task, types)
    last = rec[6]
    assert last["decision_list.classify/err_sup"] == pytest.approx(float(cl.err_sup[0]), abs=1e-12)
    V = model.V.detach()[0]
    assert last["decision_list.V/cos_c"] == pytest.approx(float(centred_cosine(V, task.P)), abs=1e-12)
    assert last["decision_list.V/perm_recovery"] == float(perm_recovery(V, task.perm))
    assert last["decision_list.V/drift"] == pytest.approx(float((V - V0).abs().max()), abs=1e-12)
    for s, r in rec.items():   # λ_max measured where not perfect or on the grid (steps 0, 4), else null
        lam = r["decision_list.hessian/lambda_max"]
        if r["decision_list.classify/perfect"] == 0 or s % 4 == 0:
            assert lam is not None and lam > 0
        else:
            assert lam is None
    lam = th.top_hessian_eigenvalue(member_model(model, 0), task, types)
    assert rec[6]["decision_list.hessian/lambda_max"] in (None, pytest.approx(lam, rel=1e-9))


@pytest.mark.parametrize("frozen,optimizer", [("W", "sgd"), ("W", "adam"), ("V", "sgd")])
@pytest.mark.parametrize("L,n,M,S", [(8, 3, 2, 2), (16, 4, 3, 1), (16, 4, 3, 5)])
def test_a_frozen_parameter_trains_the_bits_of_the_full_gradient(tmp_path, monkeypatch, frozen, optimizer, L, n, M, S):
    """A run with a parameter frozen at every step (decision-list/uniform-attention's frozen-W runs, claim2's W-only
    runs) takes no gradient for it and reuses the forward's attention side while W is unchanged; its metrics and
    checkpoints are the bits of the same run with both gradients formed and every forward computed afresh (the code
    before, forced here), at sizes that take each form of the kernels (α̃ / count rows, one or five members)."""
    from tdyn.papers.decision_list import kernels
    from tdyn.papers.decision_list import task as dl_task

    cfg = {"task": "decision_list", "data": {"L": L, "M": M, "n": n}, "seeds": list(range(S)), "dtype": "float64",
           "model": {"init_std": 0.1} | ({"W_init": "zero"} if frozen == "W" else {}),
           "optim": {"steps": 12, "groups": {"all": {"params": ["W", "V"], "optimizer": optimizer,
                                                     "lr": 0.3 if optimizer == "sgd" else 1e-2}},
                     "freeze": {frozen: {"always": True}}},
           "probes": {"names": ["decision_list.classify", "decision_list.V"], "every": 3},
           "checkpoint": {"schedule": "none", "steps": [5]}}
    new = train(cfg, tmp_path / "new", progress=False)
    monkeypatch.setattr(kernels, "_LAST", [None])
    fresh = kernels.token_forward

    def afresh(*a):
        kernels._LAST[0] = None
        return fresh(*a)

    monkeypatch.setattr(kernels, "token_forward", afresh)
    monkeypatch.setattr(dl_task.DecisionListTrainTask, "loss",
                        lambda self, batch: kernels.population_loss(self.model, self.dist, self.types))
    old = train(cfg, tmp_path / "old", progress=False)
    for a, b in zip(new, old):
        assert [{k: v for k, v in r.items()} for r in runs.read_metrics(a)] == runs.read_metrics(b)
        for step in (5, "final"):
            pa, pb = runs.params_of(runs.load_checkpoint(a, step)), runs.params_of(runs.load_checkpoint(b, step))
            assert all(torch.equal(pa[k], pb[k]) for k in ("W", "V"))
    assert runs.params_of(runs.load_checkpoint(new[0], "final"))[frozen].equal(
        runs.params_of(runs.load_checkpoint(new[0], 0))[frozen])


def test_probe_options_must_name_a_probe():
    from tdyn.config import validate_config
    from tdyn.errors import ConfigError

    with pytest.raises(ConfigError, match="probes.options.decision_list.hessian"):
        validate_config({"task": "decision_list", "optim": {"groups": {"all": {"params": ["W", "V"], "lr": 1.0}}},
                         "probes": {"names": [], "options": {"decision_list.hessian": {"every": 2}}}})


@pytest.mark.slow
def test_claim2_reproduction_resumes(cli, tmp_path):
    """decision-list/claim2 trains through the trainer into run directories; --resume keeps finished runs,
    continues an interrupted one and gives the same results as the uninterrupted reproduction."""
    import json
    import shutil

    out = tmp_path / "c2"
    assert cli("reproduce", "decision-list/claim2", "--quick", "--out", out, "--quiet").returncode == 0
    ref = json.loads((out / "results.json").read_text())
    csv_ref = (out / "claim2.csv").read_text()
    jobs = sorted(p for p in (out / "runs").iterdir())
    assert len(jobs) >= 6 and all(runs.job_dirs(j) for j in jobs)
    # interrupt one job: its members lose their final state and go back to "interrupted"
    victim = next(j for j in jobs if j.name.startswith("exploratory"))
    for d in runs.job_dirs(victim):
        (d / "checkpoints" / "final.safetensors").unlink()
        meta = runs.read_meta(d)
        meta["status"] = "interrupted"
        runs.write_json(d / runs.META, meta)
    keep = next(j for j in jobs if j.name.startswith("inside"))
    stamp = {d: (d / "metrics.jsonl").stat().st_mtime_ns for d in runs.job_dirs(keep)}
    shutil.copy(out / "results.json", tmp_path / "ref.json")
    r = cli("reproduce", "decision-list/claim2", "--quick", "--out", out, "--quiet", "--resume")
    assert r.returncode == 0, r.stderr
    assert all((d / "metrics.jsonl").stat().st_mtime_ns == t for d, t in stamp.items())   # not retrained
    assert all(runs.Run(d).status == "finished" for d in runs.job_dirs(victim))
    assert (out / "claim2.csv").read_text() == csv_ref
    new = json.loads((out / "results.json").read_text())
    assert [c["verdict"] for c in new["claims"]] == [c["verdict"] for c in ref["claims"]]


def test_gamma_families_and_gamma_needed_hand_computed():
    """Result (1)'s γ readings at (L, n, M) = (10, 3, 2), by hand (docs/reproductions/decision-lists.md#delta-and-gamma):
    B: p(k=1|q) = C(8,1)/C(9,2) = 2/9 = δ, δ/L = 1/45, rarest presence pattern (a_1 present, one other token)
    (1/10)·C(8,1)/C(9,2) = 1/45; A: δ = 1 − (9/10)² = 0.19, δ/L = 0.019, rarest multiplicity pattern
    (q three times, or a_1 twice and q once) 10⁻³. γ = 1 is no reading. γ_needed = 4M/(T log L)."""
    from tdyn.papers.decision_list.claim1 import GAMMA_FAMILY, GAMMAS, gamma_needed, gamma_readings

    assert set(GAMMAS) == {"delta", "joint", "pattern"} and "1" not in GAMMAS
    assert GAMMA_FAMILY == {"delta": "determining-event", "joint": "determining-event",
                            "pattern": "multiplicity-pattern"}
    b = gamma_readings(10, 3, 2, "B")
    assert b["delta"] == pytest.approx(2 / 9, rel=1e-12) and b["joint"] == pytest.approx(1 / 45, rel=1e-12)
    assert b["pattern"] == pytest.approx(1 / 45, rel=1e-12)
    a = gamma_readings(10, 3, 2, "A")
    assert a["delta"] == pytest.approx(0.19, rel=1e-12) and a["joint"] == pytest.approx(0.019, rel=1e-12)
    assert a["pattern"] == pytest.approx(1e-3, rel=1e-12)
    assert gamma_needed(2.0, 10, 2) == pytest.approx(8 / (2 * math.log(10)), rel=1e-15)
    assert gamma_needed(None, 10, 2) is None and gamma_needed(0.0, 10, 2) == math.inf
    # the bound 4M/(γ log L) holds at a reading iff γ ≤ γ_needed
    T = 6.294009304741741   # committed T_sup at (A, 10, 3, 2)
    assert (T <= 4 * 2 / (a["pattern"] * math.log(10))) == (a["pattern"] <= gamma_needed(T, 10, 2))
    assert (T <= 4 * 2 / (a["delta"] * math.log(10))) == (a["delta"] <= gamma_needed(T, 10, 2))


def test_claim2_rows_read_back_as_written(tmp_path):
    """--judge-only reads claim2.csv back: None, bools, ints and floats as measure wrote them."""
    from tdyn.papers.decision_list.claim2 import CLAIM2_COLUMNS
    from tdyn.reproduce.phases import read_table, write_table

    row = {k: None for k in CLAIM2_COLUMNS} | {"regime": "inside", "L": 30, "k_star": 478, "stays_perfect": True,
                                                "admissible": False, "v_drift_max": 2.7453519457765196e-09,
                                                "k_bound": 3457028.6748607517}
    assert read_table(write_table(tmp_path / "claim2.csv", [row], CLAIM2_COLUMNS)) == [row]
