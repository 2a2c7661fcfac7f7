"""lsa.c, the LSA loss in C (``kernels.loss_c``, ``kernels.predict_c``; docs/reproductions/icl-gd.md#speed), against
``model.py``'s equations under autograd, a central difference, and the torch speed path; its bits the same for any
vector width. Skipped where there is no C compiler (the task then trains by the torch path, tested elsewhere)."""

import platform

import pytest
import torch
from conftest import per_layer_central_differences, random_lsa

from tdyn import native
from tdyn.config import load_config
from tdyn.papers.icl_gd import data as icl
from tdyn.papers.icl_gd import kernels
from tdyn.papers.icl_gd.task import icl_gd_config
from tdyn.tasks import build_task
from tdyn.train.trainer import expand_members

pytestmark = pytest.mark.skipif(native.compiler()[0] is None, reason=native.status())

F64 = torch.float64
NAMES = ("W_K", "W_Q", "W_V", "P")


def _batch(n, d, N, seed, dtype=F64):
    return icl.sample(n, d, N, torch.Generator().manual_seed(seed), dtype=dtype)


def _ref_loss(m, E, y):
    return 0.5 * ((m.predict(E) - y) ** 2).mean(-1)


# B = 37 and 24 are not multiples of the 8 (float64) or 16 (float32) lanes: the padding must add nothing
@pytest.mark.parametrize("d,N,B", [(4, 7, 37), (10, 10, 24)])
@pytest.mark.parametrize("K,tied", [(1, True), (2, True), (2, False), (3, True), (3, False), (4, False), (5, True)])
def test_c_loss_equals_the_model_in_float64(K, tied, d, N, B):
    """The loss per member, ŷ and every weight's gradient: relative 1e-12 (values) and 1e-10 (gradients) of model.py's
    attention under autograd, for a batch shared by the members and one batch per member."""
    m = random_lsa(K, tied, S=3, d=d, seed=K)
    E, y = _batch(B, d, N, seed=1)
    Es = torch.stack([E, E.flip(0), 0.5 * E])
    for batch in (E, Es):
        ref, got = _ref_loss(m, batch, y), kernels.loss_c(m, batch, y)
        assert got.shape == (3,)
        assert float((got - ref).detach().abs().max()) <= 1e-12 * float(ref.detach().abs().max())
        assert float((kernels.predict_c(m, batch) - m.predict(batch)).detach().abs().max()) \
            <= 1e-12 * float(m.predict(batch).detach().abs().max())
        w = torch.tensor([1.0, -2.0, 0.5], dtype=F64)              # the incoming gradient scales each member's
        g_ref = torch.autograd.grad((w * ref).sum(), list(m.parameters()))
        g_got = torch.autograd.grad((w * got).sum(), list(m.parameters()))
        for a, b in zip(g_got, g_ref):
            assert float((a - b).abs().max()) <= 1e-10 * float(b.abs().max())


@pytest.mark.parametrize("K", [2, 4])
def test_c_gradient_by_finite_difference(K):
    """lsa.c's gradient along random directions of each matrix of each untied layer against a central difference of
    the loss by model.py (float64, h = 1e-6, relative 1e-6): a reference without autograd."""
    m = random_lsa(K, False, S=1, d=4, seed=5, std=0.3)
    E, y = _batch(16, 4, 7, seed=2)
    grads = dict(zip(NAMES, torch.autograd.grad(kernels.loss_c(m, E, y).sum(), list(m.parameters()))))
    for name, layer, v, fd in per_layer_central_differences(m, NAMES, K, lambda: float(_ref_loss(m, E, y).sum()), 3):
        assert abs(float((grads[name] * v).sum()) - fd) <= 1e-6 * max(abs(fd), 1e-3), (name, layer)


@pytest.mark.parametrize("K,tied", [(1, True), (3, True), (3, False)])
def test_c_loss_in_float32_is_the_model_to_rounding(K, tied):
    """At the authors' sizes in float32: the loss within 1e-5 and the gradients within 1e-4 (relative to the
    largest) of model.py in float64, and deterministic (two calls, the same bits)."""
    m = random_lsa(K, tied, S=2, d=10, seed=3, std=0.1)
    m32 = random_lsa(K, tied, S=2, d=10, seed=3, std=0.1, dtype=torch.float32)
    E, y = _batch(200, 10, 10, seed=4)
    got = kernels.loss_c(m32, E.float(), y.float())
    ref = _ref_loss(m, E, y)
    assert float((got.double() - ref).detach().abs().max()) <= 1e-5 * float(ref.detach().abs().max())
    g32 = torch.autograd.grad(got.sum(), list(m32.parameters()))
    g64 = torch.autograd.grad(ref.sum(), list(m.parameters()))
    for a, b in zip(g32, g64):
        assert float((a.double() - b).abs().max()) <= 1e-4 * float(b.abs().max())
    again = kernels.loss_c(m32, E.float(), y.float())
    assert torch.equal(got, again)
    for a, b in zip(g32, torch.autograd.grad(again.sum(), list(m32.parameters()))):
        assert torch.equal(a, b)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="builds for another x86-64 level")
def test_c_bits_do_not_depend_on_the_vector_width(tmp_path, monkeypatch):
    """The same source built for plain x86-64-v2 (SSE: four float lanes a vector op) and for this machine
    (-march=native: AVX2 or AVX-512) gives the same float32 bits: no fused multiply-add, no reordered sum."""
    m = random_lsa(3, False, S=2, d=10, seed=6, std=0.1, dtype=torch.float32)
    E, y = _batch(64, 10, 10, seed=7, dtype=torch.float32)
    native_loss = kernels.loss_c(m, E, y)
    native_grads = torch.autograd.grad(native_loss.sum(), list(m.parameters()))
    monkeypatch.setenv("TDYN_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "FLAGS", tuple("-march=x86-64-v2" if f == "-march=native" else f for f in native.FLAGS))
    generic = kernels.loss_c(m, E, y)
    assert list(tmp_path.glob("native/lsa-*.so"))                       # it was built here, for x86-64-v2
    assert torch.equal(generic, native_loss)
    for a, b in zip(torch.autograd.grad(generic.sum(), list(m.parameters())), native_grads):
        assert torch.equal(a, b)


def test_c_not_for_sizes_beyond_its_buffers():
    """K above ``C_MAX`` (the sizes lsa.c is built for): None, and the task takes the torch path."""
    m = random_lsa(kernels.C_MAX["layers"] + 1, True, S=1, d=3, seed=0)
    E, y = _batch(8, 3, 4, seed=0)
    assert kernels.loss_c(m, E, y) is None and kernels.predict_c(m, E) is None


@pytest.mark.parametrize("K,tied", [(1, True), (2, True), (3, False)])
def test_task_trains_by_the_c_loss(K, tied):
    """With a compiler the task's float32 loss and gradient are lsa.c's, bit for bit; with ``TDYN_NATIVE=0`` they
    are the torch path's (``kernels.predict`` for K = 1, ``predict_deep`` for K ≥ 2), and the two differ in rounding
    only (so the check can tell them apart)."""
    rc = load_config(icl_gd_config(layers=K, tied=tied, seeds=[0, 1], steps=1, batch_size=128, probe_size=8))
    task = build_task(rc, expand_members(rc))
    E = torch.stack([_batch(128, 10, 10, seed=s, dtype=torch.float32)[0] for s in (3, 4)])
    y = torch.stack([_batch(128, 10, 10, seed=s, dtype=torch.float32)[1] for s in (3, 4)])
    params = list(task.model.parameters())
    got, want = task.loss((E, y)), kernels.loss_c(task.model, E, y)
    assert torch.equal(got, want)
    g_c = torch.autograd.grad(got.sum(), params)
    for a, b in zip(g_c, torch.autograd.grad(want.sum(), params)):
        assert torch.equal(a, b)
    with native.disabled():
        torch_path = task.loss((E, y))
    predict = kernels.predict if K == 1 else kernels.predict_deep
    assert torch.equal(torch_path, 0.5 * ((predict(task.model, E) - y) ** 2).mean(-1))
    assert float((torch_path - got).detach().abs().max()) <= 1e-5 * float(got.detach().abs().max())
    g_torch = torch.autograd.grad(torch_path.sum(), params)
    assert not all(torch.equal(a, b) for a, b in zip(g_c, g_torch))
    for a, b in zip(g_c, g_torch):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())


def test_c_reads_the_task_batch_in_place():
    """The task's batch-last batch (``sample_streams``) and the same values stacked (a contiguous (S, B, T, D) copy,
    and a batch of 37, not a multiple of the lanes, padded) give lsa.c's loss and gradient bit for bit."""
    rc = load_config(icl_gd_config(layers=3, tied=False, seeds=[0, 1], steps=1, batch_size=48, probe_size=8))
    task = build_task(rc, expand_members(rc))
    E, y = task.sample_streams([torch.Generator().manual_seed(s) for s in (1, 2)])
    params = list(task.model.parameters())
    a = kernels.loss_c(task.model, E, y)
    b = kernels.loss_c(task.model, E.contiguous(), y)
    assert torch.equal(a, b)
    for u, v in zip(torch.autograd.grad(a.sum(), params), torch.autograd.grad(b.sum(), params)):
        assert torch.equal(u, v)
    part = kernels.loss_c(task.model, E[:, :37], y[:, :37])
    ref = 0.5 * ((task.model.predict(E[:, :37]) - y[:, :37]) ** 2).mean(-1)
    assert float((part - ref).detach().abs().max()) <= 1e-5 * float(ref.detach().abs().max())


def test_c_bits_do_not_depend_on_the_threads():
    """Members in groups on 1, 2 or 3 threads (``native.over_members``): the same loss, gradient and ŷ, bit for bit."""
    m = random_lsa(3, False, S=5, d=10, seed=8, std=0.1, dtype=torch.float32)
    E, y = _batch(64, 10, 10, seed=9, dtype=torch.float32)
    old = torch.get_num_threads()
    out = []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            loss = kernels.loss_c(m, E, y)
            out.append([loss, *torch.autograd.grad(loss.sum(), list(m.parameters())), kernels.predict_c(m, E)])
    finally:
        torch.set_num_threads(old)
    for other in out[1:]:
        assert all(torch.equal(a, b) for a, b in zip(out[0], other))


def test_c_not_under_autocast_and_targets_cast():
    """Under the trainer's ``autocast: bfloat16`` the folded weights would be bfloat16: ``loss_c`` declines (the torch
    path computes it); targets in another dtype than the tokens are cast (the torch path promotes them)."""
    m = random_lsa(2, False, S=2, d=4, seed=3, std=0.2, dtype=torch.float32)
    E, y = _batch(32, 4, 7, seed=3, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.loss_c(m, E, y) is None and kernels.predict_c(m, E) is None
    m64 = random_lsa(2, False, S=2, d=4, seed=3, std=0.2)
    E64, y64 = _batch(32, 4, 7, seed=3)
    assert torch.equal(kernels.loss_c(m64, E64, y64.float()), kernels.loss_c(m64, E64, y64.float().double()))
