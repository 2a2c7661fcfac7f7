"""Helpers shared by reproductions: CSV tables, claim verdicts, training into a reproduction."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from tdyn import runs
from tdyn.config import apply_overrides, check_shadowed, validate_config
from tdyn.train.trainer import train, train_or_resume


VERDICTS = ("holds", "fails", "inconclusive")


def decide(diff: float, noise: float, *, k: float = 2.0) -> bool | None:
    """A comparison with a margin above noise: ``diff`` is (measured − reference) oriented so that a
    positive value supports the claim, ``noise`` its measured spread (e.g. the seed-to-seed standard
    error of the difference, or a stated tolerance).

    True when ``diff > k·noise``, False when ``diff < −k·noise``, None (inconclusive) inside the band.
    A non-finite ``diff`` is inconclusive.
    """
    if diff is None or not math.isfinite(float(diff)):
        return None
    band = k * max(float(noise), 0.0)
    if diff > band:
        return True
    if diff < -band:
        return False
    return None


def margin(diff: float, noise: float, *, k: float = 2.0, noise_source: str = "") -> dict[str, Any]:
    """The numbers behind :func:`decide`, for results.json: the difference, the noise, the band k·noise."""
    return {"diff": diff, "noise": noise, "k": k, "band": k * noise} | ({"noise_source": noise_source} if noise_source else {})


def paired(a, b) -> tuple[float, float]:
    """Mean over seeds of the per-seed difference a − b and its standard error (sample std/√n). Runs
    with the same seed share their initialisation and data stream, so the difference is paired."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return float(d.mean()), se


def every_cell(verdicts: dict[str, bool | None]) -> tuple[bool | None, str | None]:
    """A claim about every cell: holds when every cell holds (margin above noise), fails when any cell
    fails (a reversal beyond the noise band), inconclusive otherwise (cells inside the band)."""
    if not verdicts:
        return None, "no cells to compare at these settings"
    if any(v is False for v in verdicts.values()):
        return False, None
    if all(v is True for v in verdicts.values()):
        return True, None
    band = [k for k, v in verdicts.items() if v is None]
    return None, f"{len(band)} of {len(verdicts)} cells inside the noise band: {', '.join(band)}"


def within(ratio: float, noise: float, tol: float, *, k: float = 2.0) -> bool | None:
    """An equality claim measured/predicted = 1 with a stated tolerance ``tol`` (relative) and the
    measured seed noise: holds when |ratio − 1| + k·noise ≤ tol, fails when |ratio − 1| − k·noise > tol,
    inconclusive in between. A non-finite ratio is inconclusive."""
    if ratio is None or not math.isfinite(ratio):
        return None
    noise = noise if math.isfinite(noise) else float("inf")
    dev = abs(ratio - 1.0)
    if dev + k * noise <= tol:
        return True
    if dev - k * noise > tol:
        return False
    return None


def reading(definition: str, held: bool | None, *, reason: str | None = None, name: str | None = None,
            **numbers: Any) -> dict[str, Any]:
    """One reading of a claim whose paper leaves a definition open: its definition (``name``: a short
    label for summaries, default the definition), its own verdict and numbers. A claim with several
    readings reports them side by side (see :func:`claim`)."""
    return {"name": name or definition, "definition": definition, "verdict": _verdict_word(held), "held": held,
            "numbers": _jsonable(numbers)} | ({"reason": reason} if held is None and reason else {})


def _verdict_word(held: bool | None) -> str:
    return "holds" if held is True else "fails" if held is False else "inconclusive"


def claim(id: str, statement: str, held: bool | None = None, *, paper: str, definition: str, measured: str | None = None, expected: str | None = None,
          reason: str | None = None, readings: list[dict[str, Any]] | None = None,
          **numbers: Any) -> dict[str, Any]:
    """One checked claim, with one of three verdicts: ``holds`` (``held`` True), ``fails`` (False) or
    ``inconclusive`` (None; ``reason`` says why: run too short, the quantity never moved above noise,
    the configuration is outside the theorem's hypotheses, the readings of an open definition disagree…).

    ``paper`` (required) names the statement tested (section / figure / theorem); ``definition``
    (required) the definition of the measured quantity tdyn uses; ``measured`` and ``expected`` fill the report's columns.

    ``readings`` (from :func:`reading`): where the paper leaves a definition open, each reasonable
    reading measured side by side. Unless ``held`` is given explicitly, the claim holds (fails) when every
    reading holds (fails) and is inconclusive otherwise, naming the readings that disagree.
    """
    if readings:
        if held is None and reason is None:
            words = {r["verdict"] for r in readings}
            if len(words) == 1 and words != {"inconclusive"}:
                held = readings[0]["held"]
            elif words == {"inconclusive"}:
                reason = "every reading inconclusive: " + "; ".join(
                    f"{r['name']}" + (f" ({r['reason']})" if r.get("reason") else "") for r in readings)
            else:
                reason = "readings disagree: " + "; ".join(f"{r['verdict']} under {r['name']}" for r in readings)
    if held is None and not reason:
        reason = "not decided"
    out = {"id": id, "claim": statement, "verdict": _verdict_word(held), "held": held}
    for k, v in (("reason", reason if held is None else None), ("paper", paper), ("definition", definition),
                 ("measured", measured), ("expected", expected)):
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
    """A reproduction's ``results.json``; its ``.reproducing.json`` (written as it began) goes."""
    runs.write_json(Path(out) / runs.RESULTS, _jsonable(results))
    (Path(out) / runs.REPRODUCING).unlink(missing_ok=True)
    return Path(out) / runs.RESULTS


def on_reproduction_device(base: dict, overrides) -> dict:
    """``base`` on the reproduction's ``--device`` (carried by ``ctx.overrides``; a ``--set device=``
    still wins). On the CPU ``base`` is returned as it is, so CPU configs, and the digests of the sweeps
    built from them, stay as they were."""
    device = getattr(overrides, "device", "cpu")
    return base if device == "cpu" else dict(base, device=device)


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
    if getattr(ctx, "resume", False):
        return train_or_resume(cfg, ctx.out / runs.RUNS / name, progress=ctx.progress)
    return train(cfg, ctx.out / runs.RUNS / name, force=True, progress=ctx.progress)
