"""The README's "what reproduces" table, generated from full-setting ``results.json`` files.

Headline counts are the papers' claims (``source: paper``); tdyn's own hypotheses, extrapolations and
beyond-paper checks (``source: derived``) are counted apart, as "beyond the paper". A claim from an older
tdyn without a source is counted as neither, and shown as unlabelled.

``tdyn report DIR --readme README.md`` reads every ``results.json`` below ``DIR`` (the committed
evidence lives in ``docs/results/<reproduction>/``) and rewrites the block between
``<!-- verdicts:begin -->`` and ``<!-- verdicts:end -->`` of the README, so the table cannot drift
from the code that produced the verdicts. Quick-setting results are listed, but labelled as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tdyn import docs, runs
from tdyn.errors import UserError
from tdyn.results import SOURCES  # paper | derived: the provenance every claim carries

BEGIN, END = "<!-- verdicts:begin -->", "<!-- verdicts:end -->"
ORDER = ("holds", "fails", "inconclusive")

#: How a source is shown: the papers' claims, and tdyn's own ones "beyond the paper".
SOURCE_LABEL = {"paper": "paper claims", "derived": "beyond the paper (derived)", None: "unlabelled (older results)"}


def counts(claims: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``claims`` hold, fail, are inconclusive (:data:`ORDER`), and how many say anything else."""
    vs = [c.get("verdict") for c in claims]
    return {v: vs.count(v) for v in ORDER} | {"other": sum(v not in ORDER for v in vs)}


def source_of(c: dict[str, Any]) -> str | None:
    """``paper``, ``derived``, or None for a claim without a (valid) source."""
    s = c.get("source")
    return s if s in SOURCES else None


def by_source(claims: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """``claims`` split by :func:`source_of`: paper, derived, and (only when there are any) None."""
    out: dict[str | None, list[dict[str, Any]]] = {"paper": [], "derived": []}
    for c in claims:
        out.setdefault(source_of(c), []).append(c)
    return out


def count_line(claims: list[dict[str, Any]]) -> str:
    """One line of counts: the paper claims first, then those beyond the paper (and unlabelled ones)."""
    parts = []
    for src, cs in by_source(claims).items():
        if cs or src == "paper":
            n = counts(cs)
            parts.append(f"{len(cs)} {SOURCE_LABEL[src]}: " + ", ".join(f"{n[v]} {v}" for v in ORDER)
                         + (f", {n['other']} other" if n["other"] else ""))
    return "; ".join(parts)


def collect(d: Path) -> list[tuple[Path, dict[str, Any]]]:
    """``(dir, results)`` for every ``results.json`` below ``d``, sorted by experiment name."""
    found = []
    for p in sorted(Path(d).rglob(runs.RESULTS)):
        if "report_files" in p.relative_to(d).parts:   # a report page's copies of its evidence, not results
            continue
        found.append((p.parent, runs.read_results(p)))
    return sorted(found, key=lambda t: str(t[1].get("experiment", t[0].name)))


def setting_of(res: dict[str, Any]) -> str:
    """``quick`` or ``full``: the setting a results.json was made at (a claim-level ``quick`` mark counts too)."""
    return "quick" if res.get("quick") or any(c.get("quick") for c in res.get("claims", [])) else "full"


def full_evidence(d: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The full-setting evidence below ``d`` by reproduction name: for each, the ``results.json`` made at full
    settings (quick ones, failed ones and ones made under ``--set``, off the setting the claims state, are not
    evidence); of several, the one made last (its ``made`` date), else the first by directory name."""
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    for rdir, res in sorted(collect(d), key=lambda t: str(t[0])):
        if setting_of(res) != "full" or "error" in res or res.get("overrides"):
            continue
        name = str(res.get("experiment", rdir.name))
        made = str((res.get("made") or {}).get("date") or "")
        if name not in out or made > str((out[name][1].get("made") or {}).get("date") or ""):
            out[name] = (rdir, res)
    return out


def evidence_dir(path: str | Path) -> Path:
    """``path`` checked as a directory of full-setting evidence (exit 2 with one line otherwise)."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"--evidence {str(path)!r}: no such directory (the shipped evidence is docs/results in a clone)")
    if not any(p.rglob(runs.RESULTS)):
        raise UserError(f"--evidence {str(path)!r} holds no {runs.RESULTS}")
    return p


def _md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _time(sec: Any) -> str:
    if not isinstance(sec, (int, float)):
        return "—"
    return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.0f} min" if sec < 7200 else f"{sec / 3600:.1f} h"


def _short(text: str, n: int = 240) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _name(name: str, link_from: Path | None) -> str:
    """A reproduction's name, linked to its section of docs/reproductions/ from the file ``link_from``."""
    ref = docs.ref(name)
    href = docs.href(ref, Path(link_from).parent) if ref and link_from is not None else None
    return f"[`{_md(name)}`]({href})" if href else f"`{_md(name)}`"


def table(d: Path, names: list[str] | None = None, link_from: Path | None = None) -> str:
    """Markdown: one row per results.json (settings, wall time, verdict counts; a reproduction with several,
    e.g. quick and full, has a row for each) and, below, every paper claim (and every claim without a
    source) that did not hold with its verdict and reason; the derived claims that did not hold are
    counted there and listed on the report page. ``names`` (the
    registered reproductions) adds a row for each one that has no results below ``d``; ``link_from``
    (the file the table goes into) links each name to its section of docs/reproductions/."""
    found = collect(d)
    if not found:
        raise UserError(f"{str(d)!r} holds no results.json")
    have = {res.get("experiment", rdir.name) for rdir, res in found}
    missing = [n for n in names or [] if n not in have]
    rows = ["| reproduction | settings | time | paper: holds | fails | inconclusive | beyond the paper: holds | fails | inconclusive |",
            "|---|---|---|---|---|---|---|---|---|"]
    notes: dict[str | None, list[str]] = {"paper": [], "derived": [], None: []}
    # one row per results.json (a reproduction may have several: quick and full, or runs judged early)
    lines = {(n, ""): f"| {_name(n, link_from)} | not run at full settings | — | — | — | — | — | — | — |" for n in missing}
    for rdir, res in found:
        name = res.get("experiment", rdir.name)
        claims = res.get("claims", [])
        split = by_source(claims)
        setting = res.get("settings_note") or ("quick" if res.get("quick") else "full")
        if res.get("overrides"):                                      # trained off the reproduction's own setting
            setting += f" (--set {' '.join(res['overrides'])})"
        err = " (error)" if "error" in res else ""
        # results judged on runs trained elsewhere (--at-step) took no training time of their own
        took = "—" if res.get("at_step") is not None else _time(res.get("wall_seconds"))
        jobs = (res.get("made") or {}).get("jobs") if isinstance(res.get("made"), dict) else None
        if took != "—" and isinstance(jobs, int) and jobs > 1:     # made beside other reproductions (--all --jobs N)
            took += f" ({jobs} at once)"
        cells = [str(counts(split[src])[v]) if split[src] else "—" for src in SOURCES for v in ORDER]
        unlabelled = f" ({len(split[None])} unlabelled)" if split.get(None) else ""
        lines[name, str(rdir.relative_to(d))] = (f"| {_name(name, link_from)}{err}{unlabelled} | {_md(setting)} | {took} | "
                                                 + " | ".join(cells) + " |")
        for c in claims:
            if c.get("verdict") != "holds":
                text = c["reason"] if c.get("verdict") == "inconclusive" and c.get("reason") else c.get("claim", "")
                where = "" if setting == "full" else f" ({_md(setting)})"
                notes[source_of(c)].append(f"- `{_md(name)}`{where} `{_md(c.get('id', ''))}` **{_md(c.get('verdict'))}**: "
                                           f"{_md(_short(text))}")
    rows += [lines[n] for n in sorted(lines)]
    out = "\n".join(rows)
    heads = {"paper": "Paper claims that did not hold", None: "Unlabelled claims (older results without a source) that did not hold"}
    for src in ("paper", None):
        if notes[src]:
            out += (f"\n\n{heads[src]} (fails: the claim; inconclusive: why; the quoted statement, definition "
                    "and numbers are in each `results.json`):\n\n" + "\n".join(notes[src]))
    if notes["derived"]:   # counted in the table; listed one by one on the report page, to keep the README short
        out += (f"\n\nBeyond the paper: {len(notes['derived'])} of tdyn's derived claims did not hold; each is listed with "
                "its reason on the report page (`tdyn report docs/results`), under \"Beyond the paper\".")
    return out + "\n"


def write_readme(d: Path, readme: Path, names: list[str] | None = None) -> Path:
    """Replace the marked block of ``readme`` with :func:`table` of ``d`` (atomically)."""
    try:
        text = Path(readme).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {str(readme)!r}: {e}") from None
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise UserError(f"{str(readme)!r} needs one {BEGIN} … {END} block for the verdict table")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    body = (f"{BEGIN}\n<!-- generated by `tdyn report {d} --readme {readme}`; do not edit by hand -->\n\n"
            + table(d, names, link_from=Path(readme)) + f"\n{END}")
    runs.atomic_write_text(Path(readme), head + body + tail)
    return Path(readme)
