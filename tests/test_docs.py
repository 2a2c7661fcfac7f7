"""Documentation travels with the code: no reference points outside the repository, every
``docs/reproductions/PAGE.md#ANCHOR`` reference (and every relative link of the pages) exists, and every
registered reproduction has its section."""

import re
from pathlib import Path

import pytest

from tdyn import docs
from tdyn.reproduce.registry import EXPERIMENTS
from tdyn.report import html

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / docs.DOCS_DIR
#: the README's verdict block is generated from the committed results.json files (run outputs, kept as run)
VERDICTS = re.compile(r"<!-- verdicts:begin -->.*<!-- verdicts:end -->", re.S)
#: references to documents a clone of the repository does not contain
OUTSIDE = re.compile(r"spec §|\bspecs?/|\bspec [a-z_]+\.md|\b(?:topic_structure|scan_snap|decision_lists|corpora)\.md\b")


def _text(p: Path) -> str:
    t = p.read_text(encoding="utf-8")
    return VERDICTS.sub("", t) if p.name == "README.md" and p.parent == ROOT else t


def _sources() -> list[Path]:
    files = [p for p in (ROOT / "src").rglob("*") if p.suffix in (".py", ".json", ".md", ".txt", ".yaml")]
    files += list((ROOT / "tests").rglob("*.py")) + list((ROOT / "examples").rglob("*.py"))
    files += [ROOT / "README.md", ROOT / "DEVELOPERS.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    files += [p for p in (ROOT / "docs").rglob("*.md")]
    return [p for p in files if p.is_file() and p != Path(__file__).resolve()]


def _resolves(path: Path, frag: str) -> str | None:
    if not path.exists():
        return f"no file {path.relative_to(ROOT)}"
    if frag and path.suffix == ".md" and frag not in docs.anchors(path.read_text(encoding="utf-8")):
        return f"no heading #{frag} in {path.relative_to(ROOT)}"
    return None


def test_no_reference_outside_the_repository():
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:120]}" for p in _sources()
           for i, line in enumerate(_text(p).splitlines(), 1) if OUTSIDE.search(line)]
    assert not bad, "references to documents outside the repository:\n" + "\n".join(bad)


def test_every_docs_reference_exists():
    refs = {(m.group(0), str(p.relative_to(ROOT))) for p in _sources() for m in docs.REF.finditer(_text(p))}
    assert len(refs) > 100
    bad = []
    for ref, where in sorted(refs):
        path, _, frag = ref.partition("#")
        why = _resolves(ROOT / path, frag)
        if why:
            bad.append(f"{where}: {ref}: {why}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", sorted(p.name for p in PAGES.glob("*.md")) + ["../../README.md", "../usage.md", "../reliability.md", "../gpu.md",
                                                                         "../activations.md"])
def test_relative_links_of_the_pages_resolve(page):
    p = (PAGES / page).resolve()
    text = _text(p)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        why = _resolves((p.parent / path).resolve() if path else p, frag)
        if why:
            bad.append(f"{target}: {why}")
    assert not bad, f"{page}:\n" + "\n".join(bad)


def test_every_reproduction_has_its_section():
    for name in EXPERIMENTS.table:
        ref = docs.ref(name)
        assert ref, f"{name}: no documentation page for its prefix"
        path, _, frag = ref.partition("#")
        assert _resolves(ROOT / path, frag) is None, f"{name}: {ref} has no heading"


def test_readme_links_the_papers_and_the_pages():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for needle in ("arxiv.org/abs/2303.04245", "arxiv.org/abs/2305.16380", "docs/reproductions/",
                   "github.com/YuchenLi01/transformer_topic_model_LDA", "github.com/facebookresearch/luckmatters"):
        assert needle in text, needle


def test_github_anchors():
    assert docs.anchor("topic/stage1") == "topicstage1"
    assert docs.anchor("Scan and Snap (Tian, Wang, Chen & Du, NeurIPS 2023)") == \
        "scan-and-snap-tian-wang-chen--du-neurips-2023"
    assert docs.anchor("Model as in the authors' code") == "model-as-in-the-authors-code"
    assert docs.anchors("# A\n```\n# not a heading\n```\n## A\n### b_c-d\n") == ["a", "a-1", "b_c-d"]


def test_report_links_the_pages(tmp_path, monkeypatch):
    ref = "docs/reproductions/topic.md#stage-2-attention"
    (tmp_path / "topic__stage2").mkdir()
    (tmp_path / "topic__stage2" / "results.json").write_text(
        '{"experiment": "topic/stage2", "claims": [{"id": "a", "claim": "gap > 0 (%s)", "held": true}]}' % ref)
    page = html.build_index(tmp_path)                       # outside the checkout: the references as code
    text = page.read_text()
    assert f"<code>{ref}</code>" in text and "<code>docs/reproductions/topic.md#topicstage2</code>" in text
    monkeypatch.setattr(docs, "DOCS_URL", "https://example.org/tdyn/blob/main/")
    text = html.build_index(tmp_path).read_text()
    assert f'<a href="https://example.org/tdyn/blob/main/{ref}">{ref}</a>' in text
    monkeypatch.setattr(docs, "DOCS_URL", None)
    if docs.repo_root() is not None:                        # a page inside the checkout links relatively
        assert docs.href(ref, docs.repo_root() / "runs" / "demo") == "../../" + ref


def test_reproduce_help_names_the_section(capsys):
    from tdyn import cli

    with pytest.raises(SystemExit):
        cli.main(["reproduce", "scan-snap/fig3", "--help"])
    assert "docs/reproductions/scan-snap.md#scan-snapfig3" in capsys.readouterr().out


def test_readme_is_short_and_links_each_moved_page():
    """The README: what tdyn is, the two commands first, the first screen, the verdict table, the daily
    commands and links; what it held before (configs, run directories, reliability, GPU, the speed
    history) is one link away."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    own = VERDICTS.sub("", text).splitlines()
    assert len(own) <= 100, f"the README's own text is {len(own)} lines (the generated table apart)"
    first_block = text[text.index("```"):text.index("```", text.index("```") + 3)]
    assert "make demo" in first_block and "make test" in first_block and text.index("```") < text.index("\n## ")
    for page in ("docs/usage.md", "docs/reliability.md", "docs/gpu.md", "docs/library.md", "benchmarks/README.md",
                 "docs/reproductions/README.md"):
        assert f"]({page}" in text, page
    shot = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert shot and (ROOT / shot.group(1)).is_file()
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    for heading in ("## Configs", "## Run directories", "## Sweeps", "## The report page and the shipped evidence"):
        assert heading in usage
    assert "## Inputs" in (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert "speed work" in (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
