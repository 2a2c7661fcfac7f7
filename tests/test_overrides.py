"""Every knob honoured (issue 13): --set reaches the configs a reproduction runs or exits 2 saying what
it accepts; shadowed overrides are errors; typed options; `tdyn config NAME` prints resolved YAML."""

import dataclasses

import pytest
import yaml

from tdyn.errors import UserError
from tdyn.reproduce import registry, runner
from tdyn.reproduce.registry import EXPERIMENTS, ReproduceContext


def test_every_reproduction_declares_what_it_takes():
    for name, exp in EXPERIMENTS.items().items():
        if name.startswith("test/"):
            continue
        assert exp.configs is not None or exp.takes_set is False, name


def test_config_works_for_every_declared_experiment(capsys):
    """`tdyn config NAME --quick` prints the resolved configs of every reproduction that declares them
    (in-process: one subprocess per experiment would be slow)."""
    import torch

    from tdyn.cli import main

    threads = torch.get_num_threads()
    try:
        for name, exp in EXPERIMENTS.items().items():
            if exp.configs is None or name.startswith("test/"):
                continue
            assert main(["config", name, "--quick"]) == 0, name
            out = list(yaml.safe_load_all(capsys.readouterr().out))   # one config bare, or one document each
            assert out and all("task" in c for c in out), name
    finally:
        torch.set_num_threads(threads)


def test_topic_and_decision_list_reject_bogus_set(cli, tmp_path):
    r = cli("reproduce", "topic/stage2", "--quick", "--out", tmp_path / "a", "--set", "bogus=1")
    assert r.returncode == 2 and "unknown key 'bogus'" in r.stderr and not (tmp_path / "a").exists()
    r = cli("reproduce", "decision-list/claim1", "--quick", "--out", tmp_path / "b", "--set", "bogus=1")
    assert r.returncode == 2 and "accepts no --set" in r.stderr and not (tmp_path / "b").exists()
    r = cli("reproduce", "topic/stage1", "--quick", "--out", tmp_path / "c", "--set", "preset=authors")
    assert r.returncode == 2 and "--preset" in r.stderr and not (tmp_path / "c").exists()


def test_tables_match_registrations():
    import importlib

    from tdyn import papers
    from tdyn.bench import BENCHES
    from tdyn.probes import PROBES
    from tdyn.tasks import TASKS

    for reg in (EXPERIMENTS, BENCHES, PROBES, TASKS):
        reg.names()  # imports every module of the table (the core's and the papers' manifests)
        names = {n for n in reg._items if not n.startswith("test")}
        assert names == set(reg.table), reg.kind
    for p in papers.manifests():   # descriptions are the manifests' (the report reads them without importing)
        for name, r in p.reproductions.items():
            assert EXPERIMENTS.get(name).description == r.description, name


def test_unused_and_shadowed_overrides_exit_2(cli, tmp_path):
    r = cli("reproduce", "scan-snap/fig3", "--out", tmp_path / "a", "--set", "bogus=1")
    assert r.returncode == 2 and "accepts no --set" in r.stderr and not (tmp_path / "a").exists()
    r = cli("reproduce", "scan-snap/fig4", "--out", tmp_path / "b", "--set", "bogus=1")
    assert r.returncode == 2 and "unknown key 'bogus'" in r.stderr and "tdyn config scan-snap/fig4" in r.stderr
    r = cli("reproduce", "scan-snap/fig4", "--out", tmp_path / "b", "--set", "optim.groups.Y.lr=5")
    assert r.returncode == 2 and "shadowed by ensemble.lrs" in r.stderr
    r = cli("run", "scan-snap/fig4", "--out", tmp_path / "b", "--set", "optim.groups.Y.lr=5")
    assert r.returncode == 2 and "shadowed by ensemble.lrs" in r.stderr
    r = cli("reproduce", "scan-snap/fig6", "--out", tmp_path / "c", "--set", "optim.groups.Z.lr=3")
    assert r.returncode == 2 and "axis of the Fig 6 sweep" in r.stderr
    r = cli("reproduce", "scan-snap/fig11-12", "--out", tmp_path / "c", "--set", "sweep_dir=x")
    assert r.returncode == 2 and "--sweep-dir" in r.stderr
    r = cli("reproduce", "real/topic-embeddings", "--out", tmp_path / "c", "--set", "optim.steps=3")
    assert r.returncode == 2 and "accepts no --set" in r.stderr


@pytest.mark.parametrize("name, override, flag", [
    ("icl-gd/k-layers-untied", "data.x_max=0.5", "--x-max 0.5"),   # the judge's text and theory read --x-max
    ("icl-gd/one-layer", "data.batch_size=64", "--batch-size 64"),
    ("birth/induction", "optim.steps=3", "--steps 3"),
])
def test_a_key_an_option_writes_is_refused_naming_the_option(name, override, flag, tmp_path):
    """``--set data.x_max=0.5`` used to change the runs while the claim texts and the theory's reference
    still read the option (U(-1, 1)): a nested key that an option writes exits 2 naming the option."""
    exp = registry.get(name)
    ctx = ReproduceContext(out=tmp_path / "a", quick=True, overrides=[override], options=exp.make_options())
    with pytest.raises(UserError, match=f"written by {name}'s option .*; use {flag}$"):
        runner.check_overrides(exp, ctx)
    for fine in ("data.probe_size=100",) if name.startswith("icl") else ("optim.groups.all.momentum=0.5",):
        runner.check_overrides(exp, ReproduceContext(out=tmp_path / "b", quick=True, overrides=[fine],
                                                     options=exp.make_options()))   # keys no option writes pass


@pytest.mark.parametrize("name, override, says", [
    ("icl-gd/k-layers-untied", "model.layers=2", "take 'model.layers' as given (each run's depth K is its job's (--Ks"),
    ("icl-gd/k-layers-untied", "optim.grad_clip=5", "runs differ in 'optim.grad_clip' (K3: 10.0, K2: 0.001)"),
    ("topic/no-unchanged-mask", "data.mask_correct_prob=0.1", "differ in 'data.mask_correct_prob'"),
    ("real/entropy-vs-lr", "data.corpus=wiki", "differ in 'data.corpus'"),
    ("icl-gd/k-layers-untied", "model.tied=true", "take 'model.tied' as given (separate (untied) layers"),
    ("icl-gd/k-layers-untied", "model={layers: 3, tied: false}", "take 'model.tied' as given"),   # a section holding it
    ("topic/stage1", "model.l2=0.1", "take 'model.l2' as given"),       # e2-l2 is planned from e2: not in its configs
    ("icl-gd/one-layer", "model.layers=2", "take 'model.layers' as given (one LSA layer against one GD step)"),
    # the second audit (twenty-second session): numbers computed from the plan's own config, or a crash
    ("topic/two-stage", "model.init_eps=0.01", "take 'model.init_eps' as given"),     # measure's default cell: crash
    ("decision-list/claim2", "data.sampler=A", "take 'data.sampler' as given (η = f/λ_max(0)"),
    ("decision-list/uniform-attention", "data.L=12", "take 'data.L' as given"),
    ("decision-list/uniform-attention", "optim.groups.all.momentum=0.9", "plain gradient descent"),
    ("scan-snap/thm3", "model.init=torch_default", "Theorem 3's z(0) = 0"),
    ("scan-snap/snap-time", "optim.groups.Y.momentum=0.9", "Theorem 4's setting: plain SGD"),
    ("scan-snap/fig5", "optim.groups.Z.optimizer=sgd", "Fig 5 is the paper's Adam run"),
    ("scan-snap/fig4", "ensemble.lrs=[{Y: 2.0, Z: 2.0}]", "take 'ensemble.lrs' as given"),
    ("topic/embeddings", "model.value=trained", "E1 is trained embeddings"),
    ("topic/stage1", "model.loss=squared", "take 'model.loss' as given"),
    ("real/attention-maps", "data.bptt=64", "entropy ceiling"),
    # the quick-mode audit (twenty-third session): maps laid out as Syn-Small's tokens
    ("scan-snap/fig4", "data.num_common=5", "laid out as Syn-Small's tokens"),
    ("scan-snap/fig5", "data.num_unique_per_next=5", "1/10 of the distinct tokens"),
    # --set seeds without --seed's: the figures look for seed --seed's runs (crashed in draw or measure)
    ("scan-snap/fig5", "seeds=[7]", "use --seed N"),
    ("scan-snap/snap-time", "seeds=[7]", "use --seed N"),
    ("topic/two-stage", "seeds=[7]", "use --seed N"),
])
def test_a_key_the_claims_rest_on_is_refused(name, override, says, tmp_path):
    """Found by an audit (twenty-first session): ``--set`` on a key the reproduction compares its runs along
    (every K trained at one depth, both corpora on one) or that its claims take as given (untied layers run tied)
    changed the runs under claim texts that named the old setting; both exit 2 naming the key."""
    exp = registry.get(name)
    with pytest.raises(UserError) as e:
        runner.check_overrides(exp, ReproduceContext(out=tmp_path, quick=True, overrides=[override],
                                                     options=exp.make_options()))
    assert says in str(e.value)


def test_config_exports_what_the_claims_checks_refuse(cli):
    """``tdyn config`` prints configs for ``tdyn run`` and judges nothing: an override the reproduction would refuse
    for its claims (a fixed key) is printed, an unknown key still exits 2."""
    r = cli("config", "icl-gd/k-layers-untied:K3", "--quick", "--set", "model.tied=true")
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["model"]["tied"] is True
    r = cli("config", "icl-gd/k-layers-untied:K3", "--quick", "--set", "model.bogus=1")
    assert r.returncode == 2 and "bogus" in r.stderr


def test_reproduce_all_checks_every_reproduction_s_set_before_anything_runs(tmp_path):
    """``reproduce --all --set``: a reproduction that refuses the override stops the whole run before any directory
    is made (it used to surface midway as a failed reproduction), naming the refusers and the first reason."""
    from tdyn.reproduce.runner import reproduce_all

    out = tmp_path / "all"
    with pytest.raises(UserError, match=r"1 of 2 reproductions refuse it, so none ran \(icl-gd/k-layers-untied\); "
                                        r"icl-gd/k-layers-untied: icl-gd/k-layers-untied's claims take 'model.tied'"):
        reproduce_all(out, quick=True, overrides=["model.tied=true"], progress=False,
                      names=["icl-gd/one-layer", "icl-gd/k-layers-untied"])
    assert not out.exists()


def test_every_declared_fixed_key_is_a_key_of_the_configs():
    """A manifest's ``fixed`` key names a key its run configs hold (a misspelt one would refuse nothing)."""
    from tdyn import papers

    for paper in papers.manifests():
        for name, r in paper.reproductions.items():
            if not r.fixed:
                continue
            exp = registry.get(name)
            cfgs = runner.resolved_configs(exp, ReproduceContext(out=".", quick=True, options=exp.make_options()))
            for key in r.fixed:
                for cfg in cfgs.values():
                    node = cfg.model_dump(mode="json")
                    for part in key.split("."):
                        assert isinstance(node, dict) and part in node, (name, key)
                        node = node[part]


def test_claims_made_under_set_are_labelled_and_judged_again_with_it(cli, tmp_path):
    """Every claim of a reproduction run with ``--set`` carries the overrides (the report and the CLI show
    "under --set …": the claim text states the reproduction's own setting); ``--judge-only`` rebuilds the
    configs with the overrides the tables were made with and keeps the label."""
    import json

    out = tmp_path / "r"
    r = cli("reproduce", "icl-gd/one-layer", "--quick", "--out", out, "--set", "data.probe_size=500")
    assert r.returncode == 0, r.stderr
    assert "under --set data.probe_size=500]" in r.stdout
    claims = json.loads((out / "results.json").read_text())["claims"]
    assert claims and all(c["overrides"] == ["data.probe_size=500"] for c in claims)
    r = cli("reproduce", "icl-gd/one-layer", "--judge-only", "--out", out)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["overrides"] == ["data.probe_size=500"]
    assert "--judge-only" in res["judged"]["command"] and "--set" not in res["judged"]["command"]   # it runs as given
    assert all(c["overrides"] == ["data.probe_size=500"] for c in res["claims"])
    r = cli("report", out)
    assert r.returncode == 0 and "(under --set data.probe_size=500)" in (out / "index.html").read_text()


def test_options_in_help_and_config_yaml(cli):
    r = cli("reproduce", "scan-snap/fig11-12", "--help")
    assert r.returncode == 0 and "--sweep-dir" in r.stdout
    r = cli("config", "scan-snap/fig4", "--set", "optim.steps=7", "--set", "ensemble.lrs=[{Y: 5, Z: 1}]")
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)                   # its one config, bare: what `tdyn run` takes back
    assert cfg["optim"]["steps"] == 7 and cfg["ensemble"]["lrs"] == [{"Y": 5.0, "Z": 1.0}]
    r = cli("config", "scan-snap/snap-time", "--quick")
    assert r.returncode == 0 and len(list(yaml.safe_load_all(r.stdout))) == 3
    r = cli("config", "scan-snap/fig5", "--quick")
    assert yaml.safe_load(r.stdout)["optim"]["steps"] == 50
    r = cli("config", "scan-snap/fig9")
    assert r.returncode == 2


def test_undeclared_reproduction_that_ignores_set_is_an_error(tmp_path, monkeypatch):
    """The mechanism the not-yet-declared modules get: configure() marks ctx.overrides consumed."""
    from tdyn.reproduce.common import configure

    from conftest import quad_config

    def ignores(ctx):
        return {"claims": []}

    def uses(ctx):
        cfg = configure(quad_config(), ctx.overrides)
        return {"claims": [], "steps": cfg.optim.steps}

    for name, fn in (("test/ignores", ignores), ("test/uses", uses)):
        monkeypatch.setitem(registry._REGISTRY, name, registry.Experiment(name, "", fn))
    with pytest.raises(UserError, match="used none of --set"):
        runner.run_reproduction(EXPERIMENTS.get("test/ignores"),
                                ReproduceContext(out=tmp_path / "i", overrides=["optim.steps=3"]))
    res = runner.run_reproduction(EXPERIMENTS.get("test/uses"),
                                  ReproduceContext(out=tmp_path / "u", overrides=["optim.steps=3"]))
    assert res["steps"] == 3 and res["overrides"] == ["optim.steps=3"]


def test_grids_are_typed_options(cli, tmp_path):
    """A reproduction's grid is a typed option (listed by --help, comma-separated lists, validated)."""
    r = cli("reproduce", "scan-snap/fig6", "--help")
    assert r.returncode == 0 and "--ratios RATIOS,..." in r.stdout and "--num-last" in r.stdout
    r = cli("config", "scan-snap/fig6", "--quick", "--num-last", "3")
    assert r.returncode == 0 and "num_last: 3" in r.stdout
    r = cli("reproduce", "decision-list/uniform-attention", "--quick", "--steps", "0", "--out", tmp_path / "u")
    assert r.returncode == 2 and "option.steps" in r.stderr and not (tmp_path / "u").exists()
    r = cli("reproduce", "decision-list/claim1", "--quick", "--L", "ten", "--out", tmp_path / "c")
    assert r.returncode == 2 and "option.L" in r.stderr


def test_with_options_replaces_only_given_entries():
    from tdyn.papers.decision_list.analysis import with_grid_options
    from tdyn.papers.decision_list.claim1 import Claim1Options, claim1_grid

    g = with_grid_options(claim1_grid(True), Claim1Options(L=[10], N=7, workers=2))
    assert g.L == [10] and g.N == 7 and g.n == claim1_grid(True).n and g.fixed_c == claim1_grid(True).fixed_c
    assert with_grid_options(claim1_grid(True), None) == claim1_grid(True)


def test_short_number_writes_hyperparameters_as_the_claims_do():
    from tdyn.reproduce.common import short_number

    assert [short_number(x) for x in (0.2, 0.9, 1e-3, 1e-4, 2.5e-4, 5e-4, 0.0, 10.0)] == \
        ["0.2", "0.9", "1e-3", "1e-4", "2.5e-4", "5e-4", "0", "10"]


@pytest.mark.parametrize("overrides, says, not_says", [
    ([], "SGD (lr 0.2, momentum 0.9, weight decay 1e-4), batch 64, 600 steps", None),
    (["optim.groups.all.momentum=0.5"], "SGD (lr 0.2, momentum 0.5, weight decay 1e-4)", "momentum 0.9"),
    (["optim.groups.all.weight_decay=0", "data.k=3"], "K = 3 fixed triggers", "weight decay 1e-4"),
    (["optim.groups.all.optimizer=adam"], "Adam (lr 0.2, β = (0.9, 0.999), weight decay 1e-4)", "SGD"),
])
def test_birth_claims_state_the_setting_the_runs_train(overrides, says, not_says):
    """The claim texts read the optimizer, sizes and triggers from the run config after --set (the audit's stale
    "momentum 0.9" under another momentum), and say at the defaults what the committed evidence says."""
    from tdyn.papers.birth import memories
    from tdyn.papers.birth.analysis import setting_text

    ctx = ReproduceContext(out="unused", overrides=overrides, options=memories.Options())
    text = setting_text(ctx, memories.plan(ctx), memories.settings(ctx), "fixed triggers", "loss on the outputs",
                        probes="")
    assert says in text and (not_says is None or not_says not in text), text


@pytest.mark.parametrize("name, overrides, says", [
    ("icl-gd/k-layers", [], "Adam as the authors', batch 2048"),
    ("icl-gd/k-layers", ["data.batch_size=512"], "Adam as the authors', batch 512"),
    ("icl-gd/k-layers-untied", ["optim.groups.all.lr=0.002"], "Adam (lr 0.002, β = (0.9, 0.98)), batch 2048"),
    ("icl-gd/one-layer", [], "Adam (lr 1e-3, β = (0.9, 0.98)), batch 2048"),
    ("icl-gd/one-layer", ["optim.grad_clip=null"], "Adam (lr 1e-3, β = (0.9, 0.98), gradients not clipped), batch 2048"),
])
def test_icl_gd_claims_state_the_optimizer_and_batch_the_runs_train(name, overrides, says):
    from tdyn.papers.icl_gd import analysis, k_layers, one_layer

    mod = one_layer if name == "icl-gd/one-layer" else k_layers
    exp = EXPERIMENTS.items()[name]
    ctx = ReproduceContext(out="unused", overrides=overrides, options=exp.options())
    data, adam = analysis.trained_setting(ctx, mod.plan(ctx), authors=None if mod is one_layer
                                          else "Adam as the authors'")
    assert says == f"{adam}, batch {data.batch_size}"


def test_fig4_loss_axis_names_the_optimizer_the_runs_trained_with():
    """Fig 4's loss panel reads the optimizer and batch from the config table (it said "momentum 0.9" under any
    --set); one line when the groups agree, per group when not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tdyn.papers.scan_snap.fig4_fig5 import _fig4_loss

    shown = [{"eta_y": 1.0, "eta_z": 1.0, "M": 30}]
    loss = [{"eta_y": 1.0, "eta_z": 1.0, "step": s, "loss": 1.0 / (s + 1)} for s in range(3)]
    sgd = {"optimizer": "sgd", "momentum": 0.9}
    for groups, says in (({"Y": sgd, "Z": sgd}, "step (SGD, momentum 0.9, batch 128)"),
                         ({"Y": sgd | {"momentum": 0.5}, "Z": sgd},
                          "step (Y: SGD, momentum 0.5; Z: SGD, momentum 0.9, batch 128)")):
        fig, ax = plt.subplots()
        _fig4_loss(ax, loss, shown, {"optim": {"groups": groups}, "data": {"batch_size": 128}})
        assert ax.get_xlabel() == says
        plt.close(fig)


@pytest.mark.parametrize("quick, overrides, says", [
    (False, [], {"long_L_sgd": (1024, "plain SGD"), "paper_L128_momentum": (128, "momentum 0.9")}),
    (True, [], {"long_L_sgd": (512, "plain SGD"), "paper_L128_momentum": (128, "momentum 0.9")}),
    (False, ["data.seq_len=256", "optim.groups.Y.momentum=0.5"],
     {"long_L_sgd": (256, "momentum 0/0.5"), "paper_L128_momentum": (256, "momentum 0.5/0.9")}),
])
def test_thm3_claims_and_legend_name_the_length_and_optimizer_trained(quick, overrides, says):
    """Thm 3's texts and legend said "L = 1024, plain SGD" for the quick setting's L = 512 and under any --set;
    they read both from the run configs."""
    from tdyn.papers.scan_snap import thm3

    ctx = ReproduceContext(out="unused", quick=quick, overrides=overrides)
    assert thm3.trained_as(ctx) == says


def test_snap_time_grids_are_the_configs_trained():
    """The results' ``grids`` block: the grid's own fields at the defaults; under --set the resolved values, with
    steps per run instead of the t₀ factor they no longer follow."""
    from tdyn.papers.scan_snap.snap_time import SNAP_THM_QUICK, grids

    plain = grids(ReproduceContext(out="unused", quick=True))
    assert plain["theorem"] == dataclasses.asdict(SNAP_THM_QUICK)
    set_ = grids(ReproduceContext(out="unused", quick=True, overrides=["data.batch_size=32", "optim.steps=50"]))
    assert set_["theorem"]["batch_size"] == set_["paper"]["batch_size"] == 32
    assert set_["paper"]["steps"] == {"last1": 50, "last3": 50} and "t0_factor" not in set_["paper"]
    assert set_["theorem"]["etas_y"] == list(SNAP_THM_QUICK.etas_y) and set_["theorem"]["eta_z"] == 0.02


def test_attention_maps_checkpoints_and_title_follow_set():
    """Fig 7's checkpoints were listed at 0, T/3, 2T/3 of the default T, so ``--set optim.steps=60`` crashed in
    measure (no checkpoint at 80); its title named the quick defaults under any --set."""
    from tdyn.papers.real_text import attention_maps
    from tdyn.reproduce.common import configure
    from tdyn.train.trainer import checkpoint_schedule

    for quick, overrides, listed in ((False, [], {0, 500, 1000}), (True, [], {0, 80, 160}),
                                     (True, ["optim.steps=60"], {0, 20, 40})):
        ctx = ReproduceContext(out="unused", quick=quick, overrides=overrides)
        assert checkpoint_schedule(configure(attention_maps.plan(ctx)["layers1"], overrides)).listed == listed
    assert attention_maps._title(True, []).startswith("QUICK run (240 steps, vocabulary 2,000, d = 64)\n")
    title = attention_maps._title(True, ["model.d=32", "model.d_hid=32", "optim.steps=60"])
    assert title.startswith("QUICK run (60 steps, vocabulary 2,000, d = 32) (--set model.d=32"), title
    assert attention_maps._title(False, []) == "Tian et al. Fig 7 analogue: layer-0 attention on validation window 0 (wiki) during training"


def test_ratio_derivation_states_what_the_single_rate_runs_measured():
    """The separate-rate claims' derivation said the single-rate attention "has already collapsed at η = 4 and 5",
    a result the quick runs do not show; it now cites the table's ends."""
    from tdyn.papers.real_text.entropy_vs_lr import ratio_derived

    quick = ratio_derived({"eta": [1.0, 2.0, 3.0, 4.0, 5.0], "mean": [2.52, 2.26, 2.06, 2.12, 2.04]})
    assert "collapsed" not in quick
    assert "(η ≤ 5), whose final entropy is 2.12 at η = 4, 2.04 at η = 5 against 2.52 at η = 1" in quick
    lead = ratio_derived({"eta": [1.0, 5.0], "mean": [2.0, 0.009]}, "Its η_Z = 3 cells at ratios 2 and 5 use")
    assert "Its η_Z = 3 cells at ratios 2 and 5 use η_Y = 6 and 15" in lead and "0.009 at η = 5 against 2.00 at η = 1" in lead
