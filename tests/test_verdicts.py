"""The verdict vocabulary (three outcomes, margins, readings side by side) and the generated README table."""

import json

import pytest

from tdyn.errors import UserError
from tdyn.reproduce.common import claim, decide, reading
from tdyn.report import verdicts

# every claim names its provenance (a paper claim quotes the paper), its paper statement and definition
REF = {"source": "paper", "quote": "the loss falls", "paper": "Fig 1", "definition": "the loss"}
DERIVED = {"source": "derived", "derived": "tdyn's extrapolation to a deeper model", "paper": "Fig 1", "definition": "d"}


def test_decide_needs_a_margin_above_noise():
    assert decide(0.5, 0.1) is True           # 0.5 > 2·0.1
    assert decide(-0.5, 0.1) is False
    assert decide(0.15, 0.1) is None          # inside the ±2·noise band: inconclusive, not a failure
    assert decide(0.0, 0.0) is None           # a quantity that never moved
    assert decide(float("nan"), 0.1) is None
    assert decide(0.25, 0.1, k=3) is None


def test_three_outcomes_and_reasons():
    assert claim("a", "x", True, **REF)["verdict"] == "holds"
    assert claim("b", "x", False, **REF)["verdict"] == "fails"
    c = claim("c", "x", None, reason="run too short", **REF)
    assert c["verdict"] == "inconclusive" and c["reason"] == "run too short"
    assert claim("d", "x", None, **REF)["reason"]      # an undecided claim always says why
    assert "reason" not in claim("e", "x", True, reason="ignored when decided", **REF)
    c = claim("f", "x", True, source="paper", quote="q", paper="Thm 4", definition="first step with …")
    with pytest.raises(TypeError):
        claim("k", "x", True)                   # no paper statement and definition: refused
    assert c["paper"] == "Thm 4" and c["definition"].startswith("first step")


def test_readings_side_by_side():
    agree = claim("g", "x", readings=[reading("A", True, v=1), reading("B", True, v=2)], **REF)
    assert agree["verdict"] == "holds" and [r["numbers"]["v"] for r in agree["readings"]] == [1, 2]
    assert claim("h", "x", readings=[reading("A", False), reading("B", False)], **REF)["verdict"] == "fails"
    mixed = claim("i", "x", readings=[reading("A", True), reading("B", False)], **REF)
    assert mixed["verdict"] == "inconclusive"
    assert "holds under A" in mixed["reason"] and "fails under B" in mixed["reason"]
    und = claim("j", "x", readings=[reading("A", None, reason="flat"), reading("B", None)], **REF)
    assert und["verdict"] == "inconclusive"


def _write(d, name, claims, quick=False):
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"experiment": name, "quick": quick, "wall_seconds": 90,
                                                "claims": claims}))


def test_readme_table_is_generated(tmp_path):
    res = tmp_path / "results"
    _write(res / "a", "paper/a", [claim("x", "x holds", True, **REF), claim("y", "y | pipes", False, **REF),
                                  claim("w", "w beyond", False, **DERIVED)])
    _write(res / "b", "paper/b", [claim("z", "z", None, reason="never moved", **REF)], quick=True)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{verdicts.BEGIN}\nold table\n{verdicts.END}\noutro\n")
    verdicts.write_readme(res, readme, names=["paper/a", "paper/b", "paper/c"])
    text = readme.read_text()
    assert "| `paper/c` | not run at full settings |" in text
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old table" not in text
    # paper claims and derived ones counted apart
    assert "| `paper/a` | full | 90 s | 1 | 1 | 0 | 0 | 1 | 0 |" in text
    assert "| `paper/b` | quick | 90 s | 0 | 0 | 1 | — | — | — |" in text
    assert "y \\| pipes" in text and "never moved" in text
    paper_part, derived_part = text.split("Beyond the paper: 1 of tdyn's derived claims did not hold")
    assert "`y`" in paper_part and "`w`" not in paper_part      # derived: counted, listed on the report page
    verdicts.write_readme(res, readme, names=["paper/a", "paper/b", "paper/c"])       # idempotent
    assert readme.read_text() == text


def test_readme_without_markers_is_an_error(tmp_path):
    _write(tmp_path / "r" / "a", "p/a", [])
    (tmp_path / "README.md").write_text("no markers\n")
    with pytest.raises(UserError, match="verdicts:begin"):
        verdicts.write_readme(tmp_path / "r", tmp_path / "README.md")


def test_permutation_null_separates_topic_structure_from_noise():
    """Embeddings that are their topic's direction plus small noise: the same- minus different-topic
    cosine is far above the shuffled-topic null; embeddings with no topic structure stay inside it."""
    import torch

    from tdyn.papers.topic.similarity import embedding_topic_stats, permutation_null

    g = torch.Generator().manual_seed(0)
    K, per, d = 4, 10, 32
    T = torch.zeros(K * per, K, dtype=torch.bool)
    T[torch.arange(K * per), torch.arange(K * per) // per] = True
    centres = torch.randn(K, d, generator=g, dtype=torch.float64)
    for E, expect in ((centres[torch.arange(K * per) // per] + 0.3 * torch.randn(K * per, d, generator=g,
                                                                               dtype=torch.float64), True),
                      (torch.randn(K * per, d, generator=g, dtype=torch.float64), None)):
        st = embedding_topic_stats(E, T)["cosine"]
        null = permutation_null(E, T, "cosine", n_perm=100)
        diff = st["same_topic"]["mean"] - st["different_topic"]["mean"] - null["mean"]
        assert decide(diff, null["std"]) is expect


def test_table_keeps_a_row_per_results_file(tmp_path):
    """Two results of one reproduction (quick, and full runs judged early with --at-step) are two rows,
    also in directories of the same name under different parents; a settings_note wins over quick/full,
    and a result judged on runs trained elsewhere shows no time of its own."""
    c = claim("c1", "x", False, **REF)
    for sub, res in (("a/r", {"quick": True, "wall_seconds": 30.0}),
                     ("b/r", {"quick": False, "wall_seconds": 0.7, "at_step": 4500,
                              "settings_note": "full settings (float32 on cuda), judged at step 4500 of 5000"})):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "results.json").write_text(json.dumps({"experiment": "x/y", "claims": [c], **res}))
    out = verdicts.table(tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("| `x/y`")]
    assert rows == ["| `x/y` | quick | 30 s | 0 | 1 | 0 | — | — | — |",
                    "| `x/y` | full settings (float32 on cuda), judged at step 4500 of 5000 | — | 0 | 1 | 0 | — | — | — |"]
    assert "- `x/y` (quick) `c1` **fails**" in out
    assert "- `x/y` (full settings (float32 on cuda), judged at step 4500 of 5000) `c1` **fails**" in out


def test_counts_keep_paper_claims_apart():
    cs = [claim("a", "x", True, **REF), claim("b", "x", None, reason="flat", **REF), claim("c", "x", False, **DERIVED),
          {"id": "old", "claim": "x", "verdict": "holds"}]
    assert verdicts.count_line(cs) == ("2 paper claims: 1 holds, 0 fails, 1 inconclusive; 1 beyond the paper (derived): "
                                       "0 holds, 1 fails, 0 inconclusive; 1 unlabelled (older results): 1 holds, 0 fails, 0 inconclusive")


def test_readme_table_says_the_set_a_result_was_trained_with(tmp_path):
    """A result made under ``--set`` (its results.json's ``overrides``) says so in the settings column and in the
    notes, as its claims do on the report page (docs/results/real__entropy-vs-lr: 5 seeds where quick trains 1)."""
    res = tmp_path / "results"
    _write(res / "b", "paper/b", [claim("z", "z", None, reason="never moved", **REF)], quick=True)
    path = res / "b" / "results.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"overrides": ["seeds=[1,2,3]"]}))
    readme = tmp_path / "README.md"
    readme.write_text(f"{verdicts.BEGIN}\n{verdicts.END}\n")
    verdicts.write_readme(res, readme, names=["paper/b"])
    text = readme.read_text()
    assert "| `paper/b` | quick (--set seeds=[1,2,3]) | 90 s |" in text and "(quick (--set seeds=[1,2,3]))" in text
