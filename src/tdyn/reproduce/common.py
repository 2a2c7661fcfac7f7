"""Helpers shared by reproductions: CSV tables, claim verdicts, training into a reproduction."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, TypeVar

from tdyn import runs, stats
from tdyn.report import verdicts
from tdyn.results import Results
from tdyn.config import apply_overrides, check_shadowed, validate_config
from tdyn.train.trainer import train, train_or_resume


VERDICTS = stats.VERDICTS
SOURCES = verdicts.SOURCES   # paper | derived: the provenance every claim carries (report.verdicts counts them)

# the statistics every verdict uses live in tdyn.stats (one module, one single-seed rule); re-exported here
decide, margin, paired, within, every_cell = stats.decide, stats.margin, stats.paired, stats.within, stats.every_cell


def reading(definition: str, held: bool | None, *, reason: str | None = None, name: str | None = None,
            applicable: bool = True, **numbers: Any) -> dict[str, Any]:
    """One reading of a claim whose paper leaves a definition open: its definition (``name``: a short
    label for summaries, default the definition), its own verdict and numbers. ``applicable=False``
    (with ``reason``): the reading's event cannot happen in this setting (e.g. an unreachable reference);
    it is reported as *not applicable* and set aside by :func:`tdyn.stats.combine`, never a veto."""
    verdict = stats.word(held) if applicable else stats.NOT_APPLICABLE
    if not applicable and not reason:
        raise ValueError(f"reading {name or definition!r}: not applicable needs its reason")
    return {"name": name or definition, "definition": definition, "verdict": verdict,
            "held": held if applicable else None, "numbers": _jsonable(numbers)} | (
        {"reason": reason} if (held is None or not applicable) and reason else {})


def claim(id: str, statement: str, held: bool | None = None, *, source: str, paper: str, definition: str,
          quote: str | None = None, derived: str | None = None, measured: str | None = None,
          expected: str | None = None, reason: str | None = None, readings: list[dict[str, Any]] | None = None,
          **numbers: Any) -> dict[str, Any]:
    """One checked claim, with one of three verdicts: ``holds`` (``held`` True), ``fails`` (False) or
    ``inconclusive`` (None; ``reason`` says why: run too short, the quantity never moved above noise,
    the configuration is outside the theorem's hypotheses, the readings of an open definition disagree…).

    Provenance (required): ``source="paper"`` — a claim of the paper: ``quote`` its words, ``paper`` where
    they stand (section / figure / theorem); ``source="derived"`` — tdyn's own hypothesis, extrapolation
    or beyond-paper check: ``derived`` says what it adds and why, ``paper`` the statement it extends.
    Headline counts count paper claims; derived ones are shown apart, judged as strictly.
    ``definition`` (required) is the definition of the measured quantity tdyn uses; ``measured`` and
    ``expected`` fill the report's columns.

    ``readings`` (from :func:`reading`): where the paper leaves a definition open, each reasonable
    reading measured side by side; unless ``held`` is given explicitly they are combined by the one rule,
    :func:`tdyn.stats.combine`.
    """
    if source not in SOURCES:
        raise ValueError(f"claim {id!r}: source must be one of {SOURCES}, not {source!r}")
    if source == "paper" and not quote:
        raise ValueError(f"claim {id!r}: a paper claim quotes the paper's statement (quote=)")
    if source == "derived" and not derived:
        raise ValueError(f"claim {id!r}: a derived claim says what it adds to the paper and why (derived=)")
    if readings and held is None and reason is None:
        held, reason = stats.combine(readings)
    if held is None and not reason:
        reason = "not decided"
    out = {"id": id, "claim": statement, "source": source, "verdict": stats.word(held), "held": held}
    for k, v in (("reason", reason if held is None else None), ("quote", quote), ("derived", derived),
                 ("paper", paper), ("definition", definition), ("measured", measured), ("expected", expected)):
        if v is not None:
            out[k] = v
    if readings:
        out["readings"] = readings
    out["numbers"] = _jsonable(numbers)
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_results(out: Path, results: dict[str, Any]) -> Path:
    """A reproduction's ``results.json``; its ``.reproducing.json`` (written as it began) goes. Every
    claim must carry its provenance (``source``: paper or derived; :func:`claim`)."""
    for c in results.get("claims", []):
        if c.get("source") not in SOURCES:
            raise ValueError(f"claim {c.get('id')!r} of {results.get('experiment')!r} has no source (paper | derived)")
    Results.model_validate(_jsonable(results))   # the typed schema (tdyn.results): a malformed claim is a bug here
    runs.write_json(Path(out) / runs.RESULTS, _jsonable(results))
    (Path(out) / runs.REPRODUCING).unlink(missing_ok=True)
    return Path(out) / runs.RESULTS


def on_reproduction_device(base: dict, overrides) -> dict:
    """``base`` on the reproduction's ``--device`` (carried by ``ctx.overrides``; a ``--set device=``
    still wins). On the CPU ``base`` is returned as it is, so CPU configs, and the digests of the sweeps
    built from them, stay as they were."""
    device = getattr(overrides, "device", "cpu")
    return base if device == "cpu" else dict(base, device=device)


def results_in(out_dir) -> dict:
    """The results.json a figure is redrawn beside (its quick flag, overrides, grids), or {} where there is none."""
    path = Path(out_dir) / runs.RESULTS
    return runs.read_results(path) if path.is_file() else {}


def configure(base: dict, overrides: list[str]):
    """Validate a reproduction's run config after the user's ``--set`` overrides (``ctx.overrides``),
    on the reproduction's device (:func:`on_reproduction_device`).

    Marks the overrides consumed (the runner rejects overrides no config consumed); an override the
    config's own settings would shadow (``optim.groups.Y.lr`` under ``ensemble.lrs``) is an error."""
    raw = apply_overrides(on_reproduction_device(base, overrides), overrides)
    check_shadowed(raw, overrides)
    if hasattr(overrides, "consumed"):
        overrides.consumed = True
    return validate_config(raw)


def short_number(x: float) -> str:
    """A hyperparameter as claim texts write it: 0.2 → "0.2", 1e-3 → "1e-3", 2.5e-4 → "2.5e-4"."""
    if x and abs(x) <= 1e-3:
        mantissa, exp = f"{x:e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"
    return f"{x:g}"


#: an optimizer as claims and figures name it
OPTIMIZER_NAMES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


def optimizer_text(group, *extras: str) -> str:
    """A run config's optimizer group as claim texts state it, "SGD (lr 0.2, momentum 0.9, …)" or "Adam (lr 1e-3,
    β = (0.9, 0.98), …)", with ``extras`` (e.g. "weight decay 1e-4") inside the brackets."""
    name = OPTIMIZER_NAMES[group.optimizer]
    first = (f"momentum {group.momentum:g}" if group.optimizer == "sgd" else
             f"β = ({group.betas[0]:g}, {group.betas[1]:g})")
    return f"{name} ({', '.join((f'lr {short_number(group.lr)}', first, *extras))})"


def with_options(settings: dict, options) -> dict:
    """A reproduction's settings (full or --quick) with the typed options the user gave (fields that are
    not None) put in place of the entries of the same name: how grids become options
    (``tdyn reproduce NAME --help`` lists them)."""
    out = dict(settings)
    for k, v in (options.model_dump() if options is not None else {}).items():
        if v is not None and k in out:
            out[k] = list(v) if isinstance(v, (list, tuple)) else v
    return out


def train_into(ctx, name: str, cfg) -> list[Path]:
    """Train ``cfg`` into the reproduction's ``runs/<name>``, replacing an earlier attempt there; with
    ``ctx.resume`` an earlier attempt of the same config is kept (finished) or continued (interrupted)."""
    return train_job(Path(ctx.out), bool(getattr(ctx, "resume", False)), name, cfg, ctx.progress)


def train_job(out: Path, resume: bool, name: str, cfg, progress: bool = False) -> list[Path]:
    """:func:`train_into` from plain arguments (what a pool worker is handed)."""
    if resume:
        return train_or_resume(cfg, out / runs.RUNS / name, progress=progress)
    return train(cfg, out / runs.RUNS / name, force=True, progress=progress)


G = TypeVar("G")


def with_grid_options(grid: G, options) -> G:
    """``grid`` (a frozen dataclass of a reproduction's settings) with the typed options the user gave (those
    not None) in place of its fields of the same name; options that are no field of the grid (e.g. ``workers``)
    are left out."""
    if options is None:
        return grid
    names = {f.name for f in dataclasses.fields(grid)}
    given = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in options.model_dump().items()
             if v is not None and k in names}
    return dataclasses.replace(grid, **given)


def grid_dict(grid) -> dict:
    """A grid as the plain dict results.json records (nested grids as dicts; tuples and lists kept)."""
    return dataclasses.asdict(grid)
