"""Helpers shared by reproductions: CSV tables, claim verdicts, training into a reproduction."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from tdyn import runs
from tdyn.config import apply_overrides, validate_config


def write_csv(path: str | Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    """Write ``rows`` with exactly ``columns`` (atomically)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r[c] for c in columns})
    runs.atomic_write_text(Path(path), buf.getvalue())
    return Path(path)


def claim(id: str, statement: str, held: bool | None, *, measured: str | None = None, expected: str | None = None,
          undecided: str = "depends on definition", **numbers: Any) -> dict[str, Any]:
    """One checked claim: ``held`` is True/False, or None when undecided (``undecided`` says why:
    "depends on definition" by default, or e.g. "inconclusive" when the run was too short).

    ``measured`` (what was measured) and ``expected`` (the expected direction or value), when given,
    fill those columns of the report's claims table.
    """
    return {"id": id, "claim": statement,
            "verdict": "holds" if held is True else "fails" if held is False else undecided,
            "held": held, "numbers": _jsonable(numbers)} | \
        {k: v for k, v in (("measured", measured), ("expected", expected)) if v is not None}


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
    runs.write_json(Path(out) / "results.json", _jsonable(results))
    return Path(out) / "results.json"


def configure(base: dict, overrides: list[str]):
    """Validate a reproduction's run config after the user's ``--set`` overrides."""
    return validate_config(apply_overrides(base, overrides))


def train_into(ctx, name: str, cfg) -> list[Path]:
    """Train ``cfg`` into the reproduction's ``runs/<name>`` (replacing an earlier attempt there)."""
    from tdyn.train.trainer import train

    return train(cfg, ctx.out / "runs" / name, force=True, progress=ctx.progress)
