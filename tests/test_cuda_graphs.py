"""The training step as graphs (``tdyn.train.graphs``, config ``cuda_graph``) trains every member as the eager step
does, bit for bit: metrics, final parameters and optimizer state. Off a GPU the capture is
:class:`tdyn.train.graphs._Replay` (records the function, replays it into static outputs), which checks the
step's graph-safe protocol (static inputs, the graph's own gradient tensors, the eager fallbacks); on a GPU
(``device``-marked tests, run by benchmarks/gpu_graphs.sh) real CUDA graphs against the eager CUDA step."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tdyn import runs
from tdyn.config import load_config
from tdyn.errors import ConfigError
from conftest import quad_config
from tdyn.papers.topic.analysis import E4
from tdyn.papers.topic.task import lda_config
from tdyn.tasks.base import leaves
from tdyn.train import graphs, trainer
from tdyn.train.trainer import train

CUDA = torch.cuda.is_available()


class _Counted(graphs._Replay):
    replays = 0

    def replay(self):
        type(self).replays += 1
        super().replay()


@pytest.fixture
def replayed(monkeypatch):
    """A function that trains ``cfg`` into ``out`` with every Job stepping through GraphedStep and the CPU
    stand-in; it returns the run directories and the GraphedSteps made."""
    def run(cfg, out):
        made = []
        orig = trainer.Job.__init__

        def init(self, *a, **k):
            orig(self, *a, **k)
            self.graphed = graphs.GraphedStep(self, capture=_Counted)
            made.append(self.graphed)

        _Counted.replays = 0
        with monkeypatch.context() as m:
            m.setattr(trainer.Job, "__init__", init)
            return train(cfg, out, progress=False), made
    return run


def _state(d):
    """What training determines: the metrics and the final checkpoint's tensors."""
    return runs.read_metrics(d), load_file(d / "checkpoints" / "final.safetensors")


def _same(a_dirs, b_dirs):
    assert len(a_dirs) == len(b_dirs)
    for a, b in zip(a_dirs, b_dirs):
        (ma, ca), (mb, cb) = _state(a), _state(b)
        assert ma == mb, a.name
        assert ca.keys() == cb.keys()
        for k in ca:
            assert torch.equal(ca[k], cb[k]), (a.name, k)


SYN_SMALL = ["optim.steps=25", "seeds=[0,1]", "ensemble.lrs=[{Y: 1, Z: 1}, {Y: 4, Z: 2}]",
             "model.init=torch_default", "checkpoint.schedule=none", "probes.every=10"]


def test_scan_snap_sgd_momentum_graphed_equals_eager(tmp_path, replayed):
    """Syn-Small, SGD with momentum, 2 seeds × 2 lr sets, grad_rows on Y and Z: both graphs replay."""
    cfg = load_config("syn_small", SYN_SMALL).model_dump(mode="json")
    eager = train(cfg, tmp_path / "eager", progress=False)
    got, (g,) = replayed(cfg, tmp_path / "graph")
    _same(eager, got)
    assert g.fwd is not None and g.off is None and len(g.updates) == 1 and None not in g.updates.values()
    # 25 steps: the warm-up's eager steps, then a loss replay and an update replay per step
    assert _Counted.replays == 2 * (25 - graphs.WARMUP)


def _checkpoints(d):
    return {s: load_file(runs.checkpoint_path(d, s)) for s in runs.checkpoint_steps(d)}


@pytest.mark.parametrize("threads", [0, 1, 2, 3])
def test_prefetched_batches_and_checkpointed_streams_equal_the_eager_runs(tmp_path, replayed, monkeypatch, threads):
    """The next batch drawn on host threads while a step runs: 5 data streams split between 1, 2 or 3 threads
    give the eager run's batches, and every checkpoint (each data stream's generator state included) is the
    eager run's, so a resume from any of them is exact."""
    monkeypatch.setattr(graphs, "PREFETCH_THREADS", threads)
    cfg = load_config("syn_small", ["optim.steps=20", "seeds=[0,1,2,3,4]", "model.init=torch_default",
                                    "checkpoint.schedule=none", "checkpoint.every=5"]).model_dump(mode="json")
    eager = train(cfg, tmp_path / "eager", progress=False)
    got, (g,) = replayed(cfg, tmp_path / "graph")
    _same(eager, got)
    for a, b in zip(eager, got):
        ca, cb = _checkpoints(a), _checkpoints(b)
        assert sorted(ca) == sorted(cb) == [0, 5, 10, 15]
        for step in ca:
            for k in ca[step]:
                assert torch.equal(ca[step][k], cb[step][k]), (a.name, step, k)


def test_a_prefetch_joins_its_threads_draws_as_one_pass():
    """Prefetch's threaded draw of a Fig 6 job's 5 streams (the support decoder's key bags included) equals
    sample_streams of all of them at once."""
    from tdyn.config import validate_config
    from tdyn.papers.scan_snap.analysis import FIG6, fig6_spec
    from tdyn.seeding import generator
    from tdyn.sweep.spec import load_spec, plan
    from tdyn.tasks import build_task
    cfg = validate_config(plan(load_spec(fig6_spec(FIG6)))[2].config)
    task = build_task(cfg, trainer.expand_members(cfg))
    ref = task.sample_streams([generator(s, "data") for s in cfg.seeds])
    gens = [generator(s, "data") for s in cfg.seeds]
    pre = graphs.Prefetch(task, gens, threads=3)
    assert [len(c) for c in pre.chunks] == [2, 2, 1]
    before = [g.get_state() for g in gens]
    pre.start()
    assert all(torch.equal(a, b) for a, b in zip(pre.states, before))
    got = pre.take()
    pre.close()
    assert pre.states is None and pre.pending is None
    for a, b in zip(leaves(ref), leaves(got)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fails", [False, True])
def test_a_prefetch_captures_its_draw_once_after_the_warm_up_with_every_stream_registered(monkeypatch, caplog, fails):
    """Prefetch(graph=True), the protocol off a GPU (a stand-in graph that records, as a capture, and whose replay
    redraws into the captured outputs): eager draws for WARMUP starts, then one capture with every data generator
    registered, then a replay per start into the same output tensors; each batch the eager draws' (the replayed
    Philox offsets' part is the GPU test's). A capture that fails: one warning, eager draws from then on."""
    from contextlib import contextmanager

    from tdyn.config import validate_config
    from tdyn.papers.scan_snap.analysis import FIG6, fig6_spec
    from tdyn.seeding import generator
    from tdyn.sweep.spec import load_spec, plan
    from tdyn.tasks import build_task
    cfg = validate_config(plan(load_spec(fig6_spec(FIG6)))[2].config)
    task = build_task(cfg, trainer.expand_members(cfg))
    made = []

    class Stand:
        def __init__(self):
            self.registered, self.replays = [], 0
            made.append(self)

        def register_generator_state(self, g):
            self.registered.append(g)

        def replay(self):
            self.replays += 1
            for dst, src in zip(leaves(pre.graph[1]), leaves(task.sample_streams(gens))):
                dst.copy_(src)

    @contextmanager
    def capture(graph):
        if fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        state = [g.get_state() for g in gens]
        yield                                   # the draw inside is recorded, not run: the streams do not advance
        for g, st in zip(gens, state):
            g.set_state(st)

    monkeypatch.setattr(graphs.torch.cuda, "CUDAGraph", Stand)
    monkeypatch.setattr(graphs.torch.cuda, "graph", capture)
    caplog.set_level("WARNING")
    ref_gens = [generator(s, "data") for s in cfg.seeds]
    gens = [generator(s, "data") for s in cfg.seeds]
    pre = graphs.Prefetch(task, gens, graph=True)
    outs = []
    for i in range(graphs.WARMUP + 3):
        pre.start()
        got = pre.take()
        outs.append(got)
        for a, b in zip(leaves(task.sample_streams(ref_gens)), leaves(got)):
            assert torch.equal(a, b), i
    pre.close()
    assert len(made) == 1 and made[0].registered == gens
    if fails:
        assert pre.graph is None and made[0].replays == 0
        assert [r.message for r in caplog.records] == [
            "cuda_graph: the batch's draw could not be captured (RuntimeError: operation not permitted when stream "
            "is capturing); drawn eagerly"]
    else:
        assert made[0].replays == 3 and not caplog.records
        assert all(a is b for a, b in zip(leaves(outs[-1]), leaves(outs[graphs.WARMUP])))    # the graph's outputs


def test_a_scheduled_rate_is_read_by_the_update_graph_from_one_tensor(tmp_path, replayed):
    """A cosine schedule with warm-up on Y: the graphed run equals the eager one, and the update reads each
    step's rate from one device tensor, rewritten in place (a captured update replays the same memory)."""
    cfg = load_config("syn_small", SYN_SMALL + ["optim.groups.Y.schedule={kind: cosine, warmup: 4}"]).model_dump(mode="json")
    eager = train(cfg, tmp_path / "eager", progress=False)
    seen = []
    orig = trainer.EnsembleOptimizer._lr

    def lr(self, gname, p):
        t = orig(self, gname, p)
        if gname == "Y":
            seen.append((t.data_ptr(), t.clone()))
        return t

    trainer.EnsembleOptimizer._lr = lr
    try:
        got, (g,) = replayed(cfg, tmp_path / "graph")
    finally:
        trainer.EnsembleOptimizer._lr = orig
    _same(eager, got)
    assert len({ptr for ptr, _ in seen}) == 1 and len({tuple(v.tolist()) for _, v in seen}) > 10


def test_adam_and_gradient_clipping(tmp_path, replayed):
    """The topic model with Adam (its update stays eager: Adam's step counts live on the host) and gradient
    clipping (inside the loss graph)."""
    cfg = lda_config(E4, steps=12, seeds=(0,), every=4, quick=True)
    cfg["optim"]["grad_clip"] = 0.5
    cfg["checkpoint"] = {"schedule": "none"}
    eager = train(cfg, tmp_path / "eager", progress=False)
    got, (g,) = replayed(cfg, tmp_path / "graph")
    _same(eager, got)
    assert g.fwd is not None and not g.updates and _Counted.replays == 12 - graphs.WARMUP


def test_freeze_schedule_captures_one_update_per_frozen_set(tmp_path, replayed):
    cfg = quad_config(optim={"steps": 14, "groups": {"w": {"params": ["w"], "lr": 0.1}, "u": {"params": ["u"], "lr": 0.1}},
                             "freeze": {"w": {"until": 6}, "u": {"after": 10}}})
    cfg["checkpoint"] = {"schedule": "none"}
    eager = train(cfg, tmp_path / "eager", progress=False)
    got, (g,) = replayed(cfg, tmp_path / "graph")
    _same(eager, got)
    assert sorted(sorted(k) for k in g.updates) == [[], ["u"], ["w"]]


def test_divergence_takes_the_masked_eager_update(tmp_path, replayed):
    """A member whose loss overflows mid-run: from its step on the update is the eager, masked one (the
    diverged member keeps its state); the other member's trajectory is the eager one."""
    cfg = quad_config(seeds=[0], ensemble={"lrs": [{"w": 0.1}, {"w": 25.0}]}, data={"dim": 3, "curvature": 2.0},
                      checkpoint={"schedule": "none", "every": 5})
    cfg["optim"]["steps"] = 60
    eager = train(cfg, tmp_path / "eager", progress=False)
    got, _ = replayed(cfg, tmp_path / "graph")
    assert runs.read_meta(got[1])["status"] == "diverged"
    for a, b in zip(eager, got):
        assert runs.read_metrics(a) == runs.read_metrics(b)
    _same(eager[:1], got[:1])


def _job(groups=None, gens=None):
    """The parts of a Job that GraphedStep reads at construction."""
    from types import SimpleNamespace
    cfg = load_config("syn_small", [])
    return SimpleNamespace(device=torch.device("cpu"), cfg=cfg, task=SimpleNamespace(
        member_generators=lambda: gens or {}, model=None))


def test_a_batch_of_other_shapes_trains_eagerly(caplog):
    """Shapes are static in a graph: once captured, a batch whose shapes or dtypes differ trains eagerly, said
    once."""
    g = graphs.GraphedStep(_job())
    batch = (torch.zeros(2, 3), {"a": torch.zeros(4, dtype=torch.long)})
    assert g.applies(batch)
    g.sig = graphs._signature(batch)
    assert g.applies((torch.ones(2, 3), {"a": torch.ones(4, dtype=torch.long)}))
    with caplog.at_level("WARNING"):
        assert not g.applies((torch.zeros(2, 4), {"a": torch.zeros(4, dtype=torch.long)}))
        assert not g.applies((torch.zeros(2, 3), {"a": torch.zeros(4)}))
    assert [r.message for r in caplog.records].count(
        "cuda_graph: a batch's shapes differ from the captured one's; such steps train eagerly") == 1


def test_a_task_drawing_random_numbers_on_the_host_is_refused():
    with pytest.raises(ConfigError, match="draws random numbers on the host during its loss \\(dropout\\)"):
        graphs.GraphedStep(_job(gens={"dropout": [torch.Generator()]}))


def test_a_failed_capture_trains_eagerly_from_then_on(tmp_path, replayed, monkeypatch, caplog):
    """A loss that cannot be captured (here: the capture raises, as a host read inside a CUDA graph does):
    one warning, and the run is the eager run."""
    cfg = load_config("syn_small", SYN_SMALL).model_dump(mode="json")
    eager = train(cfg, tmp_path / "eager", progress=False)

    def refuse(fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(_Counted, "__init__", lambda self, fn: refuse(fn))
    with caplog.at_level("WARNING"):
        got, (g,) = replayed(cfg, tmp_path / "graph")
    _same(eager, got)
    assert g.off.startswith("the loss could not be captured (RuntimeError: operation not permitted")
    assert sum("training eagerly from here" in r.message for r in caplog.records) == 1


def test_config_refuses_cuda_graph_off_cuda():
    with pytest.raises(ConfigError, match="cuda_graph = true needs device = 'cuda'"):
        load_config("syn_small", ["cuda_graph=true"])


def test_cuda_graph_is_not_part_of_a_runs_identity():
    a = load_config("syn_small", []).model_dump(mode="json")
    b = dict(a, cuda_graph=True)
    assert runs.config_digest(a) == runs.config_digest(b)


def _cuda_cases():
    """name -> (config, whether the loss must be captured): Syn-Small (SGD momentum, grad_rows), a Fig 6 job (the
    support decoder's kernels), the topic model (Adam; its masked positions' count is read on the host, so its
    capture fails and it trains eagerly), the toy with a freeze schedule and a diverging member."""
    from tdyn.papers.scan_snap.analysis import FIG6, fig6_spec
    from tdyn.sweep.spec import load_spec, plan
    syn = load_config("syn_small", SYN_SMALL).model_dump(mode="json")
    fig6 = plan(load_spec(fig6_spec(FIG6)))[2].config
    fig6["optim"]["steps"] = 20
    topic = lda_config(E4, steps=12, seeds=(0, 1), every=4, quick=True)
    topic["checkpoint"] = {"schedule": "none"}
    quad = quad_config(seeds=[0], ensemble={"lrs": [{"w": 0.1}, {"w": 25.0}]}, data={"dim": 3, "curvature": 2.0},
                       optim={"steps": 60, "groups": {"w": {"params": ["w"], "lr": 0.1, "momentum": 0.5},
                                                      "u": {"params": ["u"], "lr": 0.1}},
                              "freeze": {"u": {"after": 30}}}, checkpoint={"schedule": "none", "every": 5})
    sched = load_config("syn_small", SYN_SMALL + ["optim.groups.Y.schedule={kind: cosine, warmup: 4}"]).model_dump(mode="json")
    return {"syn_small": (syn, True), "fig6_job": (fig6, True), "topic_adam": (topic, None), "quad": (quad, True),
            "syn_small_cosine": (sched, True)}


def _close(a_dirs, b_dirs):
    """Metrics and final tensors equal to float32 rounding (a default-mode CUDA run is not bitwise repeatable:
    its scatter-adds use atomics)."""
    for a, b in zip(a_dirs, b_dirs):
        (ma, ca), (mb, cb) = _state(a), _state(b)
        assert [r.keys() for r in ma] == [r.keys() for r in mb]
        for ra, rb in zip(ma, mb):
            for k in ra:
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), (a.name, ra["step"], k)
        for k in ca:
            torch.testing.assert_close(ca[k], cb[k], rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (benchmarks/gpu_graphs.sh runs it on a lent one)")
@pytest.mark.parametrize("mode", ["deterministic", "default"])
@pytest.mark.parametrize("name", ["syn_small", "fig6_job", "topic_adam", "quad", "syn_small_cosine"])
def test_cuda_graphs_equal_the_eager_cuda_step(name, mode, tmp_path, caplog):
    """Real CUDA graphs against the eager CUDA step: under torch's deterministic algorithms the same metrics and
    final tensors bit for bit (the graph replays the eager step's kernels); in the default mode, where the eager
    step itself is not bitwise repeatable, equal to float32 rounding."""
    cfg, captured = _cuda_cases()[name]
    cfg = dict(cfg, device="cuda")
    torch.use_deterministic_algorithms(mode == "deterministic")
    try:
        eager = train(cfg, tmp_path / "eager", progress=False)
        again = train(cfg, tmp_path / "again", progress=False)
        with caplog.at_level("WARNING"):
            got = train(dict(cfg, cuda_graph=True), tmp_path / "graph", progress=False)
    finally:
        torch.use_deterministic_algorithms(False)
    fell_back = any("training eagerly from here" in r.message for r in caplog.records)
    repeatable = all(runs.read_metrics(a) == runs.read_metrics(b) for a, b in zip(eager, again))
    print(f"{name} {mode}: eager repeatable {repeatable}, graph fell back {fell_back}",
          [r.message for r in caplog.records])
    if captured is not None and mode == "default":
        assert fell_back != captured, [r.message for r in caplog.records]
    if name == "quad":    # its lr-25 member diverges: the same metrics, and no final state to compare
        assert [runs.read_meta(d)["status"] for d in got] == [runs.read_meta(d)["status"] for d in eager]
        for a, b in zip(eager, got):
            assert runs.read_metrics(a) == runs.read_metrics(b)
    done = [i for i, d in enumerate(eager) if runs.read_meta(d)["status"] == "finished"]
    assert done
    (_same if mode == "deterministic" else _close)([eager[i] for i in done], [got[i] for i in done])


# ---------------------------------------------------------------- batches drawn on the GPU (config draw_on_device)


def test_config_refuses_draw_on_device_off_cuda():
    with pytest.raises(ConfigError, match="draw_on_device = true needs device = 'cuda'"):
        load_config("syn_small", ["draw_on_device=true"])


def test_draw_on_device_is_part_of_a_runs_identity_and_written_only_when_true():
    """Other batches, so another run: the digest differs; a config without it keeps the digest it had."""
    a = load_config("syn_small", []).model_dump(mode="json")
    assert "draw_on_device" not in a and "cuda_graph" not in a
    b = dict(a, device="cuda", draw_on_device=True)
    assert runs.config_digest(dict(a, device="cuda")) != runs.config_digest(b)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (benchmarks/gpu_graphs.sh runs it on a lent one)")
def test_a_batch_drawn_on_the_gpu_is_the_inverse_cdf_of_its_uniforms_and_its_counts_are_its_support():
    """Scan and Snap's sampler with CUDA generators: every context token is searchsorted(cdf[class], u) of the
    generator's own uniforms (replayed from its state), the counts are each sequence's histogram over its class
    support, G streams in one pass equal each alone, and one seed gives one batch."""
    from tdyn.papers.scan_snap.data import ScanSnapDataConfig, build, syn_medium
    from tdyn.seeding import generator
    dist = build(ScanSnapDataConfig(**syn_medium(5), seq_len=64, batch_size=32))
    gens = [generator(s, "data", "cuda") for s in (0, 1, 2)]
    states = [g.get_state() for g in gens]
    x, y, tokens, count = dist.sample_counts(32, 64, gens)
    assert x.is_cuda and x.shape == (3, 32, 64) and count.dtype == torch.int32
    for i, (g, st) in enumerate(zip(gens, states)):
        g.set_state(st)
        alone = dist.sample_counts(32, 64, g)
        for a, b in zip((x[i], y[i], tokens[i], count[i]), alone):
            assert torch.equal(a, b)
        g.set_state(st)
        cls = torch.randint(dist.K, (32,), generator=g, device="cuda")
        u = torch.rand(32, 63, generator=g, dtype=torch.float64, device="cuda")
        cdf = dist.cdf.cuda()[cls]
        ref = torch.searchsorted(cdf, u, right=True).clamp(max=dist.M - 1)
        assert torch.equal(x[i, :, :-1], ref) and torch.equal(y[i], dist.next_token.cuda()[cls])
        hist = torch.zeros(32, dist.M, dtype=torch.int32, device="cuda").scatter_add_(
            1, x[i, :, :-1], torch.ones_like(x[i, :, :-1], dtype=torch.int32))
        # padding columns (token M−1, a next-token id: never a context token) count 0, as in the histogram
        assert torch.equal(hist.gather(1, tokens[i]), count[i]) and bool((count[i].sum(1) == 63).all())
    x2 = dist.sample_counts(32, 64, [generator(s, "data", "cuda") for s in (0, 1, 2)])[0]
    assert torch.equal(x, x2)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (benchmarks/gpu_graphs.sh runs it on a lent one)")
@pytest.mark.parametrize("name", ["syn_small", "fig6_job"])
def test_batches_drawn_on_the_gpu_train_alike_eager_graphed_and_resumed(name, tmp_path, monkeypatch, caplog):
    """draw_on_device: other batches than the host's (other metrics), the same bits eager and as graphs (the
    step's and the draw's, each captured: no fallback) under deterministic algorithms, and a run stopped at a probe
    step and resumed equals the uninterrupted one."""
    import tdyn
    from tdyn.probes import PROBES, probe
    cfg, _ = _cuda_cases()[name]
    cfg = dict(cfg, device="cuda")
    stop_at = {"step": -1}
    draws = []
    capture = graphs.Prefetch._capture

    def counted(self):
        capture(self)
        draws.append(self.graph is not None)
    monkeypatch.setattr(graphs.Prefetch, "_capture", counted)
    caplog.set_level("WARNING")

    @probe("cuda_test.stopper")
    def stopper(ctx):
        if ctx.step == stop_at["step"]:
            trainer.stop_all()
        return {}

    torch.use_deterministic_algorithms(True)
    monkeypatch.setattr(trainer, "_STOP", False)
    try:
        host = train(cfg, tmp_path / "host", progress=False)
        dev = dict(cfg, draw_on_device=True)
        eager = train(dev, tmp_path / "eager", progress=False)
        graphed = train(dict(dev, cuda_graph=True), tmp_path / "graph", progress=False)
        stopping = dict(dev, cuda_graph=True, probes=dict(dev["probes"], every=5,
                        names=list(dev["probes"]["names"]) + ["cuda_test.stopper"]))
        ref = train(stopping, tmp_path / "ref", progress=False)
        stop_at["step"] = 10
        with pytest.raises(KeyboardInterrupt):
            tdyn.train(stopping, tmp_path / "r", progress=False)
        trainer._STOP = False
        stop_at["step"] = -1
        resumed = tdyn.train(stopping, tmp_path / "r", resume=True, progress=False)
    finally:
        torch.use_deterministic_algorithms(False)
        PROBES.unregister("cuda_test.stopper")
    assert not [r.message for r in caplog.records if "captured" in r.message]
    assert draws == [True] * 4, draws     # the graphed run, the reference, the stopped one and its resumption
    assert runs.read_metrics(host[0]) != runs.read_metrics(eager[0])
    _same(eager, graphed)
    drop = lambda m: [{k: v for k, v in r.items() if k != "wall"} for r in m]      # noqa: E731
    for a, b in zip(ref, resumed):
        assert runs.read_meta(b)["resumed"][0]["from_step"] == 11
        assert drop(runs.read_metrics(a)) == drop(runs.read_metrics(b))
        ca, cb = _state(a)[1], _state(b)[1]
        assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)
