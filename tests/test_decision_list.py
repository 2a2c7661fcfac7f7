"""Decision lists: data, model, exact population loss, reduced flow, margin test
(docs/reproductions/decision-lists.md#tests)."""

import math

import numpy as np
import pytest
import torch

from tdyn.papers.decision_list import data as dl
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig
from tdyn.papers.decision_list import theory as th

torch.set_num_threads(1)  # tiny tensors: threads only add contention on the shared machine


def _model(L, S=1, scale=0.0, seed=0, V=None):
    m = DecisionListModel(DecisionListModelConfig(L), S=S)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.W.copy_(scale * torch.randn(m.W.shape, generator=g, dtype=torch.float64))
        m.V.copy_(scale * torch.randn(m.V.shape, generator=g, dtype=torch.float64) if V is None else V)
    return m


def test_labels_first_present_entry():
    task = dl.make_task(10, 3, seed=1)
    s = dl.sample(task, 500, 4, "A", torch.Generator().manual_seed(0))
    y = dl.labels(task, s)
    for b in range(50):  # reference by a literal reading of §I.B
        for j in range(4):
            lst = task.lists[s[b, j]].tolist()
            first = next(a for a in lst if a in s[b].tolist())
            assert y[b, j] == task.perm[first]
    assert (task.lists[:, -1] == torch.arange(10)).all()


def _make_task_by_full_argsort(L, M, seed, equal_lengths=True, zipf=0.0):
    """The reference: make_task as first written, each row's prefix by argsorting a full L × L key matrix."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(L)
    keys = rng.random((L, L))
    keys[np.arange(L), np.arange(L)] = 2.0
    prefix = np.argsort(keys, axis=1)[:, : M - 1]
    lengths = np.full(L, M) if equal_lengths else rng.integers(1, M + 1, size=L)
    col = np.arange(M)[None, :]
    lists = np.where(col < (lengths[:, None] - 1), np.concatenate([prefix, np.zeros((L, 1), int)], 1),
                     np.arange(L)[:, None])
    mu = (np.arange(L) + 1.0) ** (-zipf)
    mu = mu[rng.permutation(L)]
    return perm, lists, lengths, mu / mu.sum()


@pytest.mark.parametrize("L,M", [(1, 1), (2, 2), (5, 1), (5, 5), (10, 3), (37, 4), (300, 4), (1000, 2), (513, 9)])
def test_make_task_equals_full_argsort(L, M):
    for seed in range(12):
        for eq, zipf in ((True, 0.0), (False, 1.1)):
            task = dl.make_task(L, M, seed, equal_lengths=eq, zipf=zipf)
            perm, lists, lengths, mu = _make_task_by_full_argsort(L, M, seed, eq, zipf)
            assert np.array_equal(task.perm.numpy(), perm) and np.array_equal(task.lists.numpy(), lists)
            assert np.array_equal(task.lengths.numpy(), lengths) and np.array_equal(task.mu.numpy(), mu)
    # row chunks draw the same stream as one L × L draw: one row per chunk gives the same prefixes
    for L, k in ((7, 3), (50, 4)):
        keys = np.random.default_rng(1).random((L, L))
        keys[np.arange(L), np.arange(L)] = 2.0
        ref = np.argsort(keys, axis=1)[:, :k]
        for chunk in (1, 3 * L, L * L):
            assert np.array_equal(dl._list_prefixes(np.random.default_rng(1), L, k, chunk_elems=chunk), ref)


@pytest.mark.parametrize("L,n,N,zipf", [(5, 5, 300, 0.0), (12, 4, 2000, 0.0), (12, 4, 2000, 1.0), (30, 3, 500, 0.0),
                                         (1000, 8, 9000, 0.0), (1000, 5, 9000, 0.7)])
def test_sampler_B_equals_one_gumbel_draw(L, n, N, zipf):
    """Sampler B (row chunks; only the n + 8 largest uniforms' keys when μ is uniform) equals the Gumbel
    top-k of one N × L draw, sequences and their order (L = 1000: three chunks)."""
    task = dl.make_task(L, 2, seed=0, zipf=zipf)
    for seed in range(4):
        u = torch.rand(N, L, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).clamp_min(1e-300)
        ref = (task.mu.log() - (-u.log()).log()).topk(n, dim=1).indices
        assert torch.equal(dl.sample(task, N, n, "B", torch.Generator().manual_seed(seed)), ref)


def test_sampler_B_distinct_and_zipf_law():
    task = dl.make_task(12, 2, seed=0, zipf=1.0)
    g = torch.Generator().manual_seed(0)
    s = dl.sample(task, 20000, 3, "B", g)
    assert ((s[:, :, None] == s[:, None, :]).sum((1, 2)) == 3).all()
    a = dl.sample(task, 40000, 2, "A", g)
    freq = torch.bincount(a.flatten(), minlength=12).double() / a.numel()
    assert torch.allclose(freq, task.mu, atol=5 * math.sqrt(0.25 / a.numel()))


@pytest.mark.parametrize("sampler", ["A", "B"])
def test_delta_gamma_closed_forms_vs_monte_carlo(sampler):
    L, n, M = 9, 4, 3
    task = dl.make_task(L, M, seed=2)
    s = dl.sample(task, 200000, n, sampler, torch.Generator().manual_seed(1))
    k = dl.determining_index(task, s).flatten()
    freq = torch.bincount(k.long(), minlength=M).double().numpy() / k.numel()
    p = dl.event_probs(L, n, M, sampler)
    assert np.allclose(freq, p, atol=4 * math.sqrt(0.25 / k.numel()))  # 4-sigma, binomial
    dg = dl.delta_gamma(L, n, M, sampler)
    assert dg["delta"] == pytest.approx(p.min()) and dg["gamma_joint"] == pytest.approx(p.min() / L)


def test_delta_zero_is_flagged():
    assert not dl.delta_gamma(10, 8, 4, "B")["positive"]


@pytest.mark.parametrize("sampler,L,n", [("A", 5, 3), ("B", 6, 4), ("A", 4, 4), ("B", 7, 3)])
@pytest.mark.parametrize("zipf", [0.0, 1.2])
def test_type_sum_equals_brute_force(sampler, L, n, zipf):
    task = dl.make_task(L, 3, seed=3, zipf=zipf, equal_lengths=zipf == 0)
    model = _model(L, S=2, scale=1.0)
    types = th.enumerate_types(task, n, sampler)
    assert float(types.prob.sum()) == pytest.approx(1.0, abs=1e-12)
    brute = th.all_sequences(task, n, sampler)
    a = th.population_loss(model, task, types)
    b = th.population_loss(model, task, brute)
    assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_attention_single_entry():
    L = 6
    m = _model(L)
    with torch.no_grad():
        m.W[0, 2, 4] = 50.0   # key 2, query 4
        m.V[0] = torch.eye(L)
    s = torch.tensor([[4, 2, 1, 2]])
    z = m.logits(s)[0, 0]
    assert torch.allclose(z[:, 0], torch.eye(L, dtype=torch.float64)[:, 2], atol=1e-12)


def test_gradient_vs_finite_differences_and_conservation():
    L, n = 5, 3
    task = dl.make_task(L, 2, seed=0)
    types = th.enumerate_types(task, n, "A")
    model = _model(L, scale=0.7)
    th.population_loss(model, task, types).sum().backward()
    gW, gV = model.W.grad.clone(), model.V.grad.clone()
    # column sums of the gradients vanish (gauge invariance, docs/reproductions/decision-lists.md#gauge-invariance)
    assert gW.sum(1).abs().max() < 1e-12 and gV.sum(1).abs().max() < 1e-12
    h = 1e-6
    for P, G in ((model.W, gW), (model.V, gV)):
        for (i, j) in [(0, 1), (3, 3), (4, 0)]:
            with torch.no_grad():
                P[0, i, j] += h
                up = float(th.population_loss(model, task, types))
                P[0, i, j] -= 2 * h
                dn = float(th.population_loss(model, task, types))
                P[0, i, j] += h
            assert (up - dn) / (2 * h) == pytest.approx(float(G[0, i, j]), abs=1e-8)
    # GD conserves the column sums of W and V
    s0 = (model.W.sum(1).clone(), model.V.sum(1).clone())
    with torch.no_grad():
        for _ in range(20):
            model.W.grad = model.V.grad = None
            with torch.enable_grad():
                th.population_loss(model, task, types, backward=True)
            model.W -= 0.5 * model.W.grad
            model.V -= 0.5 * model.V.grad
    assert (model.W.sum(1) - s0[0]).abs().max() < 1e-12 and (model.V.sum(1) - s0[1]).abs().max() < 1e-12


def test_initial_loss_B():
    L, n, c = 9, 4, 7.0
    task = dl.make_task(L, 3, seed=0)
    model = _model(L, V=c * task.P)
    F = th.population_loss(model, task, th.enumerate_types(task, n, "B"))
    assert F.item() == pytest.approx(math.log(n + (L - n) * math.exp(-c / n)), abs=1e-12)


@pytest.mark.parametrize("sampler,L,n,M,c", [("A", 7, 4, 3, 5.0), ("B", 9, 4, 3, 30.0)])
def test_reduced_gd_matches_full_gd(sampler, L, n, M, c):
    task = dl.make_task(L, M, seed=4)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L, V=c * task.P)
    model.V.requires_grad_(False)
    cf = th.reduced_configs(L, n, M, sampler)
    assert float(cf.logw.exp().sum()) == pytest.approx(1 / L, rel=1e-12)
    w = torch.zeros(M + 1, dtype=torch.float64)
    q = 0
    lst = task.lists[q]
    out = [t for t in range(L) if t not in lst.tolist()]
    eta = 2.0 if sampler == "A" else 0.5
    assert float(th.reduced_loss(w, cf, c)) * L == pytest.approx(th.population_loss(model, task, types).item(), abs=1e-12)
    worst = 0.0
    for step in range(300):
        model.W.grad = None
        th.population_loss(model, task, types, backward=True)
        with torch.no_grad():
            model.W -= eta * model.W.grad
        w = w - eta * th.reduced_grad(w, cf, c)
        col = model.W[0, :, q].detach()
        worst = max(worst, float((col[lst] - w[:M]).abs().max()), float((col[out] - w[M]).abs().max()))
    assert worst <= 1e-9
    assert float(w.abs().max()) > 1e-3  # the trajectory moved


def test_reduced_flow_event_matches_euler_gd():
    L, n, M, c, eta = 6, 5, 2, 20.0, 0.02
    cf = th.reduced_configs(L, n, M, "A")
    res = th.solve_reduced_flow(L, n, M, "A", c, t_max=1e4)
    assert res.T_sup is not None
    w = torch.zeros(M + 1, dtype=torch.float64)
    k = 0
    while th.reduced_margin(w, cf) <= 0:
        w = w - eta * th.reduced_grad(w, cf, c)
        k += 1
    assert abs(k * eta - res.T_sup) <= 5 * eta
    assert res.T_pop[1e-3] <= res.T_sup


@pytest.mark.parametrize("sampler,L,n,M", [("A", 6, 4, 3), ("B", 7, 3, 3), ("B", 6, 4, 2)])
def test_margin_test_vs_enumeration(sampler, L, n, M):
    task = dl.make_task(L, M, seed=5)
    types = th.enumerate_types(task, n, sampler)
    g = torch.Generator().manual_seed(0)
    agree = perfect = 0
    for trial in range(60):
        W = 0.3 * torch.randn(L, L, generator=g, dtype=torch.float64)
        # tilt towards ordered lists so that some trials are perfect
        ranks = torch.linspace(3.0, 1.0, M, dtype=torch.float64)
        W[task.lists, torch.arange(L)[:, None]] += (trial % 3) * ranks
        model = _model(L, V=25.0 * task.P)
        with torch.no_grad():
            model.W[0] = W
        closed = bool((th.full_support_margins(W, task, n, sampler) > 0).all())
        enum = bool(th.classify(model, task, types).perfect[0])
        agree += closed == enum
        perfect += enum
    assert agree == 60 and 0 < perfect < 60


@pytest.mark.parametrize("L,n,scale,c", [(3, 2, 0.5, 0.0), (5, 3, 0.7, 0.0), (5, 4, 0.3, 40.0)])
def test_lambda_max_lanczos_vs_autograd_dense_hessian(L, n, scale, c):
    """λ_max (Lanczos on HVPs) equals the top eigenvalue of the autograd dense Hessian to 1e-10 relative."""
    task = dl.make_task(L, 2, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = _model(L, scale=scale)
    with torch.no_grad():
        model.V += c * task.P
    lam = th.top_hessian_eigenvalue(model, task, types, gen=torch.Generator().manual_seed(0))

    y = dl.labels(task, types.seqs)

    def F(flat):
        W, V = flat[: L * L].reshape(1, L, L), flat[L * L:].reshape(1, L, L)
        logp = torch.func.functional_call(model, {"W": W, "V": V}, (types.seqs,))   # log f (1, B, L, n)
        seq = -logp[0].gather(1, y[:, None, :]).squeeze(1).mean(-1)                  # Eqn 2 per sequence
        return (seq @ types.prob).sum()

    flat = torch.cat([model.W.detach().flatten(), model.V.detach().flatten()])
    H = torch.autograd.functional.hessian(F, flat)
    ev = torch.linalg.eigvalsh(H)
    assert lam == pytest.approx(float(ev[-1]), rel=1e-10, abs=1e-14)
    assert torch.allclose(th.dense_hessian(model, task, types), H, atol=1e-10 * float(H.abs().max()), rtol=0)
    # warm start from the eigenvector gives the same value
    lam2, vec = th.top_hessian_eigenvalue(model, task, types, return_vector=True)
    assert th.top_hessian_eigenvalue(model, task, types, v0=vec) == pytest.approx(lam2, rel=1e-10)


@pytest.mark.parametrize("sampler", ["A", "B"])
def test_reduced_sample_correct_vs_full_model(sampler):
    L, n, M, c = 9, 4, 3, 25.0
    task = dl.make_task(L, M, seed=6)
    s = dl.sample(task, 400, n, sampler, torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    for _ in range(10):
        w = torch.randn(M + 1, generator=g, dtype=torch.float64) + torch.linspace(2, 0, M + 1, dtype=torch.float64)
        W = w[M].repeat(L, L)
        W[task.lists, torch.arange(L)[:, None]] = w[:M]
        model = _model(L, V=c * task.P)
        with torch.no_grad():
            model.W[0] = W
        full = (th.position_margins(model, task, s)[0] > 0).all(-1)
        assert torch.equal(th.reduced_sample_correct(w, task, s), full)


def test_flow_hitting_times_ordered():
    L, n, M = 30, 5, 2
    task = dl.make_task(L, M, seed=0)
    s = dl.sample(task, 2000, n, "A", torch.Generator().manual_seed(0))
    c = 4 * n * math.log(L) / dl.delta_gamma(L, n, M, "A")["delta"]
    r = th.solve_reduced_flow(L, n, M, "A", c, t_max=1e5, samples=(task, s))
    assert r.T_N is not None and r.T_pop[1e-3] is not None
    assert r.T_N <= (r.T_sup if r.T_sup is not None else math.inf)


@pytest.mark.parametrize("sampler", ["A", "B"])
def test_monte_carlo_estimate_vs_exact(sampler):
    L, n = 8, 3
    task = dl.make_task(L, 2, seed=7)
    model = _model(L, S=1, scale=1.0)
    exact = th.enumerate_types(task, n, sampler)
    mc = th.sampled_types(task, n, sampler, 40000, torch.Generator().manual_seed(0))
    with torch.no_grad():
        seq = model.seq_loss(mc.seqs, dl.labels(task, mc.seqs))[0]
        a, b = th.population_loss(model, task, exact), th.population_loss(model, task, mc)
        ca, cb = th.classify(model, task, exact), th.classify(model, task, mc)
    se = float(seq.std()) / math.sqrt(len(mc))
    assert abs(float(a) - float(b)) < 5 * se                      # 5 standard errors
    assert abs(float(ca.acc_pop) - float(cb.acc_pop)) < 5 * 0.5 / math.sqrt(len(mc))


# ----------------------------------------------------------------------------- issue 12 definitions
def test_subsets_by_complement_equal_direct_and_n29():
    for L, n in [(7, 5), (8, 6), (6, 3), (5, 5), (9, 1)]:
        direct = torch.combinations(torch.arange(L), n) if n > 1 else torch.arange(L)[:, None]
        got = th.subsets(L, n)
        assert torch.equal(got, direct), (L, n)   # same rows, same (lexicographic) order
    s = th.subsets(30, 29)                        # torch.combinations overflows here
    assert s.shape == (30, 29) and (s[:, 1:] > s[:, :-1]).all()
    assert len({tuple(r) for r in s.tolist()}) == 30
    task = dl.make_task(30, 2, seed=0)
    types = th.enumerate_types(task, 29, "B")
    assert float(types.prob.sum()) == pytest.approx(1.0, abs=1e-12)
    c = 5000.0
    model = _model(30, V=c * task.P)
    F = th.population_loss(model, task, types)
    assert F.item() == pytest.approx(math.log(29 + 1 * math.exp(-c / 29)), abs=1e-12)


def test_gamma_pattern_hand_made():
    # A, L=4, n=2, list (a1, q): patterns (q,q): 1/16·1; (a1,q): 2/16·1/2; (q,o) with 2 choices of o: 4/16·1/2
    assert th.gamma_pattern(4, 2, 2, "A") == pytest.approx(1 / 16)
    # B, L=4, n=2: {a1,q}: (1/4)·1/3; {q,o}: (1/4)·2/3
    assert th.gamma_pattern(4, 2, 2, "B") == pytest.approx(1 / 12)
    # B with M = 2 equals the joint γ = δ/L (the rarest presence pattern is the rarest determining event)
    dg = dl.delta_gamma(50, 5, 2, "B")
    assert th.gamma_pattern(50, 5, 2, "B") == pytest.approx(dg["gamma_joint"], rel=1e-12)


def test_reduced_logit_margins_hand_made_and_vs_full_model():
    # B, L=5, n=2, M=2: sets containing q are {a1,q} (target a1) and {q,o} (target q); c·(α_tgt − α_other)
    c, w = 10.0, torch.tensor([0.3, 0.1, -0.2], dtype=torch.float64)   # (w_a1, w_q, w_out)
    cf = th.reduced_configs(5, 2, 2, "B")
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    hand = min(c * (2 * sig(0.3 - 0.1) - 1), c * (2 * sig(0.1 + 0.2) - 1))
    assert float(th.reduced_logit_margins(w, cf, c)[0]) == pytest.approx(hand, rel=1e-12)
    # against the literal model's min position margin over the full support, both samplers
    for sampler, L, n, M in [("A", 6, 4, 3), ("B", 8, 4, 3)]:
        task = dl.make_task(L, M, seed=3)
        types = th.enumerate_types(task, n, sampler)
        cf = th.reduced_configs(L, n, M, sampler)
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            w = 0.5 * torch.randn(M + 1, generator=g, dtype=torch.float64) + torch.linspace(1, 0, M + 1, dtype=torch.float64)
            W = w[M].repeat(L, L)
            W[task.lists, torch.arange(L)[:, None]] = w[:M]
            model = _model(L, V=c * task.P)
            with torch.no_grad():
                model.W[0] = W
            full = float(th.classify(model, task, types).min_margin[0])
            red = float(th.reduced_logit_margins(w, cf, c)[0])
            assert red == pytest.approx(full, abs=1e-10)
            assert (red > 0) == (th.reduced_margin(w, cf) > 0)


@pytest.mark.parametrize("sampler", ["A", "B"])
def test_grid_versions_equal_pointwise(sampler):
    L, n, M = 12, 4, 3
    task = dl.make_task(L, M, seed=0)
    s = dl.sample(task, 300, n, sampler, torch.Generator().manual_seed(0))
    cf = th.reduced_configs(L, n, M, sampler)
    g = torch.Generator().manual_seed(2)
    scale = torch.linspace(0, 4, 30, dtype=torch.float64)[:, None]
    ws = 0.3 * torch.randn(30, M + 1, generator=g, dtype=torch.float64) + scale * torch.linspace(2, 0, M + 1, dtype=torch.float64)
    # exact ties between a position's target and a rival (w_k + log a = w_j + log b), around which T_N bisects
    lc = torch.log(torch.arange(1.0, n + 1, dtype=torch.float64))
    ties = torch.stack([torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64) + d for d in
                        (torch.tensor([0, 0, 0, lc[1]]), torch.tensor([0, 0, lc[2] - lc[1], 0]),
                         torch.tensor([0, -1.0, 0, 0]), torch.tensor([0, 0, -1.0 + lc[1], 0]))], 0)
    ws = torch.cat([ws, ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1)])
    tab = th.sample_table(task, s)
    assert len(tab.tgt_slot) <= M * n
    grid = th.sample_correct_grid(ws, tab)
    acc = th.reduced_acc_pop_grid(ws, cf)
    for i, w in enumerate(ws):
        assert bool(grid[i]) == bool(th.reduced_sample_correct(w, task, s).all())
        assert float(acc[i]) == pytest.approx(th.reduced_acc_pop(w, cf), abs=1e-14)
    assert 0 < int(grid.sum()) < len(ws)


def test_T_sup_kappa_definition():
    L, n, M = 100, 3, 2
    c = 4 * n * math.log(L) / dl.delta_gamma(L, n, M, "B")["delta"]
    r = th.solve_reduced_flow(L, n, M, "B", c, t_max=1e4, kappas=(0.1, 1.0))
    cf = th.reduced_configs(L, n, M, "B")
    assert 0 < r.T_sup <= r.T_kappa[0.1] <= r.T_kappa[1.0]
    # the run stops at the last κ event, where the min logit margin equals κ
    assert r.t[-1] == pytest.approx(r.T_kappa[1.0], rel=1e-12)
    assert float(th.reduced_logit_margins(torch.from_numpy(r.w[-1]), cf, c)[0]) == pytest.approx(1.0, rel=1e-5)
    # hand-made: with c tiny a margin of 1 needs α differences > 1/c ≥ 1: never reached
    r2 = th.solve_reduced_flow(10, 3, 2, "B", 0.5, t_max=50.0, kappas=(1.0,))
    assert r2.T_kappa[1.0] is None and float(np.max(r2.margin)) < 0.5


def test_eta_hypothesis_is_judged_inside_the_hypotheses_only():
    """Exploratory runs above η·λ_max = 1 are reported, not a failure; an inside run above it fails;
    no inside run with a perfect iterate is inconclusive."""
    from tdyn.papers.decision_list.claim2 import _eta_claim

    def row(regime, v):
        return {"regime": regime, "L": 4, "n": 3, "M": 2, "eps": 1.0, "eta_factor": 1.0, "seed": 0, "k_star": 3,
                "max_eta_lambda_to_kstar": v}

    c = _eta_claim([row("inside", 1.0), row("exploratory", 1.3)])
    assert c["verdict"] == "holds" and c["numbers"]["max_eta_lambda_by_regime"]["exploratory"] == 1.3
    assert _eta_claim([row("inside", 1.2), row("exploratory", 0.5)])["verdict"] == "fails"
    assert _eta_claim([row("exploratory", 1.3)])["verdict"] == "inconclusive"


@pytest.mark.parametrize("sampler", ["A", "B"])
def test_reduced_grad_bit_identical_to_autograd(sampler):
    """The written-out reverse mode of reduced_loss equals torch.autograd.grad of it bit for bit."""
    g = torch.Generator().manual_seed(0)
    for L, n, m in [(4, 2, 1), (4, 2, 4), (10, 3, 2), (100, 5, 3), (10000, 8, 4), (6, 6 if sampler == "A" else 5, 4)]:
        cf = th.reduced_configs(L, n, m, sampler)
        for c in (0.5, 37.0, 1e6):
            for scale in (0.0, 1e-6, 0.3, 5.0):
                w = scale * torch.randn(m + 1, generator=g, dtype=torch.float64)
                wr = w.clone().requires_grad_(True)
                ref, = torch.autograd.grad(th.reduced_loss(wr, cf, c), wr)
                ref[-1] = ref[-1] / (L - m) if L > m else 0.0
                got = th.reduced_grad(w, cf, c)
                assert torch.equal(got.view(torch.int64), ref.view(torch.int64)), (L, n, m, c, scale)


def test_support_margins_hand_made():
    # A, n = 4, m = 3, scores (a1, a2, q) = (3, 2, 1), best other 0.5: constraints (docs/reproductions/decision-lists.md#margin-test)
    ls, other = torch.tensor([[3.0, 2.0, 1.0]], dtype=torch.float64), torch.tensor([[0.5, -torch.inf]], dtype=torch.float64)
    l1, l2 = math.log(3), math.log(2)
    hand = min(1 - 0.5 - l1, 3 - 1 - l1, 3 - 2 - l2, 2 - 1 - l1, 2 - 0.5 - l2)
    assert float(th.support_margins(ls, other, 10, 4, "A")[0]) == hand
    assert float(th.support_margins(ls, other, 10, 4, "B")[0]) == min(0.5, 2.0, 1.0, 1.0, 1.5)
    assert float(th.support_margins(ls, other[:, :0], 3, 4, "A")[0]) == min(3 - 1 - l1, 3 - 2 - l2, 2 - 1 - l1)


@pytest.mark.parametrize("L,n,M,sampler,c", [(6, 3, 2, "B", 3.0), (6, 3, 2, "A", 3.0), (8, 4, 3, "B", 50.0),
                                             (7, 3, 2, "A", 1e3), (8, 7, 2, "B", 1e4)])
def test_hessian_blocks_and_closed_form_hvp_vs_dense_hessian(L, n, M, sampler, c):
    """The closed-form Hessian-vector product equals the autograd dense Hessian to 1e-12 of its scale; the
    per-query block bracket (docs/reproductions/decision-lists.md#hessian-blocks): its lower end is the largest
    eigenvalue of the dense W–W block (to 1e-12 relative), and λ_max of the dense Hessian lies inside
    [lower, upper]; its β and c_up bound ‖∇²_WV F‖ and λ_max(∇²_VV F)."""
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.W.normal_(generator=g)
        model.V.copy_(c * task.P + torch.randn(L, L, generator=g, dtype=torch.float64))
    H = th.dense_hessian(model, task, types)
    H = 0.5 * (H + H.T)
    op = th.HessianOperator(model, task, types)
    Hc = torch.from_numpy(np.stack([op.matvec(np.eye(1, 2 * L * L, i)[0]) for i in range(2 * L * L)], 1))
    assert (Hc - H).abs().max() <= 1e-12 * H.abs().max()
    LL = L * L
    lam = float(torch.linalg.eigvalsh(H)[-1])
    lam_A = float(torch.linalg.eigvalsh(H[:LL, :LL])[-1])
    bb = th.hessian_blocks(model, task, types)
    assert bb.lower == pytest.approx(lam_A, rel=1e-12)
    assert bb.lower <= lam * (1 + 1e-13) and lam <= bb.upper * (1 + 1e-13)
    assert bb.beta >= float(torch.linalg.matrix_norm(H[:LL, LL:], 2)) * (1 - 1e-12)
    assert bb.c_up >= float(torch.linalg.eigvalsh(H[LL:, LL:])[-1]) - 1e-14
    # the block's top eigenvector (embedded in (W, V)) has Rayleigh quotient lower
    v = torch.from_numpy(bb.vector)
    assert float(v @ H @ v) == pytest.approx(bb.lower, rel=1e-12)


@pytest.mark.parametrize("dense_max", [0, 400])
def test_probe_lambda_max_agrees_with_lanczos_and_decides_by_bracket_where_tight(dense_max, monkeypatch):
    """The probe's λ_max (the dense closed-form Hessian's top eigenvalue where 2L² ≤ DENSE_MAX, else the block
    bracket when its width is ≤ 1e-10, else Lanczos) equals Lanczos to 1e-10; with the dense path off, at a large c
    (result (2)'s regime) the bracket decides, at a small c Lanczos does; with it on (L = 8: 2L² = 128), the dense
    eigenvalue at both."""
    from tdyn.papers.decision_list import probes
    from tdyn.papers.decision_list.probes import BRACKET_TOL, lambda_max

    monkeypatch.setattr(probes, "DENSE_MAX", dense_max)
    L, n, M = 8, 7, 2
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    for c, method in ((1e9, "dense" if dense_max else "blocks"), (2.0, "dense" if dense_max else "lanczos")):
        model = _model(L)
        with torch.no_grad():
            model.V.copy_(c * task.P + torch.rand(L, L, generator=torch.Generator().manual_seed(3),
                                                  dtype=torch.float64))
        lam, up, how = lambda_max(model, task, types)
        ref = th.top_hessian_eigenvalue(model, task, types)
        assert how == method and lam <= ref * (1 + 1e-12) and ref <= up * (1 + 1e-12)
        assert lam == pytest.approx(ref, rel=BRACKET_TOL)
