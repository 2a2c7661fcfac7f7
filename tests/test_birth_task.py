"""The ``birth`` task through the trainer, the reproductions end to end at small settings, the CLI's refusals
(docs/reproductions/birth.md#tests)."""

import json

import pytest
import torch
from conftest import benchmarks_script, check_text_patch

from tdyn import runs
from tdyn.papers.birth.task import birth_config
from tdyn.train.trainer import train


def _cfg(seeds, steps=6, **kw):
    return birth_config(seeds=seeds, steps=steps, d=16, T=16, batch_size=8, probe_every=3, probe_size=8, lr=0.2, **kw)


@pytest.mark.parametrize("kw", [dict(final_ffn=True, loss_on="all"),
                                dict(data={"fixed_triggers": False, "triggers": "train", "ood_triggers": "test"})])
def test_an_ensemble_member_equals_its_run_alone_bit_for_bit(tmp_path, kw):
    """kernels.masked_loss computes each member's products alone, so a member's metrics and parameters are the
    same bits in an ensemble as alone (what lets a reproduction train one job per seed on every core)."""
    both = train(_cfg([0, 1, 2], **kw), tmp_path / "both", progress=False)
    alone = train(_cfg([1], **kw), tmp_path / "alone", progress=False)
    assert runs.Run(both[1]).metrics == runs.Run(alone[0]).metrics
    for name, p in runs.Run(alone[0]).params().items():
        assert torch.equal(p, runs.Run(both[1]).params()[name]), name
    assert [r["loss"] for r in runs.Run(both[0]).metrics] != [r["loss"] for r in runs.Run(both[1]).metrics]


def test_a_plan_is_one_job_per_seed_whose_rows_are_the_ensembles(tmp_path):
    """analysis.per_seed: one job per seed (the pool trains them on every core); their rows (trained_rows) are
    the rows of the one ensemble job of every seed, bit for bit; a single seed stays one job."""
    from types import SimpleNamespace

    from tdyn.papers.birth.analysis import per_seed, trained_rows

    cfg = _cfg([0, 1, 2], data={"outputs": "train", "ood_outputs": "test"})
    ctx = SimpleNamespace(overrides=[])
    jobs = per_seed(ctx, "memories", cfg)
    assert list(jobs) == ["memories-seed0", "memories-seed1", "memories-seed2"]
    assert [j["seeds"] for j in jobs.values()] == [[0], [1], [2]]
    assert list(per_seed(ctx, "memories", _cfg([4]))) == ["memories"]
    split = trained_rows({n: train(c, tmp_path / n, progress=False) for n, c in jobs.items()})
    one = trained_rows({"memories": train(cfg, tmp_path / "one", progress=False)})
    assert [(r["seed"], r["step"]) for r in one] == [(s, t) for s in (0, 1, 2) for t in (0, 3, 6)]
    assert json.dumps(split) == json.dumps(one)          # NaN (metrics a config has not) written alike


def test_a_per_seed_job_resumed_after_an_interrupt_is_the_uninterrupted_one(tmp_path, monkeypatch):
    """A plan's job (one seed, random triggers: the fused loss and the batched sampler's streams) stopped at step 3
    and resumed ends with the metrics and parameters of the run never stopped, bit for bit (what lets a
    reproduction's per-seed jobs be resumed)."""
    import tdyn
    from tdyn.probes import PROBES, probe
    from tdyn.train import trainer

    stop_at = {"step": 3}

    @probe("birth_test.stopper")
    def stopper(ctx):
        if ctx.step == stop_at["step"]:
            trainer.stop_all()
        return {}

    monkeypatch.setattr(trainer, "_STOP", False)
    try:
        cfg = _cfg([1], steps=8, data={"fixed_triggers": False, "triggers": "train", "ood_triggers": "test"})
        cfg["probes"] = dict(cfg["probes"], names=list(cfg["probes"]["names"]) + ["birth_test.stopper"])
        with pytest.raises(KeyboardInterrupt):
            tdyn.train(cfg, tmp_path / "r", progress=False)
        trainer._STOP = False
        stop_at["step"] = -1
        (d,) = tdyn.train(cfg, tmp_path / "r", resume=True, progress=False)
        (ref,) = tdyn.train(cfg, tmp_path / "ref", progress=False)
    finally:
        PROBES.unregister("birth_test.stopper")
    a, b = runs.Run(d), runs.Run(ref)
    assert a.meta["resumed"][0]["from_step"] == 4
    drop = lambda m: [{k: v for k, v in r.items() if k != "wall"} for r in m]      # noqa: E731
    assert drop(a.metrics) == drop(b.metrics) and [r["step"] for r in b.metrics][-1] == 8
    pa, pb = a.params(), b.params()
    assert set(pa) == set(pb) and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_training_lowers_the_loss_and_logs_the_probes(tmp_path):
    cfg = birth_config(seeds=[0], steps=60, d=32, T=32, batch_size=16, probe_every=20, probe_size=16, lr=0.2,
                       data={"ood_outputs": "test", "outputs": "train"})
    (d,) = train(cfg, tmp_path / "r", progress=False)
    m = runs.Run(d).metrics
    assert m[-1]["birth.icl/loss_out"] < m[0]["birth.icl/loss_out"] - 0.2
    keys = {"birth.memory/W_O2", "birth.memory/W_K2", "birth.memory/W_K1", "birth.memory/W_K1_64",
            "birth.icl/acc_out", "birth.icl/acc_first", "birth.icl/attn1_prev", "birth.icl/attn2_ind",
            "birth.icl/acc_out_ood", "birth.icl/loss_out_ood"}
    assert keys <= set(m[-1])
    assert "birth.memory/bigram_kl" not in m[-1]            # no W_F, no bigram memory to measure


def test_held_out_trigger_probes(tmp_path):
    # the probe set of held-out triggers holds only tokens 48–64 as triggers, the training one only 0–47, and both
    # are measured (a quick run of the heldout-triggers setting)
    from tdyn.config import load_config
    from tdyn.tasks import build_task
    from tdyn.train.trainer import expand_members
    cfg = _cfg([0], data={"fixed_triggers": False, "triggers": "train", "ood_triggers": "test"})
    rc = load_config(cfg)
    task = build_task(rc, expand_members(rc))
    ps = task.probe_set
    assert int(ps["x"][ps["occ"] > 0].max()) < 48 and int(ps["x_tood"][ps["occ_tood"] > 0].min()) >= 48
    assert (ps["occ_tood"] >= 2).any()
    assert task.triggers.tolist() == list(range(48)) and task.triggers_ood.tolist() == list(range(48, 65))
    (d,) = train(cfg, tmp_path / "r", progress=False)
    last = runs.Run(d).metrics[-1]
    for k in ("birth.icl/acc_out_tood", "birth.icl/loss_out_tood", "birth.icl/attn2_ind_tood",
              "birth.memory/W_K2_ood"):
        assert 0 <= last[k] < 10, k


def test_heldout_triggers_runs_end_to_end(tmp_path, cli):
    out = tmp_path / "r"
    r = cli("reproduce", "birth/heldout-triggers", "--quick", "--out", str(out), "--quiet", "--steps", "10",
            "--d", "16", "--T", "16", "--batch-size", "8")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert [c["id"] for c in res["claims"]] == ["induction_with_random_triggers", "induction_on_heldout_triggers"]
    assert all(c["source"] == "derived" and c["verdict"] in ("holds", "fails", "inconclusive") for c in res["claims"])
    assert (out / "triggers.csv").exists() and (out / "triggers.png").exists()
    assert "acc_out_tood" in (out / "triggers.csv").read_text().splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize("name,table", [("birth/memories", "memories"), ("birth/induction", "induction")])
def test_reproduction_runs_end_to_end(tmp_path, cli, name, table):
    out = tmp_path / "r"
    r = cli("reproduce", name, "--quick", "--out", str(out), "--quiet", "--steps", "20")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert {c["source"] for c in res["claims"]} == {"paper", "derived"}
    assert all(c["verdict"] in ("holds", "fails", "inconclusive") for c in res["claims"])
    assert (out / f"{table}.csv").exists() and (out / f"{table}.png").exists()
    j = cli("reproduce", name, "--judge-only", "--out", str(out), "--quiet")
    assert j.returncode == 0, j.stderr[-2000:]


@pytest.mark.parametrize("args,words", [
    (["reproduce", "birth/memories", "--steps", "0"], "steps"),
    (["reproduce", "birth/induction", "--d", "1"], "d"),
    (["reproduce", "birth/memories", "--lr", "-1"], "lr"),
    (["reproduce", "birth/heldout-triggers", "--steps", "0"], "steps"),
    (["reproduce", "birth/heldout-triggers", "--batch-size", "0"], "batch"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, cli, args, words):
    r = cli(*args, "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


@pytest.mark.parametrize("setting,words", [("data.k=70", "data.k"), ("data.bigrams=bogus", "data.bigrams"),
                                           ("model.d=1", "model.d"), ("data.outputs=half", "data.outputs"),
                                           ("data.triggers=train", "data.triggers"),
                                           ("data.triggers=half", "data.triggers"),
                                           ("data.ood_triggers=test", "data.ood_triggers")])
def test_bad_configs_exit_2_with_one_line(tmp_path, cli, setting, words):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(_cfg([0])))
    r = cli("run", str(cfg), "--set", setting, "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_the_dirichlet_vocabulary_check_exits_2(tmp_path, cli):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(_cfg([0], data={"bigrams": "dirichlet", "vocab": 8, "k": 9})))
    r = cli("run", str(cfg), "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "vocabulary" in r.stderr, r.stderr


def test_the_paper_is_listed(cli):
    r = cli("list")
    assert r.returncode == 0
    assert "birth/memories" in r.stdout and "birth/induction" in r.stdout and "birth.memory" in r.stdout
    assert "birth/heldout-triggers" in r.stdout


# ---------------------------------------------------------------- the authors' code in tdyn bench
def test_the_authors_bench_is_registered_and_skips_without_its_checkout(monkeypatch):
    from tdyn.bench import BENCHES
    from tdyn.papers.birth import MANIFEST

    assert MANIFEST.benches["birth_authors"] == "tdyn.papers.birth.bench" and "birth_authors" in BENCHES.table
    monkeypatch.delenv("TDYN_ANCHOR_BIRTH", raising=False)
    out = BENCHES.get("birth_authors")(True)
    assert set(out) == {"skipped"} and "TDYN_ANCHOR_BIRTH" in out["skipped"]


def test_the_authors_bench_refuses_a_wrong_checkout_with_one_line(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("TDYN_ANCHOR_BIRTH", str(tmp_path / "nowhere"))
    r = cli("bench", "--quick", "--only", "birth_authors", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "TDYN_ANCHOR_BIRTH" in r.stderr, r.stderr
    assert not (tmp_path / "b.json").exists()


def test_the_patch_script_applies_the_three_patches_once(tmp_path):
    mod = benchmarks_script("birth_authors_patch")
    with pytest.raises(SystemExit, match="no checkout"):
        mod.patch(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.pkl").write_bytes(b"")
    check_text_patch(mod, tmp_path, tmp_path / "ihead_basic_main.py",
                     "x = torch.zeros(2).cuda()\n    model = Transformer(cfg.model_args)\n    model.cuda()\n"
                     "    json.dump(dict(cfg), f, sort_keys=True)\n",
                     "x = torch.zeros(2)\n    torch.manual_seed(cfg.seed)\n    model = Transformer(cfg.model_args)\n"
                     "    model\n    json.dump(OmegaConf.to_container(cfg), f, sort_keys=True)\n", "165e11a")
