"""A reproduction as four phases: plan → measure → judge → draw.

* ``plan(ctx) -> {name: raw run config}``: what it trains, before ``--set`` (``tdyn config NAME``
  prints them; the runner validates each once and trains it into ``OUT/runs/<name>``);
* ``measure(ctx, trained) -> {table: rows}``: the trained run directories (name -> member directories,
  each read once) to tables, one row a dict;
* ``judge(ctx, tables) -> results``: the claims (:func:`tdyn.reproduce.common.claim`) and numbers,
  from the tables alone;
* ``draw(ctx, tables, results) -> [file]``: the figures, written into ``ctx.out``, from the tables alone;
* ``sweeps(ctx) -> {name: tdyn sweep spec}`` (optional, beside or instead of ``plan``): sweeps it trains. The
  runner puts ``--set`` and ``--device`` in (the spec's ``set``, its config's device) and runs each into
  ``DIR/<name>-<digest of the spec>``, DIR being the option ``sweep_dir`` where the reproduction has one (an
  earlier reproduction's ``--out`` means its ``runs/``) or ``OUT/runs``: one directory per distinct sweep, so
  reproductions that plan the same sweep into the same DIR train it once; ``measure`` gets ``trained[name]``,
  that directory (its ``sweep.json`` lists the runs).

The runner owns the rest: training, writing each table as ``OUT/<table>.csv`` and reading it back (so
a judgement made now and one made later from the committed tables see the same values), and
``results.json``. ``tdyn reproduce NAME --judge-only --out DIR`` judges and draws again from DIR's
tables, training nothing (docs/architecture.md#a-reproduction).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import json
import re
from pathlib import Path
from typing import Any, Callable

from tdyn import runs
from tdyn.errors import UserError
from tdyn.reproduce.common import configure, on_reproduction_device, train_into, train_job
from tdyn.runs.io import TABLE_LIMIT, CorruptFile, _read_bytes, read_csv
from tdyn.reproduce.registry import get as registered, register
from tdyn.registry import origin_of
from tdyn.sweep import run_sweep
from tdyn.sweep.executors import default_workers, process_pool, terminate

log = logging.getLogger(__name__)
Tables = dict[str, list[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Phases:
    """The four phases of a reproduction (see the module docstring). ``tables`` names the tables
    ``judge`` and ``draw`` read, in the order they are written; ``columns`` fixes a table's columns
    where its rows do not (e.g. an empty table); ``sweeps`` the sweeps it trains besides ``plan``'s runs;
    ``optional`` the tables a directory made before they were kept may lack (``--judge-only`` then judges
    without them: ``judge`` and ``draw`` see them absent from the tables); ``all_at_once``: train every planned
    job at once, one worker each, even beyond the cores (:func:`train_plan`)."""

    measure: Callable[[Any, dict[str, list[Path]]], Tables]
    judge: Callable[[Any, Tables], dict[str, Any]]
    tables: tuple[str, ...]
    plan: Callable[[Any], dict[str, dict]] | None = None
    draw: Callable[[Any, Tables, dict[str, Any]], list[str]] | None = None
    columns: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    sweeps: Callable[[Any], dict[str, dict]] | None = None
    optional: tuple[str, ...] = ()
    all_at_once: bool = False


_INT = re.compile(r"[+-]?\d+\Z")


def _cell(s: str) -> Any:
    """A CSV cell as the value it was written from: '' → None, True/False, int, float (nan, inf), or str."""
    if s == "":
        return None
    if s in ("True", "False"):
        return s == "True"
    if _INT.match(s):
        return int(s)
    try:
        return float(s)
    except ValueError:
        return s


DIGESTS = "table_digests"   # results.json: {table: {"sha256": hex, "rows": n}} as the runner wrote them


def read_table(path: Path) -> list[dict[str, Any]]:
    """The rows of a table written by :func:`write_table`, each cell typed back (:func:`_cell`). Not UTF-8,
    not CSV, a last line cut (no newline after it: :func:`write_table` ends every line) or a row with more or
    fewer fields than the header: a :class:`CorruptFile` naming the file, never a table with fewer rows."""
    path = Path(path)
    rows = read_csv(path)
    data = _read_bytes(path, TABLE_LIMIT)
    if not data.endswith(b"\n"):
        raise CorruptFile(path, "does not end with a newline: truncated (its last row is cut)" if data
                          else "is empty: not a table tdyn wrote (it writes a header line at least)")
    header = rows[0] if rows else []
    for n, row in enumerate(rows[1:], 2):
        if row and len(row) != len(header):
            raise CorruptFile(path, f"row {n} has {len(row)} fields, not {len(header)} as its header: truncated "
                                    f"or garbled")
    return [{k: _cell(v) for k, v in zip(header, row)} for row in rows[1:] if row]


def table_digest(path: Path, rows: int) -> dict[str, Any]:
    """What results.json records of a table the runner wrote: its bytes' SHA-256 and its row count."""
    return {"sha256": hashlib.sha256(_read_bytes(Path(path), TABLE_LIMIT)).hexdigest(), "rows": rows}


EDITED = "tables_edited"   # results.json of a --judge-only: the tables judged as edited since the run wrote them


def check_table(path: Path, recorded: Any, results: Path) -> bool:
    """``--judge-only``: whether the table ``path`` is the one the run recorded in ``results`` (``recorded``:
    its digest entry; a malformed entry is a :class:`CorruptFile`). An edited table is judged as it now is
    (what-if by hand is what --judge-only is for), and the results say so (:data:`EDITED`)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
        raise CorruptFile(results, f"has {DIGESTS}.{path.stem} = {recorded!r:.60}, not a table's digest")
    return hashlib.sha256(_read_bytes(path, TABLE_LIMIT)).hexdigest() == recorded["sha256"]


def write_table(path: Path, rows: list[dict[str, Any]], columns: list[str] | None = None) -> Path:
    """``rows`` as CSV (atomically), with ``columns`` or the first row's keys; floats as Python writes
    them (shortest exact form), so :func:`read_table` gives back the same numbers."""
    cols = columns or (list(rows[0]) if rows else [])
    return runs.write_csv(path, [{c: _plain(r.get(c)) for c in cols} for r in rows], cols)


def _plain(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        v = v.item()
    return v


def tables_of(ctx, phases: Phases, digests: dict | None) -> tuple[Tables, list[dict[str, Any]]]:
    """The tables of ``ctx.out`` that ``phases`` reads (``--judge-only``; a missing one is a one-line error), and
    those that differ from what the run wrote (``digests``, results.json's; None, as in the committed
    docs/results: none known): each {table, rows written, rows now}."""
    out, edited = {}, []
    res_path = Path(ctx.out) / runs.RESULTS
    for t in phases.tables:
        path = Path(ctx.out) / f"{t}.csv"
        if not path.exists() and t in phases.optional:
            continue
        if not path.exists():
            raise UserError(f"--judge-only: {str(path)!r} is missing (judge-only reads the tables a run of this "
                            f"reproduction wrote into --out)")
        out[t] = read_table(path)
        if digests is not None and t in digests and not check_table(path, digests[t], res_path):
            edited.append({"table": f"{t}.csv", "rows_written": digests[t].get("rows"), "rows_now": len(out[t])})
    return out, edited


def _digests(res_path: Path) -> dict | None:
    """results.json's table digests (None: none recorded, or no results.json; the runner names that one)."""
    if not res_path.is_file():
        return None
    digests = runs.read_results(res_path).get(DIGESTS)
    if digests is not None and not isinstance(digests, dict):
        raise CorruptFile(res_path, f"has {DIGESTS!r} = {str(digests)[:40]!r}, not a table's digest per table")
    return digests


def _judged(ctx, what: str, fn: Callable[[], Any], edited: list | None = None) -> Any:
    """``fn()`` (the judge or the draw); under ``--judge-only`` a KeyError / ValueError from the tables (a
    column missing, a cell of another kind: not the tables this reproduction wrote) is one line naming OUT and
    the tables ``edited`` since the run wrote them."""
    if not getattr(ctx, "judge_only", False):
        return fn()
    since = f"; edited since the run wrote them: {', '.join(e['table'] for e in edited)}" if edited else ""
    try:
        return fn()
    except KeyError as e:
        raise UserError(f"--judge-only: the tables in {str(ctx.out)!r} are not the ones this reproduction wrote: "
                        f"missing column {e.args[0]!r} ({what}){since}") from None
    except ValueError as e:
        raise UserError(f"--judge-only: the tables in {str(ctx.out)!r} are not the ones this reproduction wrote "
                        f"({what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}){since}") from None


def run(phases: Phases, ctx) -> dict[str, Any]:
    """Plan, train, measure, write and re-read the tables, judge, draw: the results (the runner adds
    provenance and writes results.json). With ``ctx.judge_only``: judge and draw from OUT's tables."""
    digests, edited = None, None
    if getattr(ctx, "judge_only", False):
        digests = _digests(Path(ctx.out) / runs.RESULTS)
        tables, edited = tables_of(ctx, phases, digests)
    else:
        trained = train_plan(ctx, {name: configure(raw, ctx.overrides)
                                   for name, raw in (phases.plan(ctx) if phases.plan else {}).items()},
                             all_at_once=phases.all_at_once)
        trained |= {name: sweep_into(ctx, name, spec) for name, spec in (phases.sweeps(ctx) if phases.sweeps else {}).items()}
        measured = phases.measure(ctx, trained)
        unknown = set(measured) - set(phases.tables)
        if unknown:
            raise ValueError(f"measure returned tables not declared in Phases.tables: {sorted(unknown)}")
        tables, digests = {}, {}
        for t in phases.tables:
            path = write_table(Path(ctx.out) / f"{t}.csv", measured[t], phases.columns.get(t))
            tables[t] = read_table(path)
            digests[t] = table_digest(path, len(tables[t]))
    results = _judged(ctx, "judge", lambda: phases.judge(ctx, tables), edited)
    figures = _judged(ctx, "draw", lambda: phases.draw(ctx, tables, results), edited) if phases.draw else []
    if edited:
        log.warning("--judge-only: %s differ%s from what the reproduction wrote (edited since); judged as %s now, "
                    "and results.json says so (%s)", ", ".join(e["table"] for e in edited),
                    "s" if len(edited) == 1 else "", "it is" if len(edited) == 1 else "they are", EDITED)
    results.setdefault("files", [f"{t}.csv" for t in phases.tables if t in tables] + list(figures))
    if digests is not None:   # what --judge-only checks the tables against (kept when judged again)
        results.setdefault(DIGESTS, digests)
    if edited:
        results[EDITED] = edited
    return results


def train_plan(ctx, jobs: dict[str, Any], all_at_once: bool = False) -> dict[str, list[Path]]:
    """Train a plan's jobs (name → validated config) into ``OUT/runs/<name>``: on the local pool, one worker per
    core (``default_workers``; one where this process is itself a pool's worker, e.g. under ``reproduce --all
    --jobs N``), handed out in the plan's order; each job is seeded by its config, so a worker computes the bits
    the sequential loop would (tests/test_reproduce_parallel.py). Ctrl-C: the workers' trainings checkpoint and
    stop (``--resume`` continues them); a job's error stops the rest and is raised. ``all_at_once`` (where the pool
    has two workers or more): one worker per job even beyond the cores, for a plan of a few jobs of unequal
    length whose members cannot be regrouped without changing their bits (the cores time-share the jobs,
    so none waits for another to finish; the jobs are unchanged, so are their bits)."""
    workers = default_workers()
    workers = min(len(jobs), len(jobs) if all_at_once and workers > 1 else workers)
    if workers <= 1:
        return {name: train_into(ctx, name, cfg) for name, cfg in jobs.items()}
    out, resume = Path(ctx.out), bool(getattr(ctx, "resume", False))
    pool = process_pool(workers)
    try:
        futures = {name: pool.submit(train_job, out, resume, name, cfg) for name, cfg in jobs.items()}
        trained = {name: f.result() for name, f in futures.items()}
    except KeyboardInterrupt:
        terminate(pool, grace=10.0)
        raise
    except BaseException:
        terminate(pool, grace=10.0)
        raise
    pool.shutdown()
    return trained


def sweep_into(ctx, name: str, spec: dict) -> Path:
    """Run (or continue) sweep ``spec`` of a reproduction, with its ``--set`` and ``--device``, into its directory
    (module docstring); finished runs are never trained again. Returns the directory."""
    spec = dict(spec, config=on_reproduction_device(spec["config"], ctx.overrides), set=list(ctx.overrides))
    base = Path(getattr(ctx.options, "sweep_dir", None) or Path(ctx.out) / runs.RUNS)
    if (base / runs.RESULTS).exists() and (base / runs.RUNS).is_dir():     # an earlier reproduction's --out
        base = base / runs.RUNS
    root = base / f"{name}-{hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]}"
    run_sweep(spec, root, progress=ctx.progress)
    if hasattr(ctx.overrides, "consumed"):
        ctx.overrides.consumed = True
    return root


def register_phases(name: str, phases: Phases, *, default_config: Callable[[], dict] | None = None,
                    options: type | None = None, takes_set: bool | None = None, description: str | None = None,
                    configs: Callable[[Any], dict[str, dict]] | None = None):
    """Register reproduction ``name`` as its :class:`Phases` (its description from its paper's manifest);
    ``tdyn config NAME`` prints its plan (or ``configs``: e.g. a sweep's base config, which ``--set`` is checked
    against before anything runs), ``--judge-only`` judges its tables again."""
    configs = configs or phases.plan
    exp = register(name, description, default_config, configs=configs, options=options,
                   takes_set=False if configs is None and phases.sweeps is None and takes_set is None else takes_set,
                   origin=origin_of(phases.judge))(lambda ctx: run(phases, ctx))
    registered(name).phases = phases
    return exp
