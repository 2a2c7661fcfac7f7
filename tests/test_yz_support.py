"""The Y/Z model's support form (attention over each sequence's distinct keys, weighted by their
counts) against the key-position form and brute force: same logits and gradients to float tolerance."""

import pytest
import torch
import torch.nn.functional as F

from tdyn.papers.scan_snap.data import ScanSnapDataConfig, build, syn_medium
from tdyn.papers.scan_snap.kernels import key_support
from tdyn.papers.scan_snap.model import YZConfig, YZModel


def test_key_support_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 9, (3, 5, 12), generator=g)
    idx, cnt = key_support(x, M=9)
    for s in range(3):
        for b in range(5):
            keys = x[s, b, :-1].tolist()
            want = sorted(set(keys))
            P = len(want)
            assert idx[s, b, :P].tolist() == want
            assert cnt[s, b, :P].tolist() == [keys.count(k) for k in want]
            assert (cnt[s, b, P:] == 0).all() and (idx[s, b, P:] == 0).all()
    wide, _ = key_support(x, M=9, width=9)
    assert wide.shape[-1] == 9
    with pytest.raises(ValueError, match="distinct keys"):
        key_support(x, M=9, width=2)


@pytest.mark.parametrize("normalize, residual", [(True, False), (False, False), (True, True), (False, True)])
def test_support_form_equals_key_positions(normalize, residual):
    d = build(ScanSnapDataConfig(**syn_medium(5)))
    S = 4
    m = YZModel(YZConfig(M=d.M, init="torch_default", normalize=normalize, residual=residual), S=S).double()
    m.reset_parameters([torch.Generator().manual_seed(i) for i in range(S)], [3.0] * S)
    g = torch.Generator().manual_seed(1)
    xs, ys = zip(*[d.sample(32, 40, g) for _ in range(S)])
    x, y = torch.stack(xs), torch.stack(ys)
    idx, count = key_support(x, d.M, width=int((d.table > 0).sum(1).max()))
    support = (idx, count.double().log())
    grads = []
    for sup in (support, None):
        out = m(x, sup)
        loss = F.cross_entropy(out.reshape(-1, d.M), y.reshape(-1))
        grads.append((out.detach(), *torch.autograd.grad(loss, [m.Y, m.Z])))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    with pytest.raises(TypeError, match="logs of the key counts"):    # the counts themselves: refused
        m(x, (idx, count))
    # the attended vector against a brute-force loop over key positions
    Z = m.Z.detach()
    s, i = 1, 3
    keys, q = x[s, i, :-1], x[s, i, -1]
    w = torch.softmax(Z[s, q, keys], 0)
    Xb = torch.zeros(d.M, dtype=torch.float64).index_add_(0, keys, w)
    u = Xb / Xb.norm() if normalize else Xb
    if residual:                                  # ū = LN(LN(Xᵀb) + e_query)
        u = u + F.one_hot(q, d.M).double()
        u = u / u.norm() if normalize else u
    torch.testing.assert_close(grads[0][0][s, i], u @ m.Y.detach()[s], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_last, L", [(10, 128), (5, 40), (3, 128), (5, 6)])
def test_support_decoder_equals_dense(num_last, L):
    """The decoder on the support (embedding bags; u's gradient by the kernel :func:`support_dots` picks)
    equals the dense Yᵀ LN(Xᵀb): logits and the gradients of Y and Z (float64)."""
    from tdyn.papers.scan_snap.kernels import key_bags, support_decoder_applies
    d = build(ScanSnapDataConfig(**syn_medium(num_last)))
    S = 3
    m = YZModel(YZConfig(M=d.M, init="torch_default"), S=S).double()
    m.reset_parameters([torch.Generator().manual_seed(i) for i in range(S)], [3.0] * S)
    g = torch.Generator().manual_seed(1)
    xs, ys = zip(*[d.sample(32, L, g) for _ in range(S)])
    x, y = torch.stack(xs), torch.stack(ys)
    idx, count = key_support(x, d.M, width=min(L - 1, int((d.table > 0).sum(1).max())))
    sup = (idx, count.double().log())
    assert support_decoder_applies(m.cfg, d.M, sup[0].shape[-1])
    res = []
    for full in (sup + key_bags(sup[0], d.M), sup):
        out = m(x, full)
        loss = F.cross_entropy(out.reshape(-1, d.M), y.reshape(-1))
        res.append((out.detach(), *torch.autograd.grad(loss, [m.Y, m.Z])))
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    # the same with only the query column of x (what the task's training batch holds)
    torch.testing.assert_close(m(x[..., -1:], sup + key_bags(sup[0], d.M)), res[0][0], rtol=0, atol=0)


def test_support_dots_kernels_agree():
    """u's gradient in the support decoder, ⟨G[s, b], Y[s, key]⟩ per support entry: the sampled dense-dense
    product, one dot product per entry and the dense G Yᵀ gathered give the same values (float64: to
    rounding; float32: to float tolerance), on supports padded with token 0 as the task packs them."""
    from tdyn.papers.scan_snap.kernels import support_dots
    d = build(ScanSnapDataConfig(**syn_medium(5)))
    g = torch.Generator().manual_seed(4)
    S = 3
    x = torch.stack([d.sample(16, 40, g)[0] for _ in range(S)])
    keys, count = key_support(x, d.M, width=int((d.table > 0).sum(1).max()))
    assert (count == 0).any()                                   # padding entries are in the pattern
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        G = torch.randn(S, 16, d.M, generator=g, dtype=dtype)
        Y = torch.randn(S, d.M, d.M, generator=g, dtype=dtype)
        want = torch.stack([torch.stack([Y[s, keys[s, b]] @ G[s, b] for b in range(16)]) for s in range(S)])
        for kernel in ("sddmm", "dots", "dense", None):
            torch.testing.assert_close(support_dots(G, Y, keys, kernel=kernel), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="unknown kernel"):
        support_dots(G, Y, keys, kernel="bmm")


def test_unit_softmax_is_normalized_softmax_with_its_gradient():
    """LN(softmax(a)) on the support: the forward is F.normalize(softmax(a))'s arithmetic (the same bits),
    the closed-form gradient equals autograd's through F.normalize and softmax (float64, gradcheck too),
    padding at −inf gets value 0 and gradient 0, and a snapped row (logits 200 apart) stays finite."""
    from tdyn.papers.scan_snap.kernels import unit_softmax
    g = torch.Generator().manual_seed(5)
    a = torch.randn(4, 6, 7, generator=g, dtype=torch.float64)
    a[..., 5:] = float("-inf")
    a[0, 0] = torch.tensor([200.0, 0.0, -3.0, 1.0, 0.5, float("-inf"), float("-inf")])
    for dt in (torch.float32, torch.float64):
        assert torch.equal(unit_softmax(a.to(dt)), F.normalize(torch.softmax(a.to(dt), -1), dim=-1))
    w = torch.randn(a.shape, generator=g, dtype=torch.float64)
    grads = []
    for f in (unit_softmax, lambda t: F.normalize(torch.softmax(t, -1), dim=-1)):
        t = a.clone().requires_grad_()
        (f(t) * w).sum().backward()
        grads.append(t.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)
    assert torch.isfinite(grads[0]).all() and (grads[0][..., 5:] == 0).all()
    assert torch.autograd.gradcheck(unit_softmax, (torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_(),))


def test_key_bags_transpose_the_support():
    from tdyn.papers.scan_snap.kernels import key_bags
    g = torch.Generator().manual_seed(3)
    idx, _ = key_support(torch.randint(0, 11, (2, 6, 9), generator=g), M=11)
    order, counts, sample = key_bags(idx, 11)
    flat = idx.reshape(2, -1)
    P = idx.shape[-1]
    for s in range(2):
        assert flat[s][order[s]].tolist() == sorted(flat[s].tolist())
        assert counts[s].tolist() == [flat[s].tolist().count(t) for t in range(11)]
        assert sample[s].tolist() == [e // P for e in order[s].tolist()]   # each entry's sample


def test_support_decoder_is_chosen_where_it_pays():
    from tdyn.papers.scan_snap.kernels import support_decoder_applies
    cfg = YZConfig(M=240)
    assert support_decoder_applies(cfg, 240, 20) and support_decoder_applies(cfg, 79, 20)
    assert not support_decoder_applies(cfg, 34, 20)                    # Syn-Small: dense
    for other in (dict(residual=True), dict(include_query_key=True), dict(parameterization="embedding")):
        assert not support_decoder_applies(cfg.model_copy(update=other), 240, 20)


@pytest.mark.parametrize("model", [{}, {"residual": True}, {"parameterization": "embedding", "d": 8},
                                   {"include_query_key": True}, {"normalize": False}],
                         ids=["plain", "residual", "embedding", "query-key", "unnormalized"])
def test_training_batch_gives_the_loss_of_the_full_batch(model):
    """The task's training batch (x only its query column where attention runs on the support) gives the
    loss the full batch gives, for every model option, bit for bit: the same draws, nothing else read."""
    from tdyn.config import load_config
    from tdyn.tasks import build_task
    from tdyn.papers.scan_snap.task import yz_config
    from tdyn.seeding import generator
    from tdyn.train.trainer import expand_members

    cfg = load_config(yz_config(syn_medium(3), init="torch_default", seeds=[0, 1]) | {"model": {"init": "torch_default", **model}})
    task = build_task(cfg, expand_members(cfg))
    x, y, sup = task.sample(generator(0, "data"))
    fx, fy, fsup = task.full_sample(generator(0, "data"))
    assert x.shape[-1] == (fx.shape[-1] if model.get("include_query_key") else 1)
    assert torch.equal(x, fx[..., -x.shape[-1]:]) and torch.equal(y, fy)
    assert all(torch.equal(a, b) for a, b in zip(sup, fsup)) and sup[1].dtype == torch.float32
    stack = lambda b: tuple(t.expand(2, *t.shape) if i != 2 else tuple(s.expand(2, *s.shape) for s in t)  # noqa: E731
                            for i, t in enumerate(b))
    with torch.no_grad():
        assert torch.equal(task.loss(stack((x, y, sup))), task.loss(stack((fx, fy, fsup))))


@pytest.mark.parametrize("model", [{}, {"residual": True}, {"include_query_key": True}, {"normalize": False},
                                   {"parameterization": "embedding", "d": 8}],
                         ids=["plain", "residual", "query-key", "unnormalized", "embedding"])
@pytest.mark.parametrize("num_last", [1, 10])
def test_streams_in_one_pass_and_the_rows_with_a_gradient(model, num_last):
    """``sample_streams`` (what the trainer calls: all data streams drawn in one pass) gives each stream's
    ``sample`` stacked, bit for bit; and ``grad_rows`` holds every row of Y and Z that has a gradient on
    a full batch (the optimizer updates only those), while rows outside stay exactly zero."""
    from tdyn.config import load_config
    from tdyn.tasks import build_task
    from tdyn.tasks.base import stack_batches
    from tdyn.papers.scan_snap.task import yz_config
    from tdyn.seeding import generator
    from tdyn.train.trainer import expand_members

    cfg = load_config(yz_config(syn_medium(num_last), init="torch_default", seeds=[0, 1, 2])
                      | {"model": {"init": "torch_default", **model}})
    task = build_task(cfg, expand_members(cfg))
    one = stack_batches([task.sample(generator(s, "data")) for s in (0, 1, 2)])
    many = task.sample_streams([generator(s, "data") for s in (0, 1, 2)])
    flat = lambda b: [b[0], b[1], *b[2]]  # noqa: E731
    assert len(flat(one)) == len(flat(many)) and all(torch.equal(a, b) for a, b in zip(flat(one), flat(many)))
    if model.get("parameterization") == "embedding":
        assert task.grad_rows == {}
        return
    task.loss(task.full_sample([generator(s, "data") for s in (0, 1, 2)])).sum().backward()
    for name in ("Y", "Z"):
        grad = getattr(task.model, name).grad
        moved = (grad != 0).any(2).any(0).nonzero().flatten()
        assert set(moved.tolist()) <= set(task.grad_rows[name].tolist()), name
        assert len(moved) > 0 and len(task.grad_rows[name]) < grad.shape[1], name


def test_a_subclass_with_its_own_sampler_trains_on_its_own_batches():
    """A ScanSnapTask subclass that overrides ``sample`` gets its own batches in training (sample_streams
    falls back to them, stream by stream) and no ``grad_rows`` (its tokens need not be the table's)."""
    from tdyn.config import load_config
    from tdyn.tasks.base import stack_batches
    from tdyn.papers.scan_snap.task import ScanSnapTask, yz_config
    from tdyn.seeding import generator
    from tdyn.train.trainer import expand_members

    class Shifted(ScanSnapTask):
        def sample(self, gen):
            x, y, support = super().sample(gen)
            return x, (y + 1) % self.dist.M, support

    cfg = load_config(yz_config(syn_medium(3), seeds=[0, 1]))
    task = Shifted(cfg, expand_members(cfg))
    ref = stack_batches([task.sample(generator(s, "data")) for s in (0, 1)])
    got = task.sample_streams([generator(s, "data") for s in (0, 1)])
    assert torch.equal(got[1], ref[1]) and task.grad_rows == {}
    assert ScanSnapTask(cfg, expand_members(cfg)).grad_rows.keys() == {"Y", "Z"}
