"""Plain nn.Modules train as ensembles (issue 14 item 1): member i of a Stacked ensemble equals the same
module trained alone — by tdyn as a one-member job, and by a plain PyTorch loop (torch.optim.SGD,
torch.manual_seed) — with LayerNorm, dropout and buffers; per-member lrs, freeze rules and resume."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from tdyn import runs
from tdyn.config import load_config
from tdyn.errors import UserCodeError
from tdyn.models.stacked import Stacked
from tdyn.probes import probe
from tdyn.schema import Strict
from tdyn.tasks import PlainTask, Task, build_task, register_task
from tdyn.seeding import derive_seed, generator
from tdyn.train.trainer import expand_members, resume, train

D_IN, D, N_OUT, BATCH = 5, 8, 3, 16
TEACHER = torch.randn(D_IN, N_OUT, generator=torch.Generator().manual_seed(123), dtype=torch.float64)


class Net(nn.Module):
    """Written the usual way: Linear → tanh → LayerNorm → Dropout → Linear, a constant buffer (an input
    shift) and a running mean of the hidden layer, updated in place in training and added to the output."""

    def __init__(self, p: float = 0.3):
        super().__init__()
        self.lin = nn.Linear(D_IN, D)
        self.ln = nn.LayerNorm(D)
        self.drop = nn.Dropout(p)
        self.out = nn.Linear(D, N_OUT)
        self.register_buffer("shift", torch.linspace(-1, 1, D_IN))
        self.register_buffer("running", torch.zeros(D))

    def forward(self, x):
        h = self.ln(torch.tanh(self.lin(x - self.shift)))
        if self.training:
            with torch.no_grad():
                self.running.mul_(0.9).add_(0.1 * h.mean(0))
        return self.out(self.drop(h) + self.running)


def sample(gen):
    x = torch.randn(BATCH, D_IN, generator=gen)
    return x, (x @ TEACHER.to(x)).argmax(-1)


def net_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


class PlainData(Strict):
    pass


class PlainModel(Strict):
    p: float = Field(0.3, ge=0, lt=1)


class NetTask(PlainTask):
    def __init__(self, cfg, members):
        self.p = PlainModel.model_validate(cfg.model).p
        super().__init__(cfg, members)

    def make_model(self):
        return Net(self.p)

    def sample(self, gen):
        return sample(gen)

    def member_loss(self, model, batch):
        return net_loss(model, batch)


register_task("test_plain_net", PlainData, PlainModel, "plain Net (tests only)")(NetTask)

GROUPS = {"body": ["lin__weight", "lin__bias", "ln__weight", "ln__bias"], "head": ["out__weight", "out__bias"]}


def net_config(**kw):
    cfg = {"task": "test_plain_net", "seeds": [0], "dtype": "float64",
           "optim": {"steps": 12, "groups": {g: {"params": ps, "lr": 0.3, "optimizer": "sgd", "momentum": 0.9}
                                             for g, ps in GROUPS.items()}},
           "checkpoint": {"schedule": "none"}}
    return cfg | kw


def plain_reference(seed, steps, p=0.3, lrs=None, init_scale=1.0, freeze_lin_until=0):
    """The module trained alone by plain PyTorch: seeded init, global-RNG dropout, torch.optim.SGD.
    Returns the per-step losses (steps + 1 forwards, as the trainer: the last one unused) and the module."""
    lrs = lrs or {"body": 0.3, "head": 0.3}
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(derive_seed(seed, "init"))
        net = Net(p)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        for q in net.parameters():
            q.mul_(init_scale)
    torch.manual_seed(derive_seed(seed, "forward"))
    mods = {"body": [net.lin.weight, net.lin.bias, net.ln.weight, net.ln.bias], "head": [net.out.weight, net.out.bias]}
    opt = torch.optim.SGD([{"params": ps, "lr": lrs[g]} for g, ps in mods.items()], momentum=0.9)
    data = generator(seed, "data")
    losses = []
    for step in range(steps + 1):
        loss = net_loss(net, sample(data))
        losses.append(loss.item())
        if step < steps:
            opt.zero_grad()
            loss.backward()
            if step < freeze_lin_until:
                net.lin.weight.grad = None
            opt.step()
    return losses, net


def _plain_state(net):
    return {k.replace(".", "__"): v for k, v in net.state_dict().items()}


def _assert_matches_reference(d, ref_losses, ref_net, tol):
    m = runs.read_metrics(d)
    assert [r["step"] for r in m] == list(range(len(ref_losses)))
    assert [r["loss"] for r in m] == pytest.approx(ref_losses, rel=tol, abs=tol)
    ck = runs.load_checkpoint(d)
    for k, v in _plain_state(ref_net).items():
        key = f"param/{k}" if f"param/{k}" in ck else f"buffer/{k}"
        torch.testing.assert_close(ck[key], v, rtol=tol, atol=tol, msg=key)


@pytest.mark.parametrize("p", [0.3, 0.0], ids=["dropout-loop", "no-dropout-vmap"])
def test_eight_seed_ensemble_equals_eight_single_runs(tmp_path, p):
    """8 seeds in one job = 8 one-member jobs = 8 plain PyTorch runs (losses at every step, parameters
    and the running-mean buffer after 12 steps). With dropout the members run the per-member loop
    (each draws its masks from its own stream), without it one vmap."""
    seeds = list(range(8))
    cfg = net_config(seeds=seeds, model={"p": p})
    dirs = train(cfg, tmp_path / "ens", progress=False)
    assert len(dirs) == 8
    finals = []
    for seed, d in zip(seeds, dirs):
        alone = train(runs.read_config(d), tmp_path / f"alone{seed}", progress=False)[0]
        a, b = runs.read_metrics(d), runs.read_metrics(alone)
        assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-12, abs=1e-12)
        ca, cb = runs.load_checkpoint(d), runs.load_checkpoint(alone)
        for k in ca:
            if k.startswith(("param/", "buffer/", "optim/", "rng/")):
                torch.testing.assert_close(ca[k], cb[k], rtol=1e-12, atol=1e-12, msg=k)
        losses, net = plain_reference(seed, 12, p=p)
        _assert_matches_reference(d, losses, net, 1e-10)
        finals.append(runs.load_checkpoint(d)["buffer/running"])
    assert not torch.allclose(finals[0], finals[1])       # the members differ (different seeds)
    if p:   # dropout is on: the same member without dropout trains elsewhere
        losses_nodrop, _ = plain_reference(0, 12, p=0.0)
        assert runs.read_metrics(dirs[0])[-1]["loss"] != pytest.approx(losses_nodrop[-1], rel=1e-6)


def _task(cfg, seeds):
    c = load_config(net_config(seeds=seeds, **cfg))
    return build_task(c, expand_members(c))


def test_auto_randomness_picks_loop_only_for_active_dropout():
    t = _task({"model": {"p": 0.3}}, [0, 1])
    assert t.model.uses_loop()
    t.model.eval()
    assert not t.model.uses_loop()
    assert not _task({"model": {"p": 0.0}}, [0, 1]).model.uses_loop()


def test_per_member_lrs_init_scales_and_freeze(tmp_path):
    """ensemble.lrs × init_scales and a freeze rule (lin.weight frozen for steps < 4) in one job: each
    member equals the plain PyTorch run with its lrs, init scale and the same freeze."""
    lr_sets = [{"head": 0.1}, {"head": 0.5, "body": 0.05}]
    scales = [1.0, 0.5]
    cfg = net_config(seeds=[3], ensemble={"lrs": lr_sets, "init_scales": scales},
                     optim=net_config()["optim"] | {"freeze": {"lin__weight": {"until": 4}}})
    dirs = train(cfg, tmp_path / "e", progress=False)
    assert len(dirs) == 4
    i = 0
    for lrs in lr_sets:
        for scale in scales:
            losses, net = plain_reference(3, 12, lrs={"body": 0.3, "head": 0.3} | lrs, init_scale=scale,
                                          freeze_lin_until=4)
            _assert_matches_reference(dirs[i], losses, net, 1e-10)
            upd = [r["update_norm/lin__weight"] for r in runs.read_metrics(dirs[i])[:-1]]
            assert all(u == 0 for u in upd[:4]) and all(u > 0 for u in upd[4:])
            i += 1


_STOPPED: set[str] = set()


@probe("test.stop_at")
def _stop_probe(ctx):
    """Interrupts training once at step ``at`` (as a kill between two checkpoints would)."""
    key = ctx.options.get("key")
    if ctx.step == ctx.options.get("at") and key not in _STOPPED:
        _STOPPED.add(key)
        raise KeyboardInterrupt
    return {}


def _stop_at(step, key):
    return {"names": ["test.stop_at"], "options": {"test.stop_at": {"at": step, "key": key}}}


def _metric_lines(d):
    """Every metrics line of run ``d`` as written, but the identity of the run in the first and the lines' checksums
    (the two runs compared differ in their stopping probe's config, so in their identities, which line 1 holds)."""
    return [{k: v for k, v in json.loads(x).items() if k not in (runs.METRICS_KEY, runs.LINE_CRC)}
            for x in (d / runs.METRICS).read_text().splitlines()]


def test_resume_equals_uninterrupted(tmp_path):
    """A plain-module job with dropout and a running buffer killed at step 13, resumed from its step-10
    checkpoint, ends exactly as the uninterrupted job: every metric line and every final tensor
    (parameters, buffers, optimizer state, the per-member dropout streams)."""
    base = net_config(seeds=[0, 1], checkpoint={"schedule": "none", "every": 5})
    base["optim"]["steps"] = 20
    train(base | {"probes": _stop_at(-1, "ref")}, tmp_path / "ref", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(base | {"probes": _stop_at(13, str(tmp_path))}, tmp_path / "cut", progress=False)
    assert runs.read_meta(tmp_path / "cut" / "seed=0")["status"] == "running"
    assert max(runs.checkpoint_steps(tmp_path / "cut" / "seed=0")) == 10
    resume(tmp_path / "cut", progress=False)
    for m in ("seed=0", "seed=1"):
        a, b = tmp_path / "ref" / m, tmp_path / "cut" / m
        assert runs.read_meta(b)["status"] == "finished"
        assert _metric_lines(a) == _metric_lines(b)
        fa, fb = runs.load_checkpoint(a), runs.load_checkpoint(b)
        assert fa.keys() == fb.keys() and {"buffer/running", "rng/forward"} <= fa.keys()
        assert all(torch.equal(fa[k], fb[k]) for k in fa), m
        model = runs.Run(b).model()      # a plain run reads back with its buffers
        torch.testing.assert_close(model.running[0], fb["buffer/running"], rtol=0, atol=0)


@probe("test.sigint_at")
def _sigint_probe(ctx):
    """Sends this process SIGINT once at step ``at`` (a user's Ctrl-C): the trainer stops at the next step."""
    import os
    import signal

    key = ctx.options.get("key")
    if ctx.step == ctx.options.get("at") and key not in _STOPPED:
        _STOPPED.add(key)
        os.kill(os.getpid(), signal.SIGINT)
    return {}


def test_ctrl_c_then_resume_leaves_the_uninterrupted_run_directory(tmp_path):
    """Ctrl-C saves a checkpoint off the schedule (step 13) for the resume; the resumed run's first
    scheduled checkpoint removes it, so the directory lists the uninterrupted run's checkpoints and its
    metrics, lines and final tensors, are the same."""
    base = net_config(seeds=[0, 1], checkpoint={"schedule": "none", "every": 5})
    base["optim"]["steps"] = 20
    opts = {"names": ["test.sigint_at"], "every": 1}
    train(base | {"probes": opts | {"options": {"test.sigint_at": {"at": -1}}}}, tmp_path / "ref", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(base | {"probes": opts | {"options": {"test.sigint_at": {"at": 12, "key": str(tmp_path)}}}},
              tmp_path / "cut", progress=False)
    assert runs.checkpoint_steps(tmp_path / "cut" / "seed=0")[-1] == 13
    resume(tmp_path / "cut", progress=False)
    a, b = tmp_path / "ref" / "seed=0", tmp_path / "cut" / "seed=0"
    assert runs.checkpoint_steps(b) == runs.checkpoint_steps(a) == [0, 5, 10, 15]
    assert _metric_lines(a) == _metric_lines(b)
    fa, fb = runs.load_checkpoint(a), runs.load_checkpoint(b)
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


@probe("test.heldout_loss")
def _heldout_probe(ctx):
    """A user's probe that runs the model's forward pass (a held-out loss on the probe batch)."""
    return {"loss": ctx.task.loss(ctx.batch).detach()}


def test_a_probe_running_the_forward_leaves_training_unchanged(tmp_path):
    """Probes see the model in eval mode: with dropout and a running buffer, a job probed every 2 steps
    trains exactly as the same job without probes (every loss, every final tensor: parameters, buffers,
    the per-member dropout streams), and its probe is the dropout-free loss."""
    base = net_config(seeds=[0, 1])
    train(base | {"probes": {"names": [], "every": 2}}, tmp_path / "plain", progress=False)
    train(base | {"probes": {"names": ["test.heldout_loss"], "every": 2}}, tmp_path / "probed", progress=False)
    for m in ("seed=0", "seed=1"):
        a, b = runs.read_metrics(tmp_path / "plain" / m), runs.read_metrics(tmp_path / "probed" / m)
        assert [(r["step"], r["loss"]) for r in a] == [(r["step"], r["loss"]) for r in b]
        fa, fb = runs.load_checkpoint(tmp_path / "plain" / m), runs.load_checkpoint(tmp_path / "probed" / m)
        assert fa.keys() == fb.keys() and {"buffer/running", "rng/forward"} <= fa.keys()
        assert all(torch.equal(fa[k], fb[k]) for k in fa), m
        probed = [r["test.heldout_loss/loss"] for r in b if "test.heldout_loss/loss" in r]
        assert len(probed) == 7 and all(math.isfinite(x) for x in probed)


class LinearTask(PlainTask):
    """Least squares with a bare nn.Linear (no ensemble axis anywhere)."""

    def __init__(self, cfg, members):
        self.w = torch.tensor([[1.0, -2.0, 0.5]])
        super().__init__(cfg, members)

    def make_model(self):
        return nn.Linear(3, 1)

    def sample(self, gen):
        x = torch.randn(32, 3, generator=gen)
        return x, x @ self.w.T + 0.25

    def member_loss(self, model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean()


class BareLinearTask(Task):
    """The hand-written contract with a plain model: still refused, with a pointer to PlainTask."""

    def __init__(self, cfg, members):
        self.model = nn.Linear(3, 1)

    def sample(self, gen):
        return None

    def loss(self, batch):
        return self.model.weight.sum()[None]


register_task("test_plain_linear", PlainData, PlainModel)(LinearTask)
register_task("test_bare_linear", PlainData, PlainModel)(BareLinearTask)


class ScalarLossTask(Task):
    """The hand-written contract with the ensemble axis on the model, but one loss for all members."""

    def __init__(self, cfg, members):
        self.model = nn.Module()
        self.model.w = nn.Parameter(torch.zeros(len(members), 3))

    def sample(self, gen):
        return None

    def loss(self, batch):
        return (self.model.w ** 2).sum()


register_task("test_scalar_loss", PlainData, PlainModel)(ScalarLossTask)


def test_a_loss_without_one_value_per_member_names_the_task_class(tmp_path):
    cfg = {"task": "test_scalar_loss", "seeds": [0, 1], "checkpoint": {"schedule": "none"},
           "optim": {"steps": 2, "groups": {"all": {"params": ["w"], "lr": 0.1}}}}
    with pytest.raises(UserCodeError, match=r"ScalarLossTask\): loss\(\) must return one loss per member, shape \[2\]"):
        train(cfg, tmp_path / "s", progress=False)


def test_nn_linear_task_trains(tmp_path):
    cfg = {"task": "test_plain_linear", "seeds": [0, 1, 2], "checkpoint": {"schedule": "none"},
           "optim": {"steps": 200, "groups": {"all": {"params": ["weight", "bias"], "lr": 0.1}}}}
    dirs = train(cfg, tmp_path / "lin", progress=False)
    for d in dirs:
        p = runs.params_of(runs.load_checkpoint(d))
        torch.testing.assert_close(p["weight"], torch.tensor([[1.0, -2.0, 0.5]]), rtol=0, atol=1e-4)
        torch.testing.assert_close(p["bias"], torch.tensor([0.25]), rtol=0, atol=1e-4)
    inits = [runs.params_of(runs.load_checkpoint(d, 0))["weight"] for d in dirs]
    torch.manual_seed(derive_seed(1, "init"))
    torch.testing.assert_close(inits[1], nn.Linear(3, 1).weight.detach(), rtol=0, atol=0)   # nn.Linear's own init
    cfg["task"] = "test_bare_linear"
    with pytest.raises(UserCodeError, match="without the ensemble axis of size 3 first.*PlainTask"):
        train(cfg, tmp_path / "bare", progress=False)


# ---------------------------------------------------------------- Stacked itself


def test_stacked_names_member_and_gradients_against_plain_modules():
    """Names are the plain ones with "." → "__"; map's losses and gradients (vmap and loop) equal each
    plain module's own; member(i) gives module i back."""
    torch.manual_seed(0)
    mods = [nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 2)).double() for _ in range(5)]
    x = torch.randn(5, 7, 4, dtype=torch.float64)
    fn = lambda m, x: (m(x) ** 2).mean()  # noqa: E731
    ref_loss = torch.stack([fn(m, x[i]) for i, m in enumerate(mods)])
    ref_loss.sum().backward()
    for way in ("vmap", "loop"):
        st = Stacked(mods, [torch.Generator() for _ in mods], randomness=way)
        assert [n for n, _ in st.named_parameters()] == ["0__weight", "0__bias", "1__weight", "1__bias",
                                                        "3__weight", "3__bias"]
        loss = st.map(fn, x)
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-12, atol=1e-12)
        loss.sum().backward()
        for i, m in enumerate(mods):
            for name, p in m.named_parameters():
                torch.testing.assert_close(st.get_parameter(name.replace(".", "__")).grad[i], p.grad,
                                           rtol=1e-12, atol=1e-12)
        back = st.member(2)
        assert all(torch.equal(back.state_dict()[k], v) for k, v in mods[2].state_dict().items())


def test_an_op_vmap_cannot_batch_is_one_line_naming_the_loop():
    """nn.GRU has no vmap batching rule: map says so in one line (UserError: exit 2 from the CLI) naming
    randomness="loop", under which the same members run and equal the modules run alone."""
    from tdyn.errors import UserError

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(3, 4, batch_first=True)

        def forward(self, x):
            return self.gru(x)[0][:, -1].sum()

    torch.manual_seed(0)
    mods = [Recurrent() for _ in range(2)]
    x = torch.randn(2, 5, 6, 3)
    with pytest.raises(UserError, match=r'aten::gru.*randomness="loop"') as e:
        Stacked(mods, [torch.Generator() for _ in mods], randomness="vmap").map(lambda m, x: m(x), x)
    assert "\n" not in str(e.value)
    out = Stacked(mods, [torch.Generator() for _ in mods], randomness="loop").map(lambda m, x: m(x), x)
    torch.testing.assert_close(out, torch.stack([m(x[i]) for i, m in enumerate(mods)]).detach(), rtol=0, atol=0)


def test_undeclared_randomness_under_vmap_is_an_error():
    class FunctionalDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return F.dropout(self.lin(x), 0.5, self.training)

    mods = [FunctionalDropout() for _ in range(2)]
    x = torch.randn(2, 4, 3)
    with pytest.raises(RuntimeError, match='randomness="loop"'):
        Stacked(mods, [torch.Generator() for _ in mods]).map(lambda m, x: m(x).sum(), x)
    gens = [generator(s, "forward") for s in (0, 1)]
    out = Stacked(mods, gens, randomness="loop").map(lambda m, x: m(x), x)
    torch.manual_seed(derive_seed(1, "forward"))
    torch.testing.assert_close(out[1], mods[1](x[1]))
    assert math.isfinite(out.sum().item())


# ---------------------------------------------------------------- the bench's plain models = the shipped ones


def test_bench_plain_models_compute_the_handwritten_losses():
    """``tdyn bench`` compares like with like: PlainYZ / PlainTopicAttention under vmap give the
    hand-written models' per-member losses and gradients, with the same parameters, on the same batch."""
    from tdyn.papers.scan_snap.bench import PlainYZTask
    from tdyn.papers.scan_snap.data import SYN_SMALL
    from tdyn.papers.topic.bench import PlainTopicTask
    from tdyn.papers.topic.task import QUICK_DATA, lda_config
    from tdyn.papers.scan_snap.task import yz_config

    cases = [(yz_config(SYN_SMALL, seeds=[0, 1, 2], init="torch_default"), PlainYZTask, {"Y": "Y", "Z": "Z"}),
             (lda_config({"attention": "trained", "value": "trained", "decoder": "identity"},
                         data=QUICK_DATA | {"batch_size": 6}, seeds=[0, 1, 2]), PlainTopicTask,
              {f"{w}__{k}": f"{'W' if k == 'weight' else 'b'}_{w[2]}" for w in ("W_Q", "W_K", "W_V")
               for k in ("weight", "bias")})]
    for cfg, plain_cls, names in cases:
        cfg["dtype"] = "float64"
        rc = load_config(cfg)
        members = expand_members(rc)
        hand, plain = build_task(rc, members), plain_cls(rc, members)
        assert not plain.model.uses_loop()
        plain.model.double()
        with torch.no_grad():
            for pn, hn in names.items():
                plain.model.get_parameter(pn).copy_(hand.model.get_parameter(hn).detach())
        # whole sequences (the Scan and Snap task's training batches keep only x's query column)
        batch = [getattr(hand, "full_sample", hand.sample)(generator(s, "data")) for s in (0, 1, 2)]
        batch = torch.utils._pytree.tree_map(lambda *xs: torch.stack(xs), *batch)
        lh, lp = hand.loss(batch), plain.loss(batch)
        assert lh.shape == lp.shape == (3,) and len(set(lh.tolist())) == 3
        torch.testing.assert_close(lp, lh, rtol=1e-10, atol=1e-10)
        lh.sum().backward()
        lp.sum().backward()
        for pn, hn in names.items():
            torch.testing.assert_close(plain.model.get_parameter(pn).grad, hand.model.get_parameter(hn).grad,
                                       rtol=1e-9, atol=1e-12, msg=pn)
