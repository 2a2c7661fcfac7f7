"""The committed evidence (docs/results/*/results.json): every claim says where it comes from, and a paper
claim's quote is the paper's words. A quote is checked against the texts tdyn was built from (the papers and
specs in the steering checkout's shared/, beside this repository; skipped where the checkout has none):
every fragment of it (split at elisions […] and separators, notes of where it stands in parentheses set
aside) of three or more words is found in them, compared
on its words of four letters or more (LaTeX math and punctuation set aside, so a transcribed formula matches)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "docs" / "results").glob("*/results.json"))
SHARED = ROOT.parent / "shared"
#: evidence of papers whose text is not among shared/'s: their quotes cannot be checked here, only by hand against
#: what tdyn could read (icl-gd: the abstract, docs/reproductions/icl-gd.md#paper-and-code; birth: the abstract and
#: the introduction's opening, docs/reproductions/birth.md#paper-and-code)
NO_TEXT = {"icl-gd", "birth"}


def _claims():
    for p in RESULTS:
        for c in json.loads(p.read_text(encoding="utf-8")).get("claims", []):
            yield p.parent.name, c


def test_every_committed_claim_has_a_source():
    assert RESULTS
    bad = [f"{d} {c.get('id')}" for d, c in _claims()
           if not (c.get("source") == "paper" and c.get("quote") and c.get("paper")
                   or c.get("source") == "derived" and c.get("derived") and c.get("paper"))]
    assert not bad, "claims without a complete provenance: " + ", ".join(bad)


def _words(text: str) -> str:
    text = re.sub(r"\$[^$]*\$", " ", text)                       # LaTeX math
    text = re.sub(r"\\[a-z]+\{", " ", text)                      # \emph{ … }
    text = re.sub(r"\bfootnote \d+:", " ", text, flags=re.I)     # a quote's label of where a fragment stands
    return " ".join(w for w in re.sub(r"[^a-z]+", " ", text.lower()).split() if len(w) >= 4)


FRAGMENTS = re.compile(r"\[…\]|\[\.\.\.\]|…| / |;")
#: A parenthesised note of where a fragment stands, inside a quote (one level of nesting): "(Fig 3, …)",
#: "(abstract; Thm 2 (b))", "(as stated in docs/reproductions/…)".
PAREN = re.compile(r"\((?:[^()]|\([^()]*\))*\)")
WHERE_WORDS = re.compile(r"^\(\s*(Fig|Figs|Thm|Theorem|Lemma|App|Appendix|abstract|§|Eqn|as |Remark|Cor)|docs/reproductions")


def _without_where(quote: str) -> str:
    return PAREN.sub(lambda m: " " if WHERE_WORDS.search(m.group(0)) else m.group(0), quote)


@pytest.mark.skipif(not (SHARED / "papers").is_dir(), reason="no shared/papers beside this checkout")
def test_paper_quotes_are_the_papers_words():
    texts = [p.read_text(encoding="utf-8") for p in sorted((SHARED / "papers").glob("*.txt"))
             + sorted((SHARED / "specs").glob("*.md"))]
    corpus = " | ".join(_words(t) for t in texts)
    missing = []
    for d, c in _claims():
        if c.get("source") != "paper" or d.split("__")[0] in NO_TEXT:
            continue
        for frag in FRAGMENTS.split(_without_where(c["quote"])):
            w = _words(frag)
            if len(w.split()) >= 3 and w not in corpus:
                missing.append(f"{d} {c['id']}: {frag.strip()[:100]!r}")
    assert not missing, "paper quotes not found in the papers or specs:\n" + "\n".join(missing)
