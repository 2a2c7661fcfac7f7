"""The K ≥ 2 speed path of von Oswald et al. 2023 (``kernels.predict_deep``: the Gram form, hand-written gradient)
against ``model.py``'s equations (docs/reproductions/icl-gd.md#speed); each test can fail."""

import pytest
import torch
from conftest import per_layer_central_differences, random_lsa

from tdyn.config import load_config
from tdyn.papers.icl_gd import data as icl
from tdyn.papers.icl_gd import kernels
from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.model import LSA, LSAConfig
from tdyn.papers.icl_gd.task import icl_gd_config
from tdyn.tasks import build_task
from tdyn.train.trainer import expand_members

F64 = torch.float64
NAMES = ("W_K", "W_Q", "W_V", "P")


def _batch(n, d, N, seed, dtype=F64):
    return icl.sample(n, d, N, torch.Generator().manual_seed(seed), dtype=dtype)


def _model(K, tied, S, d, seed=0, std=0.2, dtype=F64):
    return random_lsa(K, tied, S, d, seed, std, dtype)


def _loss(pred, y):
    return 0.5 * ((pred - y) ** 2).mean()


# d = 4, N = 7 (D = 5, N+1 = 8) as well as the authors' d = N = 10, where the token and feature axes have the same
# length 11 and a transposed index would go unseen

@pytest.mark.parametrize("d,N", [(4, 7), (10, 10)])
@pytest.mark.parametrize("K,tied", [(1, True), (2, True), (2, False), (3, True), (3, False), (4, False), (5, True),
                                    (5, False)])
def test_deep_equals_the_model_in_float64(K, tied, d, N):
    """ŷ and every weight's gradient of the loss: relative 1e-12 (values) and 1e-10 (gradients) of model.py's
    attention under autograd, for a batch shared by the members and for one batch per member."""
    m = _model(K, tied, S=3, d=d, seed=K)
    E, y = _batch(24, d, N, seed=1)
    Es = torch.stack([E, E.flip(0), 0.5 * E])
    for batch in (E, Es):
        ref, got = m.predict(batch), kernels.predict_deep(m, batch)
        scale = float(ref.detach().abs().max())
        assert float((got - ref).detach().abs().max()) <= 1e-12 * scale
        g_ref = torch.autograd.grad(_loss(ref, y), list(m.parameters()))
        g_got = torch.autograd.grad(_loss(got, y), list(m.parameters()))
        for a, b in zip(g_got, g_ref):
            assert a.shape == b.shape
            assert float((a - b).abs().max()) <= 1e-10 * float(b.abs().max())


@pytest.mark.parametrize("K", [3, 4])
def test_deep_gradient_by_finite_difference(K):
    """The hand-written gradient along random directions of each matrix of each untied layer against a central
    difference of the loss by model.py (float64, h = 1e-6, relative 1e-6): a reference without autograd. K = 4 has
    a layer that moves every token behind another (its ∂C from the tokens, not the data)."""
    m = _model(K, tied=False, S=1, d=4, seed=5, std=0.3)
    E, y = _batch(16, 4, 7, seed=2)
    grads = dict(zip(NAMES, torch.autograd.grad(_loss(kernels.predict_deep(m, E), y), list(m.parameters()))))
    for name, layer, v, fd in per_layer_central_differences(m, NAMES, K, lambda: float(_loss(m.predict(E), y)), 3):
        assert abs(float((grads[name] * v).sum()) - fd) <= 1e-6 * max(abs(fd), 1e-3), (name, layer)


def test_deep_at_the_gd_construction_is_K_gd_steps():
    """Three layers set to the GD construction at one η predict three steps of GD from W₀ = 0 (closed form,
    ``theory.gd_steps``) to 1e-12; at three η's they predict what theory's dense LSA does, which differs from the
    layers all at the first η by more than 1e-3 (so the layers' own weights are used)."""
    E, _ = _batch(20, 10, 10, seed=4)

    def built(etas):
        m = LSA(LSAConfig(11, layers=3, tied=False, dtype=F64), S=1)
        with torch.no_grad():
            for w, eta in enumerate(etas):
                for name, M in zip(NAMES, th.construction(10, eta, 10)):
                    getattr(m, name)[:, w] = M
        return kernels.predict_deep(m, E)[0].detach()

    assert float((built([0.9] * 3) - th.gd_steps(E, 0.9, 3)[0]).abs().max()) < 1e-12
    etas = [0.9, 0.4, 1.3]
    out, _ = th.lsa(E, [th.construction(10, eta, 10) for eta in etas])
    got = built(etas)
    assert float((got + out[:, -1, -1]).abs().max()) < 1e-12
    assert float((got - built([etas[0]] * 3)).abs().max()) > 1e-3


@pytest.mark.parametrize("K,tied", [(1, True), (3, True), (3, False)])
def test_task_loss_in_float32_is_the_model_to_rounding(K, tied):
    """The task's training loss (float32, the authors' sizes and init, two members with their own batches) and its
    gradient against model.py's loss in float64 on the same weights and batches: relative 1e-5 and 1e-4."""
    rc = load_config(icl_gd_config(layers=K, tied=tied, seeds=[0, 1], steps=1, batch_size=256, probe_size=8))
    task = build_task(rc, expand_members(rc))
    g = torch.Generator().manual_seed(K)
    with torch.no_grad():            # weights of the size training reaches: the GD construction (η = 0.5), perturbed
        for name, M in zip(NAMES, th.construction(10, 0.5, 10)):
            p = getattr(task.model, name)
            p.copy_(M.to(p.dtype) + 0.02 * torch.randn(p.shape, generator=g))
    E, y = torch.stack([_batch(256, 10, 10, seed=s, dtype=torch.float32)[0] for s in (7, 8)]), None
    y = torch.stack([_batch(256, 10, 10, seed=s, dtype=torch.float32)[1] for s in (7, 8)])
    ref = LSA(task.model.cfg.model_copy(update={"dtype": F64}), S=2)
    with torch.no_grad():
        for name in NAMES:
            getattr(ref, name).copy_(getattr(task.model, name).to(F64))
    lf = task.loss((E, y))
    lr = 0.5 * ((ref.predict(E.to(F64)) - y.to(F64)) ** 2).mean(-1)
    f, r = lf.detach().to(F64), lr.detach()
    assert float((f - r).abs().max()) <= 1e-5 * float(r.abs().max())
    assert float((r[0] - r[1]).abs()) > 1e-3 * float(r.abs().max())      # the members differ
    gf = torch.autograd.grad(lf.sum(), list(task.model.parameters()))
    gr = torch.autograd.grad(lr.sum(), list(ref.parameters()))
    for a, b in zip(gf, gr):
        assert float((a.to(F64) - b).abs().max()) <= 1e-4 * float(b.abs().max())


@pytest.mark.parametrize("tied", [True, False])
def test_task_trains_k_layers_by_the_batched_kernel(tied, torch_paths):
    """Without the C kernel (``TDYN_NATIVE=0``; tests/test_icl_gd_native.py has it), the task's float32 loss and
    gradient for K = 2, recurrent or separate layers, are those of ``kernels.predict_deep`` bit for bit, and differ in
    float32 rounding from the generic ``kernels.predict`` path (so the check can tell the kernels apart)."""
    rc = load_config(icl_gd_config(layers=2, tied=tied, seeds=[0, 1], steps=1, batch_size=128, probe_size=8))
    task = build_task(rc, expand_members(rc))
    E = torch.stack([_batch(128, 10, 10, seed=s, dtype=torch.float32)[0] for s in (3, 4)])
    y = torch.stack([_batch(128, 10, 10, seed=s, dtype=torch.float32)[1] for s in (3, 4)])
    params = list(task.model.parameters())
    got = task.loss((E, y))
    want = 0.5 * ((kernels.predict_deep(task.model, E) - y) ** 2).mean(-1)
    assert torch.equal(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), params), torch.autograd.grad(want.sum(), params)):
        assert torch.equal(a, b)
    assert not torch.equal(kernels.predict_deep(task.model, E), kernels.predict(task.model, E))
