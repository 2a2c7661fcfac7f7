"""Row-sparse gradients (tdyn.models.row_sparse): the format, the optimizer's fused SGD on them against
its dense update, and Scan and Snap's kernels that produce them against model.py's dense gradients."""

import pytest
import torch
import torch.nn.functional as F

from tdyn.config import GroupConfig
from tdyn.models.row_sparse import row_block, row_grad
from tdyn.train.optim import EnsembleOptimizer


def test_row_grad_round_trip_and_other_patterns():
    g = torch.Generator().manual_seed(0)
    values, rows = torch.randn(3, 2, 4, generator=g), torch.tensor([1, 4])
    sparse = row_grad(values, rows, 6)
    dense = torch.zeros(3, 6, 4)
    dense[:, rows] = values
    assert sparse.shape == (3, 6, 4) and torch.equal(sparse.to_dense(), dense)
    got_rows, got = row_block(sparse)
    assert torch.equal(got_rows, rows) and torch.equal(got, values)
    assert row_block(dense) is None
    assert torch.equal(row_block(dense.to_sparse(2))[1], values)   # torch's own sparse form of the same block
    dense[0, 2] = 1.0
    assert row_block(dense.to_sparse(2)) is None              # rows differ between members: not a block
    assert row_block(row_grad(values, torch.tensor([4, 1]), 6)) is None      # rows not increasing
    assert row_block(row_grad(values[:, :0], torch.tensor([], dtype=torch.long), 6))[1].shape == (3, 0, 4)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("state_rows, grad_rows", [
    (None, [0, 1, 2, 3, 4, 5, 6, 7, 8]),   # every row, the gradient on all of them
    (None, [2, 5]),                        # every row can hold momentum, the gradient on two
    ([1, 2, 3, 4], [1, 2, 3, 4]),          # one range, covered (the Fig 6 case: a view, no copies)
    ([1, 2, 3, 4], [2, 4]),                # one range, the gradient on part of it
    ([0, 3, 7], [0, 7]),                   # rows gathered and written back
])
def test_fused_row_sgd_equals_the_dense_update(momentum, state_rows, grad_rows):
    """SGD from a row-sparse gradient (fused: m = g + μm, p -= lr·m) equals the dense update from the
    same gradient densified, to rounding (FMA), over steps with a diverged member; rows outside
    ``grad_rows`` move only by their momentum and rows without any never move."""
    gen = torch.Generator().manual_seed(1)
    S, N, D = 3, 9, 5
    lrs = torch.tensor([0.05, 0.3, 0.1])
    x0 = torch.randn(S, N, D, generator=gen)
    hint = None if state_rows is None else {"p": torch.tensor(state_rows)}
    ps = [torch.nn.Parameter(x0.clone()) for _ in range(2)]
    opts = [EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], lr=1.0, momentum=momentum)},
                              {"g": lrs}, hint) for p in ps]
    rows = torch.tensor(grad_rows)
    for t in range(6):
        active = torch.tensor([True, t < 3, True])
        values = torch.randn(S, len(rows), D, generator=gen)
        ps[0].grad = row_grad(values, rows, N)
        ps[1].grad = ps[0].grad.to_dense()
        for p, opt in zip(ps, opts):
            opt.step(set(), active)
        torch.testing.assert_close(ps[0].detach(), ps[1].detach(), rtol=1e-6, atol=1e-6)
        for k in opts[0].state:
            torch.testing.assert_close(opts[0].state[k], opts[1].state[k], rtol=1e-6, atol=1e-6)
        if t == 2:
            kept = ps[0].detach()[1].clone()
    moved = (ps[0].detach() != x0).any(2).any(0).nonzero().flatten().tolist()
    assert moved == grad_rows
    assert torch.equal(ps[0].detach()[1], kept)       # the member inactive from step 3 on: kept as it was


@pytest.mark.parametrize("kw", [{"optimizer": "adam"}, {"weight_decay": 0.1, "momentum": 0.9}])
def test_a_row_sparse_gradient_elsewhere_is_densified(kw):
    """Adam, or SGD with weight decay (every row moves): the gradient densified, the dense update's bits."""
    gen = torch.Generator().manual_seed(2)
    x0 = torch.randn(2, 6, 3, generator=gen)
    ps = [torch.nn.Parameter(x0.clone()) for _ in range(2)]
    opts = [EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], lr=0.1, **kw)}, {"g": torch.tensor([0.1, 0.2])})
            for p in ps]
    for _ in range(3):
        ps[0].grad = row_grad(torch.randn(2, 2, 3, generator=gen), torch.tensor([1, 3]), 6)
        ps[1].grad = ps[0].grad.to_dense()
        for opt in opts:
            opt.step(set(), torch.ones(2, dtype=torch.bool))
        assert torch.equal(ps[0].detach(), ps[1].detach())


def test_row_sparse_grad_rows_outside_the_state_rows_fall_back():
    """A gradient on a row outside the task's ``grad_rows``: densified, the dense update's bits (which,
    trusting ``grad_rows``, leaves that row alone)."""
    ps = [torch.nn.Parameter(torch.ones(2, 6, 3)) for _ in range(2)]
    opts = [EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], lr=1.0, momentum=0.5)},
                              {"g": torch.tensor([1.0, 2.0])}, {"p": torch.tensor([0, 1])}) for p in ps]
    ps[0].grad = row_grad(torch.full((2, 2, 3), 0.25), torch.tensor([1, 4]), 6)
    ps[1].grad = ps[0].grad.to_dense()
    for opt in opts:
        opt.step(set(), torch.ones(2, dtype=torch.bool))
    assert torch.equal(ps[0].detach(), ps[1].detach()) and (ps[0].detach()[:, 1] < 1).all()


# ---------------------------------------------------------------- Scan and Snap's kernels


def _model_and_batch(num_last: int, S: int = 3, B: int = 32, L: int = 128):
    from tdyn.papers.scan_snap.data import ScanSnapDataConfig, build, syn_medium
    from tdyn.papers.scan_snap.kernels import key_support
    from tdyn.papers.scan_snap.model import YZConfig, YZModel

    d = build(ScanSnapDataConfig(**syn_medium(num_last)))
    m = YZModel(YZConfig(M=d.M, init="torch_default"), S=S).double()
    m.reset_parameters([torch.Generator().manual_seed(i) for i in range(S)], [3.0] * S)
    g = torch.Generator().manual_seed(1)
    xs, ys = zip(*[d.sample(B, L, g) for _ in range(S)])
    x, y = torch.stack(xs), torch.stack(ys)
    idx, count = key_support(x, d.M, width=min(L - 1, int((d.table > 0).sum(1).max())))
    return d, m, x, y, idx, count


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_query_logits_equal_the_models_gather_with_the_same_gradient(dtype):
    """kernels.query_logits: model._query_logits' values and Z's gradient bit for bit, the gradient
    row-sparse on the batch's query rows."""
    from tdyn.papers.scan_snap.kernels import query_logits

    d, m, x, y, idx, count = _model_and_batch(5)
    m = m.to(dtype)
    w = torch.randn(idx.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    ref = m._query_logits(x[..., -1], idx)
    got = query_logits(m.Z, x[..., -1], idx)
    assert torch.equal(ref, got)
    gref, = torch.autograd.grad((ref * w).sum(), m.Z)
    ggot, = torch.autograd.grad((got * w).sum(), m.Z)
    rows, values = row_block(ggot)
    assert torch.equal(rows, torch.unique(x[..., -1]))
    assert torch.equal(ggot.to_dense(), gref) and gref.abs().sum() > 0


@pytest.mark.parametrize("num_last", [3, 10])
def test_support_decoder_gradient_is_row_sparse_and_equals_the_dense_one(num_last):
    """The support path's Y and Z gradients are row-sparse (rows: the batch's keys, and its queries),
    and equal, densified, the dense path of model.py's equations (float64); one training step of SGD
    with momentum from them equals the dense step to rounding."""
    from tdyn.papers.scan_snap.kernels import key_bags

    d, m, x, y, idx, count = _model_and_batch(num_last)
    sup = (idx, count.double().log())
    full = sup + key_bags(idx, d.M)
    grads = {}
    for name, s in (("support", full), ("dense", None)):
        out = m(x, s)
        loss = F.cross_entropy(out.reshape(-1, d.M), y.reshape(-1))
        grads[name] = torch.autograd.grad(loss, [m.Y, m.Z])
    gY, gZ = grads["support"]
    assert torch.equal(row_block(gY)[0], torch.unique(idx))
    assert torch.equal(row_block(gZ)[0], torch.unique(x[..., -1]))
    for a, b in zip(grads["support"], grads["dense"]):
        torch.testing.assert_close(a.to_dense(), b, rtol=1e-12, atol=1e-14)
    keys = (d.table > 0).any(0).nonzero().flatten()
    lrs = torch.tensor([0.5, 2.0, 10.0], dtype=torch.float64)
    after = []
    for gs in (grads["support"], grads["dense"]):
        Y, Z = (torch.nn.Parameter(t.detach().clone()) for t in (m.Y, m.Z))
        opt = EnsembleOptimizer({"Y": Y, "Z": Z}, {"y": GroupConfig(params=["Y"], lr=1.0, momentum=0.9),
                                                     "z": GroupConfig(params=["Z"], lr=1.0, momentum=0.9)},
                                {"y": lrs, "z": lrs}, {"Y": keys, "Z": torch.unique(d.query)})
        for _ in range(2):
            Y.grad, Z.grad = gs
            opt.step(set(), torch.ones(3, dtype=torch.bool))
        after.append((Y.detach(), Z.detach()))
    for a, b in zip(*after):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("clip", [None, 1.0])
def test_the_task_hands_dense_gradients_where_the_trainer_clips(clip, tmp_path):
    """The trainer's gradient clipping reads dense gradients: the task asks the kernels for them there,
    and a clipped run trains."""
    from tdyn.config import load_config
    from tdyn.papers.scan_snap.data import syn_medium
    from tdyn.papers.scan_snap.task import yz_config
    from tdyn.seeding import generator
    from tdyn.tasks import build_task
    from tdyn.train.trainer import expand_members, train

    raw = yz_config(syn_medium(5), steps=3, init="torch_default", seeds=[0, 1])
    raw["optim"]["grad_clip"] = clip
    cfg = load_config(raw)
    task = build_task(cfg, expand_members(cfg))
    task.loss(task.sample_streams([generator(s, "data") for s in (0, 1)])).sum().backward()
    assert task.model.Y.grad.is_sparse == task.model.Z.grad.is_sparse == (clip is None)
    if clip is not None:
        train(raw, tmp_path / "r", progress=False)
