"""Static HTML reports (``tdyn report DIR``, ``tdyn reproduce --all``): one ``DIR/index.html``.

Two pages, built only from what is on disk (never from per-experiment code):

- :func:`build_index` — a ``tdyn reproduce --all`` directory (one subdirectory per reproduction,
  named by :func:`slug`) or a single reproduction directory: a claims table (paper, claim, what was
  measured, numbers, expected, verdict, link) and one section per reproduction with its figures
  (PNG), CSV tables, config, run time, seeds, errors; run metadata (versions, machine, date).
- :func:`build_run_report` — a run, ensemble (``ensemble.json``) or sweep (``sweep.json``)
  directory: loss and probe curves from ``metrics.jsonl``, heat maps of 2-D parameters and array
  probes at the saved checkpoints (a strip over time, first member), summary tables.

Generated figures go to ``DIR/report_files/``; every link and image source is relative, so the
page works from the file system and when the folder is copied elsewhere.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import html
import matplotlib.pyplot as plt
import numpy as np
import platform
from urllib.parse import quote

import tdyn
from tdyn import docs, papers, runs, sweep
from tdyn.errors import UserError
from tdyn.report import style
from tdyn.runs.io import read_csv
from tdyn.runs.ownership import TREE_RULES
from tdyn.report.verdicts import ORDER, by_source, counts, full_evidence, setting_of, source_of

PAGE = "index.html"
ASSETS = "report_files"
RESULTS = runs.RESULTS
MANIFEST = runs.REPRODUCE  # a reproduce-all directory's options, metadata and each reproduction's status
MAX_TABLE_ROWS = 25
MAX_RUN_CURVES = 24
MAX_LEGEND = MAX_RUN_CURVES   # a legend for every run drawn (one colour each: style.series(i, n))
MAX_STRIP = 8
MAX_HEATMAPS = 12

MAX_NUMBERS_CHARS = 240
#: options with which a reproduction judges runs or tables made earlier instead of training (shown with the
#: command that makes them anew)
REUSING_OPTIONS = ("rejudge", "from_tables", "at_step", "runs_dir")  # numbers cell of the claims table (the full numbers are in the section)
# results.json keys shown in their own place in a section (the rest are listed as "other numbers")
_SECTION_KEYS = {"experiment", "claims", "config", "files", "wall_seconds", "seed", "seeds", "quick",
                 "status", "error", "traceback", "description", "docs", "made", "tables_edited"}
#: results.json's key for the tables a ``--judge-only`` judged as edited by hand since the run wrote them
#: (the reproduce layer's phases.EDITED, written by --judge-only; a test keeps the two equal)
EDITED = "tables_edited"


# ---------------------------------------------------------------- small helpers

def slug(name: str) -> str:
    """Directory name of reproduction ``name`` inside a reproduce-all directory."""
    return name.replace("/", "__")


def anchor(name: str) -> str:
    return "exp-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in slug(name))


def paper_of(name: str, full: bool = False) -> str:
    """The paper a reproduction belongs to (its manifest's label, or with ``full`` its title), from its
    name's prefix; the prefix itself for a name no paper declares."""
    p = papers.of(name)
    return (p.title if full else p.label) if p else name.split("/", 1)[0]


def reproduces(name: str) -> str:
    """What a reproduction reproduces (its manifest's ``reproduces``: a paper figure by number, or the
    statement), else its paper's title."""
    p = papers.of(name)
    r = p.reproductions.get(name) if p else None
    return r.reproduces if r and r.reproduces else paper_of(name, full=True)


def metadata() -> dict[str, Any]:
    """Versions, machine and date of this process (shown on every page)."""
    return {"tdyn": tdyn.__version__, "python": platform.python_version(), "git_commit": runs.git_commit(),
            "host": platform.node(), **runs.machine_info(), "date": runs.now()}


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _linked(text: Any, base: Path) -> str:
    """``text`` escaped, with each reference to a documentation page (``docs/reproductions/PAGE.md#ANCHOR``)
    a link to it from a page in the directory ``base`` where :func:`tdyn.docs.href` gives one, else set
    as code."""
    def link(m) -> str:
        href = docs.href(m.group(0), base)
        return f'<a href="{_e(href)}">{m.group(0)}</a>' if href else f"<code>{m.group(0)}</code>"
    return docs.REF.sub(link, _e(text))


def fmt(v: Any, max_items: int = 8) -> str:
    """A compact human-readable rendering of a JSON value (4 significant digits)."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    if isinstance(v, (list, tuple)):
        items = [fmt(x, max_items) for x in v[:max_items]]
        return "[" + ", ".join(items) + (f", … ({len(v)} items)" if len(v) > max_items else "") + "]"
    if isinstance(v, dict):
        items = [f"{k}: {fmt(x, max_items)}" for k, x in list(v.items())[:max_items]]
        return "{" + "; ".join(items) + (f"; … ({len(v)} keys)" if len(v) > max_items else "") + "}"
    return str(v)


def _relpath(path: Path, base: Path) -> str:
    """``path`` relative to the directory ``base`` it lies in (posix, for display)."""
    p = Path(path).resolve().relative_to(Path(base).resolve()).as_posix()
    return "" if p == "." else p


def _rel(path: Path, base: Path) -> str:
    """A relative URL from the directory ``base`` to ``path`` inside it."""
    return quote(_relpath(path, base))


def table(columns: list[str], rows: list[list[Any]], *, raw: bool = False, cls: str = "") -> str:
    """An HTML table; cells are escaped unless ``raw`` (then they are trusted HTML)."""
    cell = (lambda x: str(x)) if raw else (lambda x: _e(fmt(x)))
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(x)}</td>" for x in r) + "</tr>\n" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>'


def csv_table(path: Path, base: Path, max_rows: int = MAX_TABLE_ROWS) -> str:
    """A CSV file as an HTML table (first ``max_rows`` rows, with a link to the whole file)."""
    rows = read_csv(Path(path))         # not UTF-8, not CSV: one line naming the file
    if not rows:
        return f'<p>empty table <a href="{_rel(path, base)}">{_e(Path(path).name)}</a></p>'
    header, body = rows[0], rows[1:]
    shown = [[_num(x) for x in r] for r in body[:max_rows]]
    note = (f"showing {len(shown)} of {len(body)} rows; " if len(body) > max_rows else f"{len(body)} rows; ")
    return (table(header, shown, cls="data") +
            f'<p class="note">{note}full table: <a href="{_rel(path, base)}">{_e(Path(path).name)}</a></p>')


def _num(s: str) -> Any:
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


def _figure(path: Path, base: Path, caption: str, id_: str | None = None) -> str:
    """A figure scaled to the column (linking to the full-size image); ``id_`` makes it an anchor."""
    src = _rel(path, base)
    ident = f' id="{_e(id_)}"' if id_ else ""
    return (f'<figure{ident}><a href="{src}"><img src="{src}" alt="{_e(caption)}"></a>'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _details(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{_e(summary)}</summary>{body}</details>"


def _json_block(obj: Any) -> str:
    return f"<pre>{_e(json.dumps(obj, indent=2))}</pre>"


def _meta_block(meta: dict[str, Any], title: str = "Run metadata") -> str:
    return f'<section id="metadata"><h2>{_e(title)}</h2>' + table(["key", "value"], list(meta.items())) + "</section>"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em}h2{font-size:1.3em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.05em;margin-top:1.2em}
table{border-collapse:collapse;margin:.5em 0;font-size:.88em;display:block;max-width:100%;overflow-x:auto}
td{overflow-wrap:anywhere}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2}table.data td{font-variant-numeric:tabular-nums}
.verdict{font-weight:bold;white-space:nowrap}
.quick{color:#8a6d00;font-size:.85em;white-space:nowrap}.reason{font-size:.8em;color:#555}
.holds{color:#0072B2}.fails{color:#D55E00}.depends{color:#6b6b6b}.error{color:#D55E00}
table.claims tr:has(.fails) td{background:#fdf1eb}table.claims tr:has(.depends) td{background:#f6f6f6}
figure{display:inline-block;margin:.5em;vertical-align:top;max-width:100%}
figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:.8em;color:#555}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em;max-height:30em}
pre.error{background:#fff0eb;color:#7a2600}.note{font-size:.8em;color:#555}
dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em;font-size:.9em}dt{font-weight:bold}
dd{margin:0;overflow-wrap:anywhere}
.banner{background:#fff6d6;border:1px solid #e0c45c;padding:.5em .8em}
details.paper{margin:.3em 0}details.paper>summary{font-size:1.05em;cursor:pointer}
ul.claimlist{list-style:none;padding-left:1em;margin:.3em 0;font-size:.88em}
ul.claimlist li{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.key{color:#555;font-variant-numeric:tabular-nums}
h1{margin:.2em 0 .1em}.toc{font-size:.85em;margin:.2em 0}
#answer h2{margin-top:.4em}table.answer{font-size:.95em}table.answer td{text-align:right}
table.answer td:first-child{white-space:nowrap}
table.answer td:first-child,table.answer td:nth-child(7),table.answer td:last-child{text-align:left}
ul.notheld{margin:.2em 0;padding-left:1.2em;font-size:.86em}ul.notheld li{margin:.1em 0}
.flag{color:#a34700;font-weight:bold}
table.here{display:table;width:100%}table.here td:nth-child(-n+4){white-space:nowrap}
section.card{border-top:1px solid #ddd;padding:.4em 0}
.cardrow{display:flex;gap:1em;align-items:flex-start}
figure.main{flex:0 0 46%;margin:0}figure.main img{max-height:340px;object-fit:contain;width:100%}
.cardtext{flex:1 1 auto;min-width:0}.cardtext h3{margin:.1em 0}.cardtext p{margin:.3em 0}
.repro{font-weight:bold;color:#333}.nofig{flex:0 0 46%;padding:1em;background:#f7f7f7}
a.self{color:inherit;text-decoration:none}
"""


#: In every page the report writes: how a later report knows an ``index.html`` as its own (see :func:`check_page`).
GENERATOR = '<meta name="generator" content="tdyn report">'
_PAGE_HEAD = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>'   # pages from before the marker


def _page_is_ours(path: Path, recorded: bool) -> bool:
    """Whether ``path`` (an existing ``index.html``, never followed through a link) is a page the report
    wrote: it carries :data:`GENERATOR`, or (an older page) the directory records it and it starts as the
    report's pages do."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return GENERATOR in head or (recorded and head.startswith(_PAGE_HEAD))


def check_page(d: Path) -> None:
    """Before anything is written: ``d/index.html`` and ``d/report_files/`` are absent or the report's own
    (nothing lost: a user's page or folder of the same name is never replaced), else a one-line
    :class:`UserError` naming it."""
    mine = runs.written(d)
    page, assets = d / PAGE, d / ASSETS
    how = "move or rename it (tdyn report writes DIR/index.html and DIR/report_files/), then run tdyn report again"
    if (page.exists() or page.is_symlink()) and not _page_is_ours(page, PAGE in mine):
        raise UserError(f"{str(page)!r} exists and is not a page tdyn report wrote; it is left as it is: {how}")
    if assets.is_symlink() or (assets.exists() and not assets.is_dir()):
        raise UserError(f"{str(assets)!r} exists and is not the report's figures folder; it is left as it is: {how}")
    if assets.is_dir():
        foreign = TREE_RULES[ASSETS](assets)
        if foreign is not None:
            raise UserError(f"{str(assets)!r} holds {str(foreign)!r}, which tdyn report did not write; it is left "
                            f"as it is: {how}")


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{GENERATOR}<title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head>\n<body>\n<h1>{_e(title)}</h1>\n{body}\n</body></html>\n")


def _dl(items: dict[str, Any]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items.items()) + "</dl>"


# ---------------------------------------------------------------- reproductions

def reproductions(out: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, results) of ``out`` itself when it is a reproduction directory, else of its
    subdirectories holding a ``results.json``; with a reproduce-all manifest, its reproductions in its
    order, one that left no ``results.json`` (killed) shown as failed."""
    if (out / RESULTS).exists():
        return [(out, runs.read_results(out / RESULTS))]
    if (out / MANIFEST).exists():
        entries = runs.read_manifest(out / MANIFEST)["reproductions"]
    else:
        entries = [{"dir": p.name} for p in sorted(out.iterdir()) if (p / RESULTS).exists()]
    found = []
    for e in entries:
        d = out / e["dir"]
        res = runs.read_results(d / RESULTS) if (d / RESULTS).exists() else \
            {"experiment": e.get("name", d.name), "claims": [], "error": f"did not finish (status {e.get('status')})"}
        found.append((d, res))
    return found




def _badge(c: dict) -> str:
    """A claim's verdict, coloured, with its quick mark."""
    v = c.get("verdict", "—")
    cls = "holds" if v == "holds" else "fails" if v == "fails" else "depends"
    quick = ' <span class="quick">(quick)</span>' if c.get("quick") else ""
    if c.get("overrides"):      # judged off the reproduction's own setting: the claim text states that setting
        quick += f' <span class="quick">(under --set {_e(" ".join(map(str, c["overrides"])))})</span>'
    return f'<span class="verdict {cls}">{_e(v)}</span>{quick}'


def _source(c: dict) -> str:
    """A claim's provenance: ``paper`` with the quoted statement and where it stands (as a tooltip and
    line), or ``derived`` with what tdyn adds."""
    src = source_of(c)
    if src is None:
        return '<span class="note">unlabelled</span>'
    what = c.get("quote") if src == "paper" else c.get("derived")
    where = c.get("paper", "")
    detail = (f"“{what}” ({where})" if src == "paper" else f"{what} (extends: {where})") if what else where
    return f'<span class="source {src}" title="{_e(detail)}">{_e(src)}</span>'


def _verdict(c: dict) -> str:
    """The badge and, for an inconclusive claim, its reason."""
    why = f'<div class="reason">{_e(c["reason"])}</div>' if c.get("verdict") == "inconclusive" and c.get("reason") else ""
    return _badge(c) + why


def _edited(res: dict) -> str:
    """A flag beside a reproduction's verdicts when they were judged on tables edited by hand since its run
    wrote them (results.json's ``tables_edited``: each table with its rows written and rows now), else ""."""
    edited = res.get(EDITED)
    if not edited:
        return ""
    items = edited if isinstance(edited, list) else [edited]

    def one(e: Any) -> str:
        if isinstance(e, dict):
            return f"{e.get('table', '?')} ({e.get('rows_written', '?')} rows written, {e.get('rows_now', '?')} now)"
        return str(e)
    return (f'<span class="flag edited">⚑ judged on tables edited by hand since the run wrote them (--judge-only): '
            f'{_e(_clip("; ".join(one(e) for e in items), 400))}</span>')


def _seeds(res: dict, cli_seed: int | None) -> str:
    """The seeds a reproduction reports (``seeds``, ``seed`` or its config's), else the ``--seed`` it was given."""
    cfg = res.get("config")
    for v in (res.get("seeds"), res.get("seed"), cfg.get("seeds") if isinstance(cfg, dict) else None):
        if v is not None:
            return fmt(v)
    return f"base seed {cli_seed} (--seed)" if cli_seed is not None else "—"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _files(rdir: Path, res: dict, suffix: str) -> list[Path]:
    """Files with ``suffix`` the reproduction lists in ``files``, then the others at its top level."""
    listed = [rdir / f for f in res.get("files", []) if isinstance(f, str) and f.endswith(suffix)]
    rest = sorted(p for p in rdir.glob(f"*{suffix}") if p not in listed)
    return [p for p in listed + rest if p.is_file()]


def _claims_rows(res: dict, page: Path, rdir: Path) -> list[list[str]]:
    name = res.get("experiment", rdir.name)
    link = f'<a href="#{anchor(name)}">{_e(name)}</a>'
    if "error" in res:
        return [[_e(paper_of(name)), "—", f"{link}: reproduction failed", "—", f'<span class="error">{_e(res["error"])}</span>',
                 "—", '<span class="verdict fails">error</span>']]
    if not res.get("claims"):
        return [[_e(paper_of(name)), "—", f"{link}: no claims recorded", "—", "—", "—", "—"]]
    rows = []
    for c in res["claims"]:
        numbers = c.get("numbers", {})
        measured = c.get("measured") or ", ".join(numbers) or "—"
        rows.append([_e(paper_of(name)), _source(c), f"{_linked(c.get('claim', ''), page)} <span class=note>({link}: {_e(c.get('id', ''))})</span>",
                     _e(fmt(measured)), _e(_clip(fmt(numbers, max_items=4), MAX_NUMBERS_CHARS)), _e(fmt(c.get("expected") or "see claim")),
                     _verdict(c)])
    return rows


def _section(rdir: Path, res: dict, page: Path, descriptions: dict[str, str], cli_seed: int | None,
             header: bool = True) -> str:
    """A reproduction's details; ``header``: as a section of its own (with its anchor, heading and
    description), else the body placed inside its card."""
    name = res.get("experiment", rdir.name)
    desc = descriptions.get(name) or res.get("description", "")
    ident = anchor(name) + ("" if header else "-" + _fname(_relpath(rdir, page) or "top").replace("/", "-").replace(".", "-"))
    parts = [f'<section id="{ident}"><h2>{_e(name)}</h2>' if header else f'<div id="{_e(ident)}">']
    if desc and header:
        parts.append(f"<p>{_linked(desc, page)}</p>")
    info = {"paper": _e(paper_of(name, full=True)), "directory": (f'<a href="{_rel(rdir / RESULTS, page)}">{_e(_relpath(rdir / RESULTS, page))}</a>'
                          if (rdir / RESULTS).exists() else _e(_relpath(rdir, page) + "/ (no results.json)")),
            "run time": _e(f"{res['wall_seconds']:.1f} s") if isinstance(res.get("wall_seconds"), (int, float)) else "—",
            "seeds": _e(_seeds(res, cli_seed)), "quick settings": _e(fmt(res.get("quick"))),
            "documentation": _linked(res.get("docs") or docs.ref(name) or "—", page)}
    figs = _files(rdir, res, ".png")
    if figs:
        info["figures"] = " · ".join(f'<a href="#{ident}-{_fname(p.stem)}">{_e(p.name)}</a>' for p in figs)
    parts.append(_dl(info))
    if "error" in res:
        parts.append(f'<h3>Error</h3><pre class="error">{_e(res["error"])}\n\n{_e(res.get("traceback", ""))}</pre>')
    if res.get(EDITED):
        parts.append(f"<p>{_edited(res)}</p>")
    if res.get("claims"):
        rows = [[_e(c.get("id", "")), _source(c), _linked(c.get("claim", ""), page) + _quote(c), _verdict(c),
                 _e(fmt(c.get("numbers", {}), max_items=32))]
                for c in res["claims"]]
        parts.append("<h3>Claims</h3>" + table(["id", "source", "claim", "verdict", "numbers"], rows, raw=True))
    if figs:
        tag = " (quick settings: a pipeline check)" if setting_of(res) == "quick" else ""
        parts.append("<h3>Figures</h3>" + "".join(_figure(p, page, p.name + tag, f"{ident}-{_fname(p.stem)}")
                                                 for p in figs))
    for p in _files(rdir, res, ".csv"):
        parts.append(_details(f"table {p.name}", csv_table(p, page)))
    other = {k: v for k, v in res.items() if k not in _SECTION_KEYS}
    if other:
        parts.append(_details("other numbers", table(["key", "value"], list(other.items()))))
    if "config" in res:
        parts.append(_details("config", _json_block(res["config"])))
    parts.append("</section>" if header else "</div>")
    return "\n".join(parts)


def _quote(c: dict) -> str:
    """Under a claim: the paper's words it tests and where they stand, or what a derived claim adds."""
    if c.get("source") == "paper" and c.get("quote"):
        return f'<div class="note">paper: “{_e(c["quote"])}” — {_e(c.get("paper", ""))}</div>'
    if c.get("source") == "derived" and c.get("derived"):
        return f'<div class="note">beyond the paper: {_e(c["derived"])} (extends {_e(c.get("paper", ""))})</div>'
    return ""


def key_number(c: dict) -> str:
    """A claim's headline number for its one-line summary: the first scalar of its ``numbers`` (else
    the first entry, clipped)."""
    numbers = c.get("numbers") or {}
    for k, v in numbers.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{k} = {fmt(v)}"
    if numbers:
        k, v = next(iter(numbers.items()))
        return _clip(f"{k} = {fmt(v, max_items=3)}", 60)
    return ""


# ---------------------------------------------------------------- the answer first: full-setting verdicts

EVIDENCE_ASSETS = "evidence"   # copies of the evidence's files, under report_files/, so the page stands alone


def _name_of(d: Path, res: dict) -> str:
    return str(res.get("experiment", d.name))


def _cls(v: Any) -> str:
    return "holds" if v == "holds" else "fails" if v == "fails" else "depends"


def _counts_html(claims: list[dict], empty: str = "—", compact: bool = False) -> str:
    """``3 holds · 0 fails · 1 inconclusive`` (``compact``: ``3 / 0 / 1``), coloured."""
    if not claims:
        return empty
    n = counts(claims)
    if compact:
        return " / ".join(f'<span class="{_cls(v)}">{n[v]}</span>' for v in ORDER)
    return " · ".join(f'<span class="{_cls(v)}">{n[v]} {v}</span>' for v in ORDER)


def _copy_evidence(rdir: Path, out: Path) -> Path:
    """The top-level files of an evidence directory (results, figures, tables: no runs/) copied under
    ``out/report_files/evidence/<dir name>/``; returns the copy."""
    import shutil

    dest = out / ASSETS / EVIDENCE_ASSETS / rdir.name
    dest.mkdir(parents=True, exist_ok=True)
    for f in rdir.iterdir():
        if f.is_file() and f.suffix in (".json", ".png", ".csv") and f.stat().st_size < 20 * 2**20:
            target = dest / f.name
            if not target.exists() or target.stat().st_mtime < f.stat().st_mtime or target.stat().st_size != f.stat().st_size:
                shutil.copy2(f, target)
    return dest


def answers(here: list[tuple[Path, dict]], evidence: dict[str, tuple[Path, dict]]) -> dict[str, dict]:
    """Per reproduction, the full-setting verdicts the page leads with: made in this directory (``origin``
    ``here``, with the shipped ones it re-derives as ``shipped``), else from the evidence (``evidence``)."""
    out: dict[str, dict] = {n: {"dir": d, "res": r, "origin": "evidence"} for n, (d, r) in evidence.items()}
    for d, res in here:
        if setting_of(res) == "full" and "error" not in res:
            name = _name_of(d, res)
            out[name] = {"dir": d, "res": res, "origin": "here", "shipped": evidence.get(name)}
    return out


def differences(mine: list[dict], ref: list[dict]) -> tuple[int, list[str]]:
    """(claims in common, ``id: this verdict vs reference verdict`` for those whose verdicts differ), by id."""
    theirs = {c.get("id"): c.get("verdict") for c in ref}
    shared = [c for c in mine if c.get("id") in theirs]
    return len(shared), [f"{c.get('id')}: {c.get('verdict')} here, {theirs[c.get('id')]} at full settings"
                         for c in shared if c.get("verdict") != theirs[c.get("id")]]


def _by_paper(names) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.split("/", 1)[0], []).append(n)
    known = [p.prefix for p in papers.manifests()]
    order = [*known, *sorted(p for p in groups if p not in known)]
    return {p: sorted(groups[p]) for p in order if p in groups}


def _made_line(res: dict) -> str:
    m = res.get("made")
    if not isinstance(m, dict):
        return "not recorded (a result from before tdyn recorded its provenance)"
    commit = str(m.get("git_commit") or "no git checkout")[:10]
    dirty = " with uncommitted changes" if m.get("uncommitted_changes") else ""
    return f"{str(m.get('date', '?'))[:16].replace('T', ' ')} UTC, tdyn {m.get('tdyn', '?')} at commit {commit}{dirty}, on {m.get('machine', '?')}"


def _command(name: str, res: dict, where: str) -> tuple[str, bool]:
    """(the command that regenerates ``res``, whether it was recorded)."""
    m = res.get("made")
    if isinstance(m, dict) and m.get("command"):
        return str(m["command"]), True
    parts = f"tdyn reproduce {name} --out {where} --force"
    for o in res.get("overrides") or []:
        parts += f" --set {o}"
    for k, v in (res.get("options") or {}).items():
        if v is not None:
            parts += f" --{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
    return parts, False


def _one_line(c: dict) -> str:
    """A claim that did not hold, in one line: why it is inconclusive, or the claim that failed with its key number."""
    if c.get("verdict") == "inconclusive" and c.get("reason"):
        text = str(c["reason"])
    else:
        text = str(c.get("claim", ""))
        if c.get("reason"):
            text += f" — {c['reason']}"
        num = next(((k, v) for k, v in (c.get("numbers") or {}).items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)), None)
        if num:   # a scalar that decides it, not a table of cells (those are in the section)
            text += f" [{num[0]} = {fmt(num[1])}]"
    return text


def _claim_li(name: str, c: dict, extra: str = "") -> str:
    text = _one_line(c)
    return (f'<li>{_badge(c)} <a href="#{anchor(name)}">{_e(name)}</a> <code>{_e(c.get("id", ""))}</code>{extra}: '
            f'<span title="{_e(text)}">{_e(_clip(text, 230))}</span></li>')


def _answer(ans: dict[str, dict], here_names: list[str], evidence_label: str | None, manifest: dict) -> str:
    """The first screen: per paper, its claims at full settings, where they come from, and every paper
    claim that did not hold with its one-line reason."""
    if not ans:
        hint = ("" if evidence_label else " Lead with the shipped full-setting evidence: "
                "<code>tdyn report DIR --evidence docs/results</code>.")
        return ('<section id="answer"><h2>Which paper claims hold at full settings</h2><p class="banner">'
                f"No full-setting results on this page.{hint}</p></section>")
    rows = []
    here_word = "made here now" if manifest else "in this directory"
    unlabelled = any(source_of(c) is None for a in ans.values() for c in a["res"].get("claims", []))
    for prefix, names in _by_paper(ans).items():
        claims = [c for n in names for c in ans[n]["res"].get("claims", [])]
        split = by_source(claims)
        n_here = sum(ans[n]["origin"] == "here" for n in names)
        src = ", ".join(x for x in (f"{n_here} {here_word}" if n_here else "",
                                    f"{len(names) - n_here} shipped" if len(names) > n_here else "") if x)
        p = split["paper"]
        n = counts(p)
        rows.append([f'<b>{_e(paper_of(prefix + "/"))}</b>', str(len(names)), f"<b>{len(p)}</b>",
                     f'<span class="holds">{n["holds"]}</span>', f'<span class="fails">{n["fails"]}</span>',
                     f'<span class="depends">{n["inconclusive"]}</span>', _counts_html(split["derived"], compact=True),
                     *([_counts_html(split.get(None, []), compact=True)] if unlabelled else []), _e(src)])
    table_ = table(["paper", "reproductions", "paper claims", "hold", "fail", "inconclusive",
                    "beyond the paper: hold / fail / inconcl.", *(["no source (older): hold / fail / inconcl."]
                                                                   if unlabelled else []),
                    "verdicts from"], rows, raw=True, cls="answer")
    shipped = [a for a in ans.values() if a["origin"] == "evidence"]
    made = [a["res"]["made"] for a in shipped if isinstance(a["res"].get("made"), dict)]
    commits = sorted({str(m.get("git_commit") or "no git")[:7] for m in made})
    dates = sorted({str(m.get("date", "?"))[:10] for m in made})
    prov = "; ".join(x for x in (
        (f"{len(made)} made {' to '.join(dict.fromkeys([dates[0], dates[-1]]))} at commit"
         + ("s " if len(commits) > 1 else " ") + ", ".join(commits[:3]) + (f", … ({len(commits)} commits)" if len(commits) > 3 else "")
         ) if made else "",
        f"{len(shipped) - len(made)} not recorded (older results)" if len(shipped) > len(made) else "") if x)
    missing = [n for n in here_names if n not in ans]
    lines = [f"<p>The papers' own claims at the papers' (full) settings, one verdict per claim: "
             f"<b>holds</b>, <b>fails</b> or <b>inconclusive</b> (the measured effect stayed inside its noise band, or "
             f"readings of the paper disagree); tdyn's own hypotheses are counted apart, beyond the paper. ",
             (f"Shipped evidence: <code>{_e(evidence_label)}</code> ({len(shipped)} reproductions: {_e(prov)}; each "
              "reproduction's commit, date, machine and command are in its section below). " if shipped else ""),
             (f"{len(ans) - len(shipped)} " + ("re-derived on this machine now at full settings" if manifest else
                                               "from this directory's full-setting results")
              + (f" (those whose full run took at most {manifest['full_under']:g} s)" if manifest.get("full_under") is not None else "")
              + ". " if len(ans) > len(shipped) else ""),
             (f'<span class="note">Not run at full settings anywhere: {_e(", ".join(missing))}.</span>' if missing else ""),
             "</p>"]
    return ('<section id="answer"><h2>Which paper claims hold at full settings</h2>' + table_ + "".join(lines)
            + "</section>")


def _not_held(ans: dict[str, dict], src: str | None, title: str, ident: str, here_made: bool = True) -> str:
    items = []
    for prefix, names in _by_paper(ans).items():
        lines = []
        for n in names:
            a = ans[n]
            tag = " (made here)" if a["origin"] == "here" and here_made else ""
            lines += [_claim_li(n, c, f'<span class="note">{tag}</span>' if tag else "")
                      for c in a["res"].get("claims", []) if source_of(c) == src and c.get("verdict") != "holds"]
        if lines:
            items.append(f'<h3>{_e(paper_of(prefix + "/", full=True))}</h3><ul class="notheld">{"".join(lines)}</ul>')
    if not items:
        return ""
    n = sum(x.count("<li>") for x in items)
    return f'<section id="{ident}"><h2>{_e(title)} ({n})</h2>' + "".join(items) + "</section>"


def _pipeline(here: list[tuple[Path, dict]], ans: dict[str, dict], evidence: dict[str, tuple[Path, dict]],
              manifest: dict) -> str:
    """This directory's runs as what they are: quick ones a check that the pipeline runs here, each compared
    with the full-setting verdicts; full ones re-derived here, compared with the shipped evidence."""
    if not here:
        return ""
    rows, n_quick, n_diff = [], 0, 0
    for d, res in here:
        name = _name_of(d, res)
        quick = setting_of(res) == "quick"
        n_quick += quick
        link = f'<a href="#{anchor(name)}">{_e(name)}</a>'
        took = f"{res['wall_seconds']:.0f} s" if isinstance(res.get("wall_seconds"), (int, float)) else "—"
        if "error" in res:
            rows.append([link, "—", took, f'<span class="error">failed: {_e(_clip(str(res["error"]), 160))}</span>', "—"])
            continue
        ref = (ans.get(name) or {}).get("res") if quick else (evidence.get(name) or (None, None))[1]
        if ref is None:
            vs = '<span class="note">no full-setting verdicts to compare</span>'
        else:
            shared, diff = differences(res.get("claims", []), ref.get("claims", []))
            n_diff += bool(diff)
            what = "full-setting" if quick else "shipped full-setting"
            vs = (f'<span class="flag">⚑ {len(diff)} of {shared} differ from the {what} verdicts</span>: '
                  + _e("; ".join(diff)) if diff else
                  f'<span class="holds">agree</span> with the {what} verdicts ({shared} claim{"s" if shared > 1 else ""} in common)'
                  if shared else
                  f'<span class="note">no claim in common with the {what} verdicts</span>')
        setting = ("quick (pipeline check)" if quick else "full settings: re-derived here")
        rows.append([link, _e(setting), took, _counts_html(res.get("claims", []), "no claims")
                     + (f"<br>{_edited(res)}" if res.get(EDITED) else ""), vs])
    head = ("Runs made on this machine" if manifest else "Results in this directory")
    note = (f"<p>{n_quick} of {len(here)} ran at quick settings: shortened runs that check that the pipeline runs on "
            "this machine, <b>not</b> the claims (their verdicts are not counted above). "
            + (f"{n_diff} reproduction(s) gave verdicts that differ from the full-setting ones (⚑)." if n_diff else
               "Where they share claims with the full-setting results, differences are flagged ⚑.") + "</p>") if n_quick else ""
    return (f'<section id="here"><h2>{head}: {n_quick} quick, {len(here) - n_quick} full</h2>{note}'
            + table(["reproduction", "setting", "time", "verdicts (all claims)", "compared with"], rows, raw=True, cls="here")
            + "</section>")


def _provenance(name: str, res: dict, rdir: Path, origin: str, page: Path, evidence_label: str | None) -> str:
    root = docs.repo_root()
    if origin == "evidence" and evidence_label:
        where = f"{evidence_label.rstrip('/')}/{rdir.name}"
    elif root is not None and rdir.resolve().is_relative_to(root):
        where = rdir.resolve().relative_to(root).as_posix()
    else:
        where = str(rdir)
    cmd, recorded = _command(name, res, where)
    setting = res.get("settings_note") or setting_of(res)
    info = {"verdicts": ("full settings, " + ("shipped evidence" if origin == "evidence" else "made in this directory")
                         if setting_of(res) == "full" else "quick settings (a pipeline check)") +
            (f" — {_e(setting)}" if res.get("settings_note") else ""),
            "made": _e(_made_line(res)),
            "results": f'<a href="{_rel(rdir / RESULTS, page)}">{_e(where)}/{RESULTS}</a>' if (rdir / RESULTS).exists() else _e(where),
            "run time": _e(f"{res['wall_seconds']:.1f} s") if isinstance(res.get("wall_seconds"), (int, float)) else "—",
            "regenerate": f"<code>{_e(cmd)}</code>" + ("" if recorded else ' <span class="note">(reconstructed: not recorded)</span>')}
    reused = [k for k, v in (res.get("options") or {}).items() if v is not None and k in REUSING_OPTIONS]
    if reused or res.get("at_step") is not None:   # judged on runs or rows made earlier: how to make them anew
        device = (res.get("made") or {}).get("device") if isinstance(res.get("made"), dict) else None
        info["from scratch"] = (f"<code>{_e(f'tdyn reproduce {name} --out {where} --force')}"
                                f"{' --device cuda' if device == 'cuda' or 'cuda' in str(res.get('settings_note', '')) else ''}</code> "
                                f'<span class="note">(this result was judged on runs or tables made earlier: '
                                f'{_e(", ".join("--" + k.replace("_", "-") for k in reused) or "--at-step")})</span>')
    if (rdir / "provenance.json").exists():
        info["provenance"] = f'<a href="{_rel(rdir / "provenance.json", page)}">provenance.json</a>'
    return _dl(info)


def _card(name: str, a: dict | None, here: tuple[Path, dict] | None, page: Path, descriptions: dict[str, str],
          evidence_label: str | None, cli_seed: int | None) -> str:
    """One reproduction: its main full-setting figure beside what it reproduces, verdicts, provenance and
    the docs link; the details (claims, every figure, tables, config; the quick run) collapsed."""
    shown = a or ({"dir": here[0], "res": here[1], "origin": "here"} if here else None)
    res, rdir = shown["res"], shown["dir"]
    desc = descriptions.get(name) or res.get("description", "")
    figs = _files(rdir, res, ".png")
    fig = (f'<figure class="main"><a href="{_rel(figs[0], page)}"><img src="{_rel(figs[0], page)}" '
           f'alt="{_e(name)}: {_e(figs[0].name)}"></a><figcaption>{_e(figs[0].name)}'
           + (" (quick settings)" if setting_of(res) == "quick" else " (full settings)") + "</figcaption></figure>"
           if figs else '<div class="nofig note">no figure</div>')
    doc = _linked(res.get("docs") or docs.ref(name) or "—", page)
    split = by_source(res.get("claims", []))
    verdicts = (f"paper claims: {_counts_html(split['paper'], 'none')}"
                + (f"; beyond the paper: {_counts_html(split['derived'])}" if split["derived"] else "")
                + (f"; unlabelled: {_counts_html(split[None])}" if split.get(None) else ""))
    text = [f'<h3><a class="self" href="#{anchor(name)}">{_e(name)}</a></h3>',
            f'<p class="repro">{_e(reproduces(name))}</p>',
            f"<p>{_linked(desc, page)}</p>" if desc else "",
            f"<p>{verdicts if a else 'no full-setting verdicts; ' + verdicts + ' (quick)'}</p>",
            f"<p>{_edited(res)}</p>" if res.get(EDITED) else "",
            _provenance(name, res, rdir, shown["origin"], page, evidence_label),
            f'<p class="note">documentation: {doc}</p>']
    details = []
    if a is not None:
        details.append(_details(f"details of the full-setting result ({len(res.get('claims', []))} claims, "
                                f"{len(figs)} figure(s), tables, config)",
                                _section(rdir, res, page, descriptions, cli_seed, header=False)))
    if here is not None and (a is None or a["dir"] != here[0]):
        details.append(_details(f"details of the {setting_of(here[1])} run made here",
                                _section(here[0], here[1], page, descriptions, cli_seed, header=False)))
    return (f'<section class="card" id="{anchor(name)}"><div class="cardrow">{fig}<div class="cardtext">{"".join(text)}'
            f'</div></div>{"".join(details)}</section>')


def build_index(out_dir: str | Path, title: str | None = None, descriptions: dict[str, str] | None = None,
                evidence: str | Path | None = None) -> Path:
    """Write ``out_dir/index.html`` for a reproduce-all directory or one reproduction directory.

    The page leads with the answer: per paper, how many of its claims hold, fail or are inconclusive at
    full settings, from this directory's full-setting results and, for the others, from ``evidence`` (a
    directory of full-setting results, e.g. the shipped ``docs/results``; a reproduce-all directory
    remembers the one it was made with), then every paper claim that did not hold. Quick runs follow as
    what they are, a pipeline check, with any verdict that differs from the full-setting one flagged.

    ``descriptions`` (experiment name -> one line) come from the caller (the CLI and the runner know the
    registered experiments; the report does not import them); else a results.json's ``description``."""
    out = Path(out_dir)
    results = reproductions(out)
    if not results:
        raise UserError(f"{str(out)!r} holds no {RESULTS} (neither itself nor its subdirectories)")
    check_page(out)
    manifest = runs.read_manifest(out / MANIFEST) if (out / MANIFEST).exists() else {}
    descriptions = descriptions or {}
    if evidence is None and manifest.get("evidence") and Path(manifest["evidence"]).is_dir():
        evidence = manifest["evidence"]
    ev: dict[str, tuple[Path, dict]] = {}
    label = None
    if evidence is not None:
        label = str(evidence)
        try:   # shown as the repository path when it is the checkout's evidence
            root = docs.repo_root()
            if root is not None and Path(evidence).resolve().is_relative_to(root):
                label = Path(evidence).resolve().relative_to(root).as_posix()
        except (OSError, ValueError):
            pass
        if Path(evidence).resolve() != out.resolve():
            ev = {n: (_copy_evidence(d, out), r) for n, (d, r) in full_evidence(Path(evidence)).items()}
    ans = answers(results, ev)
    here = {_name_of(d, r): (d, r) for d, r in results}

    claim_rows = [r for d, res in results for r in _claims_rows(res, out, d)]
    all_claims = [c for _, res in results for c in res.get("claims", [])]
    n_quick = sum(bool(c.get("quick")) for c in all_claims)
    banner = (f'<p class="banner"><b>Quick settings.</b> {n_quick} of {len(all_claims)} verdicts of the runs made here come '
              "from shortened runs (marked <span class=quick>(quick)</span>), not the papers' settings: they check that "
              "the pipeline works, not the claims" + ("; the counts above are the full-setting ones." if ans else ".")
              + "</p>" if n_quick and not ans else "")
    claims = ('<section id="claims"><h2>All claims of the runs on this page</h2>' + _details(
        f"the claims table ({len(claim_rows)} rows: paper, source, claim, what was measured, numbers, expected, verdict)",
        table(["paper", "source", "claim", "what was measured", "numbers", "expected", "verdict"], claim_rows, raw=True,
              cls="claims")) + "</section>")
    cards = []
    for prefix, names in _by_paper(set(ans) | set(here)).items():
        cards.append(f'<h2 id="paper-{_e(prefix)}">{_e(paper_of(prefix + "/", full=True))}</h2>')
        cards += [_card(n, ans.get(n), here.get(n), out, descriptions, label, manifest.get("seed")) for n in names]
    meta = manifest.get("metadata") or metadata()
    for k in ("started", "ended", "seed", "quick", "full_under", "evidence", "overrides", "device"):
        if k in manifest:
            meta = {**meta, k: manifest[k]}
    toc = ('<p class="toc">' + " · ".join(f'<a href="#{i}">{t}</a>' for i, t in
                                          (("answer", "answer"), ("not-held", "paper claims that did not hold"),
                                           ("here", "runs made here"), ("derived", "beyond the paper"),
                                           ("reproductions", "reproductions"), ("claims", "all claims"),
                                           ("metadata", "metadata"))) + "</p>")
    body = "\n".join([_answer(ans, list(here), label, manifest),
                      _not_held(ans, "paper", "Paper claims that did not hold at full settings", "not-held", bool(manifest))
                      or '<section id="not-held"></section>',
                      _not_held(ans, None, "Claims without a source (older results) that did not hold", "unlabelled", bool(manifest)),
                      banner, _pipeline(results, ans, ev, manifest) or '<section id="here"></section>',
                      _not_held(ans, "derived", "Beyond the paper: tdyn's derived claims that did not hold", "derived", bool(manifest))
                      or '<section id="derived"></section>',
                      '<section id="reproductions">' + "\n".join(cards) + "</section>", claims,
                      _meta_block(meta, "Run metadata" if manifest else "Metadata (of the process that built this page)")])
    title = title or ("tdyn: which claims of each paper hold" if len(results) > 1 or ev else
                      f"tdyn: {results[0][1].get('experiment', out.name)}")
    path = out / PAGE
    runs.record(out, PAGE, ASSETS)   # --force then counts them as tdyn's
    runs.atomic_write_text(path, _page(title, toc + body))
    return path


# ---------------------------------------------------------------- runs, ensembles, sweeps

def collect_runs(d: Path) -> tuple[str, list[Path]]:
    """(kind, run directories) of a run, ensemble, sweep or any directory holding runs."""
    for kind, name in (("sweep", runs.SWEEP), ("ensemble", runs.ENSEMBLE)):
        if (d / name).exists():
            return kind, runs.job_dirs(d)
    if runs.is_run_dir(d):
        return "run", [d]
    return "runs", sorted(p.parent for p in d.rglob(runs.META) if runs.is_run_dir(p.parent))


def _metric_groups(keys: list[str]) -> dict[str, list[str]]:
    """Loss first, then norms, update norms and one group per probe (the part before the last '/')."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        g = "loss" if k == "loss" else k.rsplit("/", 1)[0] if "/" in k else "other"
        groups.setdefault(g, []).append(k)
    order = ["loss", "norm", "update_norm"]
    return {g: groups[g] for g in order if g in groups} | {g: v for g, v in sorted(groups.items()) if g not in order}


def _curves(run_dirs: list[Path], labels: list[str], assets: Path) -> list[tuple[Path, str]]:

    style.apply()
    metrics = [runs.read_metrics(d) for d in run_dirs[:MAX_RUN_CURVES]]
    keys = sorted({k for m in metrics for r in m for k, v in r.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)})
    figs = []
    for g, ks in _metric_groups(keys).items():
        ncol = min(3, len(ks))
        nrow = math.ceil(len(ks) / ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
        for ax, k in zip(axes.flat, ks):
            for i, (m, lab) in enumerate(zip(metrics, labels)):
                pts = [(r["step"], r[k]) for r in m if isinstance(r.get(k), (int, float))]
                if pts:   # a colour of its own for every run (and a marker past 8)
                    ax.plot(*zip(*pts), label=lab, lw=1.2, **style.series(i, n=len(metrics)))
            pos = [r[k] for m in metrics for r in m if isinstance(r.get(k), (int, float)) and r[k] > 0]
            if k == "loss" and pos and max(pos) / min(pos) > 100:
                ax.set_yscale("log")
            ax.set_xlabel("step (optimizer updates)")
            ax.set_ylabel(_axis_label(k))
            ax.set_title(k)
        for ax in list(axes.flat)[len(ks):]:
            ax.set_visible(False)
        fig.tight_layout()
        if 1 < len(metrics) <= MAX_LEGEND:  # below the panels, so that it hides no curve
            handles, labs = axes.flat[0].get_legend_handles_labels()
            fig.legend(handles, labs, loc="upper center", bbox_to_anchor=(0.5, 0), frameon=False,
                       ncol=_legend_columns(labs, fig.get_figwidth()))
        path = assets / f"curves_{_fname(g)}.png"
        style.save(fig, path)
        figs.append((path, f"{g} vs step" + (f" ({len(metrics)} runs)" if len(metrics) > 1 else "")))
    return figs


def _legend_columns(labels: list[str], width_in: float, fontsize: float = 9.0) -> int:
    """As many legend columns as fit the figure's width (at most 4), so that a legend of many runs stays
    short: a column takes its longest label (≈ 0.6 em a character) plus the line sample and padding."""
    per_col = (0.6 * fontsize * max((len(x) for x in labels), default=1) + 4 * fontsize) / 72
    return max(1, min(4, len(labels), int(width_in / per_col)))


def _axis_label(key: str) -> str:
    """Y-axis label of a metrics.jsonl key (the trainer's norms are Frobenius norms)."""
    kind, _, name = key.partition("/")
    if kind == "norm":
        return f"‖{name}‖_F"
    if kind == "update_norm":
        return f"‖Δ{name}‖_F per update"
    return "training loss" if key == "loss" else key


def _fname(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def _matrix(t) -> Any:
    """A 2-D numpy view of a tensor: leading axes sliced at 0; None for scalars and vectors."""
    a = t.detach().float().numpy()
    while a.ndim > 2:
        a = a[0]
    return a if a.ndim == 2 else None


def _strip_steps(run_dir: Path) -> list[int | str]:
    steps = runs.checkpoint_steps(run_dir)
    if len(steps) > MAX_STRIP - 1:
        idx = sorted({round(i * (len(steps) - 1) / (MAX_STRIP - 2)) for i in range(MAX_STRIP - 1)})
        steps = [steps[i] for i in idx]
    has_final = (Path(run_dir) / runs.CKPT_DIR / "final.safetensors").exists()
    return [*steps, *(["final"] if has_final else [])]


def _heatmaps(run_dir: Path, assets: Path) -> list[tuple[Path, str]]:
    """One strip per 2-D parameter / array probe: its value at each saved checkpoint."""

    style.apply()
    steps = _strip_steps(run_dir)
    if not steps:
        return []
    ckpts = {s: runs.load_checkpoint(run_dir, s) for s in steps}
    keys = [k for k in ckpts[steps[-1]] if k.startswith(("param/", "probe/"))
            and _matrix(ckpts[steps[-1]][k]) is not None][:MAX_HEATMAPS]
    figs = []
    for k in keys:
        mats = [(s, _matrix(ckpts[s][k])) for s in steps if k in ckpts[s]]
        vals = np.concatenate([m.ravel() for _, m in mats])
        lo, hi = float(np.nanmin(vals)), float(np.nanmax(vals))
        diverging = lo < 0 < hi
        if diverging:
            hi = max(abs(lo), hi)
            lo = -hi
        fig, axes = plt.subplots(1, len(mats), figsize=(2.3 * len(mats) + 0.8, 2.6), squeeze=False)
        for ax, (s, m) in zip(axes[0], mats):
            im = ax.imshow(m, aspect="auto", interpolation="nearest", vmin=lo, vmax=hi if hi > lo else lo + 1,
                           cmap="RdBu_r" if diverging else style.SEQUENTIAL)
            ax.set_title(f"step {s}")
            ax.set_xlabel("column index")
        axes[0][0].set_ylabel("row index")
        fig.colorbar(im, ax=list(axes[0]), fraction=0.02, pad=0.01, label=k.split("/", 1)[1])
        path = assets / f"heatmap_{_fname(k)}.png"
        style.save(fig, path)
        shape = "×".join(str(x) for x in ckpts[steps[-1]][k].shape)
        figs.append((path, f"{k} ({shape}{', first slice' if ckpts[steps[-1]][k].dim() > 2 else ''}) at the saved checkpoints"))
    return figs


def _runs_table(run_dirs: list[Path], base: Path) -> str:
    rows = []
    for d in run_dirs[:200]:
        meta = runs.read_meta(d)
        m = runs.read_metrics(d)
        last = m[-1] if m else {}
        rows.append([f'<a href="{_rel(d / runs.CONFIG, base)}">{_e(_relpath(d, base) or ".")}</a>', _e(meta.get("status")),
                     _e(meta.get("seed")), _e(last.get("step", "—")), _e(fmt(last.get("loss"))),
                     _e(meta.get("message") or "")])
    note = f'<p class="note">first 200 of {len(run_dirs)} runs</p>' if len(run_dirs) > 200 else ""
    return table(["run", "status", "seed", "last step", "last loss", "message"], rows, raw=True) + note


def build_run_report(run_dir: str | Path) -> Path:
    """Write ``DIR/index.html`` for a run, ensemble or sweep directory (or any directory of runs)."""
    d = Path(run_dir)
    kind, run_dirs = collect_runs(d)
    if not run_dirs:
        raise UserError(f"{str(d)!r} holds no run directory (config.json + meta.json), ensemble.json or sweep.json")
    check_page(d)
    assets = d / ASSETS
    assets.mkdir(exist_ok=True)
    labels = [_relpath(r, d) or "." for r in run_dirs]
    parts = [f"<p>{_e(kind)} directory with {len(run_dirs)} run(s).</p>"]
    if kind == "sweep":

        summary = d / runs.SUMMARY
        if not summary.exists():
            sweep.summarize(d)
        parts.append('<section id="summary"><h2>Sweep summary</h2>' + csv_table(summary, d, max_rows=60) + "</section>")
        srows = [[r["name"], r.get("axes"), r.get("seed"), r.get("status"), r.get("error", "")]
                 for r in runs.read_json(d / runs.SWEEP)["runs"]]
        parts.append(_details(f"runs and their status ({len(srows)})", table(["run", "axes", "seed", "status", "error"], srows)))
    parts.append('<section id="runs"><h2>Runs</h2>' + _runs_table(run_dirs, d) + "</section>")
    curves = _curves(run_dirs, labels, assets)
    if len(run_dirs) > MAX_RUN_CURVES:
        parts.append(f'<p class="note">curves show the first {MAX_RUN_CURVES} of {len(run_dirs)} runs</p>')
    parts.append('<section id="curves"><h2>Loss and probes</h2>' + "".join(_figure(p, d, c) for p, c in curves) + "</section>")
    maps = _heatmaps(run_dirs[0], assets)
    parts.append(f'<section id="heatmaps"><h2>Parameters at the checkpoints ({_e(labels[0])})</h2>' +
                 ("".join(_figure(p, d, c) for p, c in maps) or "<p>no saved checkpoints with 2-D tensors</p>") + "</section>")
    cfg_src = d / runs.ENSEMBLE if kind == "ensemble" else run_dirs[0] / runs.CONFIG
    parts.append('<section id="config"><h2>Config</h2>' +
                 _details(_relpath(cfg_src, d), _json_block(runs.read_json(cfg_src)), open_=False) + "</section>")
    meta0 = runs.read_meta(run_dirs[0])
    meta = {f"run {k}": meta0.get(k) for k in ("tdyn_version", "torch_version", "git_commit", "started", "ended")}
    parts.append(_meta_block(meta | {f"report {k}": v for k, v in metadata().items()}))
    path = d / PAGE
    runs.record(d, PAGE, ASSETS)
    runs.atomic_write_text(path, _page(f"tdyn {kind}: {d.resolve().name}", "\n".join(parts)))
    return path
