"""A reproduction's planned jobs train on the local pool (``tdyn.reproduce.phases.train_plan``): the tables are
byte-equal to the sequential loop's, and a pool's worker starts no pool of its own by default."""

from __future__ import annotations

import torch

from tdyn.reproduce import phases
from tdyn.sweep import executors


def test_plan_on_two_workers_writes_the_tables_of_one(tmp_path, monkeypatch):
    """decision-list/claim2 (small options: 6 jobs, λ_max probes, the free-c pair) with 1 and with 2 workers:
    claim2.csv, claim2_free_c.csv and its curves byte-equal."""
    from tdyn.papers.decision_list.claim2 import Claim2Options
    from tdyn.reproduce.registry import ReproduceContext, get

    torch.set_num_threads(1)
    outs = []
    for w in (1, 2):
        monkeypatch.setattr(phases, "default_workers", lambda w=w: w)
        ctx = ReproduceContext(out=tmp_path / f"w{w}", quick=True, progress=False,
                               options=Claim2Options(inside_steps=8, steps=40, eta=[1.0], eps=[1.0, 10.0]))
        ctx.out.mkdir()
        get("decision-list/claim2").reproduce(ctx)
        outs.append({f: (ctx.out / f).read_bytes()
                     for f in ("claim2.csv", "claim2_free_c.csv", "claim2_free_c_curves.csv")})
    assert outs[0] == outs[1] and outs[0]["claim2.csv"].count(b"\n") == 1 + 2 + 2


def test_a_pool_worker_starts_no_pool_by_default():
    pool = executors.process_pool(1)
    try:
        assert pool.submit(executors.default_workers).result() == 1
    finally:
        pool.shutdown()
    assert not executors.IN_WORKER


def test_all_at_once_gives_every_job_a_worker(tmp_path, monkeypatch):
    """``Phases.all_at_once`` (topic/two-stage): one worker per planned job even beyond the cores; without it
    one per core; in a pool's worker (one core's worth) the jobs still train one after another."""
    import concurrent.futures as cf
    from tdyn.reproduce.registry import ReproduceContext

    sizes, inline = [], []

    class _Pool:
        def __init__(self, n):
            sizes.append(n)

        def submit(self, fn, *a):
            f = cf.Future()
            f.set_result(fn(*a))
            return f

        def shutdown(self):
            pass

    monkeypatch.setattr(phases, "process_pool", _Pool)
    monkeypatch.setattr(phases, "train_job", lambda out, resume, name, cfg: [name])
    monkeypatch.setattr(phases, "train_into", lambda ctx, name, cfg: inline.append(name) or [name])
    ctx = ReproduceContext(out=tmp_path, quick=True, progress=False)
    jobs = {"a": {}, "b": {}, "c": {}}
    for cores, at_once, want in ((2, True, [3]), (2, False, [2]), (16, True, [3]), (1, True, [])):
        sizes.clear()
        monkeypatch.setattr(phases, "default_workers", lambda c=cores: c)
        assert phases.train_plan(ctx, jobs, all_at_once=at_once) == {k: [k] for k in jobs}
        assert sizes == want, (cores, at_once)
    assert inline == ["a", "b", "c"]
