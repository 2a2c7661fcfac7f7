"""The one statistics module every verdict uses: seed means and standard errors, paired differences,
margins above noise, equality within a tolerance, and the rules that combine cells and readings.

The single-seed rule lives here and nowhere else: with fewer than two seeds there is no noise band, so a
standard error is NaN and every comparison made with it is inconclusive (never decided on a band of 0).
``tests/test_stats.py`` checks the functions against hand-computed values, and that no reproduction or
probe computes a standard error on its own. (numpy only: imported by probes and reproductions alike.)
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

#: A claim's and a reading's verdicts; a reading may also be NOT_APPLICABLE (its event cannot happen here).
HOLDS, FAILS, INCONCLUSIVE, NOT_APPLICABLE = "holds", "fails", "inconclusive", "not applicable"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE)
K = 2.0   # margins are k·noise with k = 2 unless a claim states otherwise


def _finite(xs: Iterable[Any]) -> np.ndarray:
    a = np.asarray([float(x) for x in xs if x is not None], dtype=np.float64)
    return a[np.isfinite(a)]


def se(xs: Iterable[Any]) -> float:
    """Standard error of the mean over seeds: sample standard deviation (ddof 1) / √n of the finite
    values. NaN for fewer than two values: one seed gives no noise band (the single-seed rule)."""
    a = _finite(xs)
    return float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float("nan")


def sd(xs: Iterable[Any]) -> float:
    """Sample standard deviation (ddof 1) of the finite values; NaN for fewer than two."""
    a = _finite(xs)
    return float(a.std(ddof=1)) if a.size > 1 else float("nan")


def se_along(x: Any, axis: int = -1) -> Any:
    """:func:`se` along one axis of an array (numpy) or tensor (torch, without importing it: batched over
    members or cells): sample std (ddof 1) / √n; NaN where the axis has fewer than two entries."""
    n = x.shape[axis]
    if hasattr(x, "dim"):                      # a torch tensor
        if n < 2:
            return x.select(axis, 0) * float("nan")
        return x.std(dim=axis, correction=1) / math.sqrt(n)
    x = np.asarray(x, dtype=np.float64)
    if n < 2:
        return np.full(np.delete(x.shape, axis % x.ndim), np.nan)
    return x.std(axis=axis, ddof=1) / math.sqrt(n)


def median(xs: Iterable[Any]) -> float | None:
    """Median of the finite values (None and NaN left out); None when there are none (a time never reached)."""
    a = _finite(xs)
    return float(np.median(a)) if a.size else None


def mean_se(xs: Iterable[Any]) -> tuple[float, float]:
    """(mean, :func:`se`) of the finite values; (NaN, NaN) for none."""
    a = _finite(xs)
    return (float(a.mean()) if a.size else float("nan")), se(a)


def paired(a: Iterable[Any], b: Iterable[Any]) -> tuple[float, float]:
    """Mean over seeds of the per-seed difference a − b and its :func:`se`. Runs with the same seed share
    their initialisation and data stream, so the difference is paired (``a`` and ``b`` in seed order)."""
    d = np.asarray(list(a), dtype=np.float64) - np.asarray(list(b), dtype=np.float64)
    return mean_se(d)


def se_of_difference(a: Iterable[Any], b: Iterable[Any]) -> float:
    """Standard error of mean(a) − mean(b) for independent groups (Welch): √(se(a)² + se(b)²); NaN when
    either group has one value."""
    return math.sqrt(se(a) ** 2 + se(b) ** 2)


def decide(diff: float | None, noise: float | None, *, k: float = K) -> bool | None:
    """A comparison with a margin above noise: ``diff`` is (measured − reference) oriented so that a
    positive value supports the claim, ``noise`` its measured spread (the seed standard error of the
    difference, or a stated tolerance).

    True when ``diff > k·noise``, False when ``diff < −k·noise``, None (inconclusive) inside the band. A
    non-finite ``diff`` or ``noise`` (one seed: no band) is inconclusive.
    """
    if diff is None or noise is None or not math.isfinite(float(diff)) or not math.isfinite(float(noise)):
        return None
    band = k * max(float(noise), 0.0)
    if diff > band:
        return True
    if diff < -band:
        return False
    return None


def margin(diff: float, noise: float, *, k: float = K, noise_source: str = "") -> dict[str, Any]:
    """The numbers behind :func:`decide`, for results.json: the difference, the noise, the band k·noise."""
    return {"diff": diff, "noise": noise, "k": k, "band": k * noise} | ({"noise_source": noise_source} if noise_source else {})


def within(ratio: float | None, noise: float, tol: float, *, k: float = K) -> bool | None:
    """An equality claim measured/predicted = 1 with a stated relative tolerance ``tol`` and the measured
    seed noise: holds when |ratio − 1| + k·noise ≤ tol, fails when |ratio − 1| − k·noise > tol,
    inconclusive in between. A non-finite ratio is inconclusive; a non-finite noise (one seed) can
    still fail (a deviation beyond the tolerance whatever the noise) but never hold."""
    if ratio is None or not math.isfinite(ratio):
        return None
    noise = noise if math.isfinite(noise) else float("inf")
    dev = abs(ratio - 1.0)
    if dev + k * noise <= tol:
        return True
    if dev - k * noise > tol:
        return False
    return None


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


def all_seeds(votes: list[bool | None]) -> tuple[bool | None, str | None]:
    """A per-seed claim (:func:`every_cell` over seeds): holds if every seed holds, fails if some seed
    fails beyond its noise, else inconclusive. Each vote is decided on its own within-run band (e.g. a
    relabelling null), so one seed gives one vote, not a verdict without a band."""
    return every_cell({f"seed {i}": v for i, v in enumerate(votes)})


def word(held: bool | None) -> str:
    return HOLDS if held is True else FAILS if held is False else INCONCLUSIVE


def combine(readings: list[dict[str, Any]]) -> tuple[bool | None, str | None]:
    """The one rule that combines the readings of a claim whose paper leaves a definition open
    (docs/reproductions/README.md#verdicts):

    1. a reading that is *not applicable* (its event cannot happen in this setting) is set aside, with
       its reason; it is never a veto;
    2. with no applicable reading left, the claim is inconclusive (every reason listed);
    3. the claim holds (fails) when every applicable reading holds (fails);
    4. otherwise it is inconclusive: the readings disagree, or some reading is inside its noise band.
    """
    live = [r for r in readings if r["verdict"] != NOT_APPLICABLE]
    if not live:
        return None, "no reading applies: " + "; ".join(f"{r['name']} ({r.get('reason', '')})" for r in readings)
    words = {r["verdict"] for r in live}
    if words == {HOLDS}:
        return True, None
    if words == {FAILS}:
        return False, None
    if words == {INCONCLUSIVE}:
        return None, "every reading inconclusive: " + "; ".join(
            r["name"] + (f" ({r['reason']})" if r.get("reason") else "") for r in live)
    return None, "readings disagree: " + "; ".join(f"{r['verdict']} under {r['name']}" for r in live)
