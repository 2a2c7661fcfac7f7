"""Bietti et al. 2023 (docs/reproductions/birth.md#tests): analytic answers for the associative memories, the
sampler's statistics against its bigram table, the model's equations against loops, the speed path against the
model; each test can fail."""

import math

import pytest
import torch

from tdyn.papers.birth import data as bd
from tdyn.papers.birth import kernels
from tdyn.papers.birth import theory as th
from tdyn.papers.birth.model import BirthModelConfig, MemoryTransformer
from tdyn.papers.birth.probes import icl_measures
from tdyn.papers.birth.task import init_member

F64 = torch.float64
TB = bd.tables(bd.BirthData())


def _model(d=16, T=12, S=2, N=None, final_ffn=False, seed=0):
    N = N or TB.N
    m = MemoryTransformer(BirthModelConfig(N, T, d=d, final_ffn=final_ffn, dtype=F64), S=S)
    for i in range(S):
        init_member(m, i, seed + i)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():                 # trained matrices away from their small init, so attention is not flat
        for name in m.cfg.trained:
            getattr(m, name).copy_(torch.randn(getattr(m, name).shape, generator=g, dtype=F64) / math.sqrt(d))
    return m


# ---------------------------------------------------------------- the bigram table and the sampler
def test_tinyshakespeare_table_is_the_authors_counts():
    assert TB.N == 65 and len(TB.chars) == 65 and TB.chars[0] == "\n" and TB.chars[-1] == "z"
    c = bd._counts()
    assert sum(c["unigrams"]) == 1115394                       # tiny Shakespeare's characters (prepare.py's comment)
    assert sum(map(sum, c["bigrams"])) == 1115393               # every adjacent pair once
    assert torch.allclose(TB.bigram.sum(1), torch.ones(65, dtype=F64))
    # the authors' fixed triggers: the 5 most frequent characters, in argsort order
    assert [TB.chars[i] for i in bd.triggers_fixed(TB, 5)] == ["a", "o", "t", "e", " "]


def test_sampler_follows_the_triggers_and_counts_occurrences():
    b = bd.sample(64, 40, TB, 5, torch.Generator().manual_seed(0))
    x, y, occ, q, o = b["x"], b["y"], b["occ"], b["q"], b["o"]
    assert torch.equal(x[:, 1:], y[:, :-1])
    for s in range(64):
        out = dict(zip(q[s].tolist(), o[s].tolist()))
        seen = {}
        for t in range(40):
            z = int(x[s, t])
            if z in out:                                        # a trigger: its output follows, counted
                seen[z] = seen.get(z, 0) + 1
                assert int(y[s, t]) == out[z] and int(occ[s, t]) == seen[z]
            else:
                assert int(occ[s, t]) == 0


def test_transitions_match_the_bigram_table():
    # every non-trigger transition z → z' of 2000 × 128 draws, counted by brute force, against π_b(z'|z):
    # the 20 most visited rows within 5 standard errors of a multinomial per cell
    n, T = 2000, 128
    b = bd.sample(n, T, TB, 5, torch.Generator().manual_seed(1))
    keep = b["occ"] == 0
    src, dst = b["x"][keep], b["y"][keep]
    counts = torch.zeros(TB.N, TB.N, dtype=F64)
    counts.index_put_((src, dst), torch.ones_like(src, dtype=F64), accumulate=True)
    rows = counts.sum(1).argsort(descending=True)[:20]
    for r in rows:
        tot = counts[r].sum()
        p = TB.bigram[r]
        se = (p * (1 - p) / tot).sqrt().clamp_min(1 / tot)
        assert float(((counts[r] / tot - p).abs() / se).max()) < 5, int(r)
    # the first token from π_u, and uniform outputs
    first = torch.bincount(b["x"][:, 0], minlength=TB.N).to(F64) / n
    assert float((first - TB.unigram).abs().max()) < 5 * math.sqrt(0.25 / n)
    assert float(b["o"].to(F64).mean()) == pytest.approx(32.0, abs=5 * math.sqrt((65**2 - 1) / 12 / b["o"].numel()))


def test_train_and_test_pools_and_random_triggers():
    g = torch.Generator().manual_seed(2)
    tr = bd.sample(200, 8, TB, 3, g, outputs="train")["o"]
    te = bd.sample(200, 8, TB, 3, g, outputs="test")["o"]
    assert int(tr.max()) < 48 <= int(te.min()) and int(te.max()) <= 64        # ⌊0.75 · 65⌋ = 48
    b = bd.sample(20000, 2, TB, 1, torch.Generator().manual_seed(3), fixed_triggers=False)
    freq = torch.bincount(b["q"][:, 0], minlength=TB.N).to(F64) / 20000         # K = 1: one draw from π_u
    assert float((freq - TB.unigram).abs().max()) < 5 * math.sqrt(0.25 / 20000)
    q = bd.sample(500, 2, TB, 7, torch.Generator().manual_seed(4), fixed_triggers=False)["q"]
    assert all(len(set(r.tolist())) == 7 for r in q)                            # without replacement


@pytest.mark.parametrize("pool,lo,hi", [("train", 0, 48), ("test", 48, 65)])
def test_trigger_pools_draw_only_from_their_tokens(pool, lo, hi):
    # brute force over 4000 sequences of K = 5: every trigger inside the pool, 5 distinct per sequence, the occurrence
    # counter fires only on them, and every pool token with π_u mass ≥ 1e-3 is drawn at least once
    b = bd.sample(4000, 24, TB, 5, torch.Generator().manual_seed(6), fixed_triggers=False, triggers=pool)
    q = b["q"]
    assert int(q.min()) >= lo and int(q.max()) < hi
    assert all(len(set(r.tolist())) == 5 for r in q)
    inside = torch.zeros(len(q), TB.N, dtype=torch.bool)
    inside.scatter_(1, q, True)
    trig_at = torch.gather(inside, 1, b["x"])                      # is z_t one of its sequence's triggers
    assert torch.equal(trig_at, b["occ"] > 0)
    drawn = set(q.flatten().tolist())
    frequent = {v for v in range(lo, hi) if float(TB.unigram[v]) >= 1e-3}
    assert frequent <= drawn and len(frequent) >= 5


def test_a_trigger_pool_is_pi_u_restricted_to_it():
    # K = 1: one draw from π_u conditioned on the pool, within 5 standard errors per token on 20000 draws
    n = 20000
    for pool, (lo, hi) in (("train", (0, 48)), ("test", (48, 65))):
        q = bd.sample(n, 2, TB, 1, torch.Generator().manual_seed(7), fixed_triggers=False, triggers=pool)["q"][:, 0]
        freq = torch.bincount(q, minlength=TB.N).to(F64) / n
        law = torch.zeros(TB.N, dtype=F64)
        law[lo:hi] = TB.unigram[lo:hi] / TB.unigram[lo:hi].sum()
        assert float((freq - law).abs().max()) < 5 * math.sqrt(0.25 / n), pool
    # the pool "all" keeps the draws of the sampler without a pool (the committed evidence's streams)
    a = bd.sample(50, 8, TB, 5, torch.Generator().manual_seed(8), fixed_triggers=False)
    c = bd.sample(50, 8, TB, 5, torch.Generator().manual_seed(8), fixed_triggers=False, triggers="all")
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_sampling_is_seeded_and_the_dirichlet_law_is_a_law():
    a = bd.sample(8, 16, TB, 5, torch.Generator().manual_seed(5))
    b = bd.sample(8, 16, TB, 5, torch.Generator().manual_seed(5))
    assert all(torch.equal(a[k], b[k]) for k in a)
    syn = bd.tables(bd.BirthData(bigrams="dirichlet", vocab=30, dirichlet_seed=1))
    assert syn.N == 30 and torch.allclose(syn.bigram.sum(1), torch.ones(30, dtype=F64))
    assert torch.equal(syn.bigram, bd.tables(bd.BirthData(bigrams="dirichlet", vocab=30, dirichlet_seed=1)).bigram)


@pytest.mark.parametrize("fixed", [True, False])
def test_the_chain_is_its_rule_written_per_sequence_and_position(fixed):
    """data.chain (one NumPy loop over t for every row) against the rule as plain Python, sequence by sequence:
    z_{t+1} = o_k if z_t = q_k else the first j with u_t ≤ CDF(π_b(·|z_t))_j; occ counts each trigger."""
    dr = bd.draws(12, 20, TB, 5, torch.Generator().manual_seed(6), fixed_triggers=fixed)
    got = bd.chain(dr, TB)
    cdf = TB.bigram.cumsum(1).tolist()
    for b in range(12):
        out = dict(zip(dr["q"][b].tolist(), dr["o"][b].tolist()))
        z, seen, occ = [int(dr["z1"][b])], {}, []
        for t in range(20):
            v = z[-1]
            if v in out:
                seen[v] = seen.get(v, 0) + 1
                occ.append(seen[v])
                z.append(out[v])
            else:
                occ.append(0)
                u = float(dr["u"][b, t])
                z.append(min(sum(c < u for c in cdf[v]), TB.N - 1))
        assert got["x"][b].tolist() == z[:20] and got["y"][b].tolist() == z[1:] and got["occ"][b].tolist() == occ
    assert int((got["occ"] >= 2).sum()) > 0


@pytest.mark.parametrize("data", [{}, {"fixed_triggers": False, "triggers": "train", "ood_triggers": "test"},
                                  {"outputs": "bigram"}])
def test_the_tasks_batched_streams_are_each_stream_sampled_alone(data):
    """BirthTask.sample_streams (every stream's draws, one chain over their rows) gives the bits of sample(g) per
    stream, stacked (the trainer's default), step after step."""
    from tdyn.config import load_config
    from tdyn.papers.birth.task import birth_config
    from tdyn.tasks import build_task
    from tdyn.tasks.base import Task
    from tdyn.train.trainer import expand_members

    rc = load_config(birth_config(seeds=[0, 1, 2], d=8, T=24, batch_size=5, data=data))
    task = build_task(rc, expand_members(rc))
    ga = [torch.Generator().manual_seed(s) for s in (0, 1, 2)]
    gb = [torch.Generator().manual_seed(s) for s in (0, 1, 2)]
    for _ in range(3):
        a, b = task.sample_streams(ga), Task.sample_streams(task, gb)
        assert set(a) == set(b) == {"x", "y", "occ"}
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert not torch.equal(a["x"][0], a["x"][1])


def test_bad_data_configs_are_refused():
    with pytest.raises(ValueError, match="more than the vocabulary"):
        bd.BirthData(bigrams="dirichlet", vocab=8, k=9)
    with pytest.raises(ValueError, match="data.fixed_triggers = false"):
        bd.BirthData(triggers="train")
    with pytest.raises(ValueError, match="data.triggers = 'train'"):
        bd.BirthData(fixed_triggers=False, ood_triggers="test")
    with pytest.raises(ValueError, match="17 tokens of the trigger pool 'test'"):
        bd.BirthData(fixed_triggers=False, triggers="train", ood_triggers="test", k=18)
    bd.BirthData(fixed_triggers=False, triggers="train", ood_triggers="test", k=17)     # the largest K that fits


# ---------------------------------------------------------------- associative memories
def test_memory_with_orthonormal_embeddings_recalls_exactly():
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=F64))
    U, V = Q[:20], Q[5:25]                                  # 20 orthonormal outputs, 20 orthonormal inputs
    W = th.memory(U, V)
    assert torch.allclose(U @ W @ V.T, torch.eye(20, dtype=F64), atol=1e-12)   # u_jᵀ W v_i = δ_ij
    assert float(th.recall(W, U, V)) == 1.0
    # a memory of the pairs i → σ(i) recalls i only where σ(i) = i: here 20 − 6 of 20
    perm = torch.arange(20)
    perm[:6] = torch.tensor([1, 2, 0, 4, 5, 3])
    assert float(th.recall(th.memory(U[perm], V), U, V)) == pytest.approx(14 / 20)
    assert float(th.recall(th.memory(U[perm], V), U, V, targets=perm)) == 1.0


def test_recall_by_hand_on_a_two_by_two_memory():
    U = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    W = torch.tensor([[0.2, 0.9], [0.1, 0.5]], dtype=F64)  # v_0 → scores (0.2, 0.1): 0 ✓; v_1 → (0.9, 0.5): 0 ✗
    assert float(th.recall(W, U, U)) == 0.5


def test_induction_memories_make_an_induction_head():
    # at d = 256 with random embeddings the three memories recall every pair, and the model holding them
    # predicts ≥ 85 % of the in-context outputs (measured 0.905 with these seeds) through the two attentions
    T = 64
    m = MemoryTransformer(BirthModelConfig(TB.N, T, d=256, dtype=F64), S=1)
    init_member(m, 0, 0)
    trig, outs = bd.triggers_fixed(TB, 5), torch.arange(TB.N)
    r0 = th.recall_scores(m, out_tokens=outs, triggers=trig)
    assert float(r0["W_O2"]) < 0.2 and float(r0["W_K1"]) < 0.2              # the random init stores nothing
    with torch.no_grad():
        for k, v in th.induction_memories(m, triggers=trig, out_tokens=outs).items():
            getattr(m, k).copy_(v)
    r = th.recall_scores(m, out_tokens=outs, triggers=trig)
    assert all(float(v) == 1.0 for v in r.values()), r
    b = bd.sample(64, T, TB, 5, torch.Generator().manual_seed(1))
    with torch.no_grad():
        meas = icl_measures(m, b["x"][None], b["y"][None], b["occ"][None])
    assert float(meas["attn1_prev"]) > 0.99 and float(meas["acc_out"]) > 0.85
    assert float(meas["acc_first"]) < 0.1                   # first occurrences cannot be copied from the context


# ---------------------------------------------------------------- the model's equations and the speed path
def test_forward_equals_the_equations_written_as_loops():
    m = _model(d=5, T=4, S=2, N=7, final_ffn=True)
    z = torch.tensor([[[1, 3, 3, 0], [6, 2, 1, 1]], [[0, 0, 5, 4], [2, 3, 2, 3]]])   # (S, B, T)
    xi = m(z)
    d = 5
    for s in range(2):
        for b in range(2):
            x = [m.w_E[s, z[s, b, t]] + m.p[s, t] for t in range(4)]
            def attend(h, W_K, t):
                sc = torch.stack([h[t] @ (W_K @ h[u]) / math.sqrt(d) for u in range(t + 1)])
                beta = torch.softmax(sc, 0)
                return sum(beta[u] * h[u] for u in range(t + 1))
            h1 = [x[t] + m.W_O1[s] @ m.W_V1[s] @ attend(x, m.W_K1[s], t) for t in range(4)]
            h2 = [h1[t] + m.W_O2[s] @ m.W_V2[s] @ attend(h1, m.W_K2[s], t) for t in range(4)]
            h2 = [h + m.W_F[s] @ h for h in h2]
            for t in range(4):
                torch.testing.assert_close(xi[s, b, t], m.W_U[s] @ h2[t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("final_ffn", [False, True])
def test_speed_path_equals_the_model_values_and_gradients(final_ffn):
    m = _model(d=12, T=10, S=3, final_ffn=final_ffn)
    b = bd.sample(4, 10, TB, 5, torch.Generator().manual_seed(2))
    z = b["x"].expand(3, -1, -1)
    y = b["y"].expand(3, -1, -1)
    mask = torch.ones_like(z, dtype=torch.bool)
    fast = kernels.masked_ce(kernels.logits(m, z), y, mask)
    ga = torch.autograd.grad(fast.sum(), list(m.parameters()))
    slow = kernels.masked_ce(m(z), y, mask)
    gb = torch.autograd.grad(slow.sum(), list(m.parameters()))
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    for a, c in zip(ga, gb):
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("final_ffn", [False, True])
@pytest.mark.parametrize("loss_on", ["all", "outputs"])
def test_fused_loss_equals_the_model_values_and_gradients(final_ffn, loss_on):
    """kernels.masked_loss (its backward written by hand) against autograd through model.py, float64, with a
    different upstream weight per member (the trainer's zeroed diverged members included): equal to 1e-12."""
    m = _model(d=12, T=10, S=3, final_ffn=final_ffn)
    b = bd.sample(4, 10, TB, 5, torch.Generator().manual_seed(2))
    z, y = b["x"].expand(3, -1, -1), b["y"].expand(3, -1, -1)
    mask = (torch.ones_like(z, dtype=torch.bool) if loss_on == "all" else (b["occ"] >= 2).expand(3, -1, -1))
    assert 0 < int(mask[0].sum()) < mask[0].numel() or loss_on == "all"
    w = torch.tensor([1.0, 0.0, 2.5], dtype=F64)
    fast = kernels.masked_loss(m, z, y, mask)
    ga = torch.autograd.grad((fast * w).sum(), list(m.parameters()))
    slow = kernels.masked_ce(m(z), y, mask)
    gb = torch.autograd.grad((slow * w).sum(), list(m.parameters()))
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    assert [n for n, _ in m.named_parameters()] == list(m.cfg.trained)
    for a, c in zip(ga, gb):
        assert float(c.abs().max()) > 1e-3                  # every trained matrix has a gradient to compare
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)
    assert float(ga[0][1].abs().max()) == 0.0               # member 1's weight 0: no gradient


def test_fused_forward_equals_the_model_layers_and_shared_tokens():
    """kernels.forward: the logits and both attentions equal model.layers (float64, to 1e-12); tokens (B, T)
    shared by the members give the same as the same tokens expanded to (S, B, T)."""
    m = _model(d=8, T=9, S=2, final_ffn=True)
    z = bd.sample(3, 9, TB, 5, torch.Generator().manual_seed(4))["x"]
    f, L = kernels.forward(m, z), m.layers(z)
    torch.testing.assert_close(f["xi"], m(z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f["beta1"].view(2, 3, 9, 9), L["beta1"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f["beta2"].view(2, 3, 9, 9), L["beta2"], rtol=1e-12, atol=1e-12)
    assert torch.equal(kernels.forward(m, z.expand(2, -1, -1))["xi"], f["xi"])


def test_fused_loss_float32_at_the_full_shape_is_the_model_to_float32_rounding():
    """At d = T = 32, batch 8, float32 (the reproductions' dtype): the fused loss and gradients within float32
    rounding of model.py's (relative 1e-4 of each gradient's largest entry)."""
    m = MemoryTransformer(BirthModelConfig(TB.N, 32, d=32), S=2)
    for i in range(2):
        init_member(m, i, i)
    b = bd.sample(8, 32, TB, 5, torch.Generator().manual_seed(5))
    mask = b["occ"] >= 2
    fast = kernels.masked_loss(m, b["x"], b["y"], mask)
    ga = torch.autograd.grad(fast.sum(), list(m.parameters()))
    slow = kernels.masked_ce(m(b["x"]), b["y"].expand(2, -1, -1), mask.expand(2, -1, -1))
    gb = torch.autograd.grad(slow.sum(), list(m.parameters()))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    for a, c in zip(ga, gb):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-4 * float(c.abs().max()))


def test_masked_ce_by_hand():
    xi = torch.zeros(1, 1, 2, 3, dtype=F64)
    xi[0, 0, 0] = torch.tensor([math.log(2), 0.0, 0.0])     # p(0) = 1/2
    y = torch.tensor([[[0, 2]]])
    assert float(kernels.masked_ce(xi, y, torch.tensor([[[True, False]]]))) == pytest.approx(math.log(2))
    assert float(kernels.masked_ce(xi, y, torch.tensor([[[False, True]]]))) == pytest.approx(math.log(3))


def test_init_is_the_authors_and_depends_on_the_seed_only():
    m = MemoryTransformer(BirthModelConfig(TB.N, 256, d=256, dtype=F64), S=2)
    init_member(m, 0, 7)
    init_member(m, 1, 7)
    assert torch.equal(m.w_E[0], m.w_E[1]) and torch.equal(m.W_K1[0], m.W_K1[1])
    assert abs(float(m.w_E[0].std()) - 1) < 0.02 and abs(float(m.p[0].std()) - 1) < 0.02      # N(0, 1)
    b = 1 / 16
    W_K2, W_O2 = m.W_K2.detach()[0], m.W_O2.detach()[0]
    assert float(W_K2.abs().max()) <= b and abs(float(W_O2.std()) - b / math.sqrt(3)) < 0.002      # U(±1/√d)
