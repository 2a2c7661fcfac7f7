"""tdyn.stats, the one statistics module of every verdict: hand-computed values, the single-seed rule,
the reading-combination rule (not applicable included), and that no reproduction or probe computes a
standard error on its own."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tdyn import stats
from tdyn.reproduce.common import claim, reading, write_results

SRC = Path(__file__).resolve().parents[1] / "src" / "tdyn"


def test_se_by_hand():
    # 1, 2, 3, 6: mean 3, deviations −2 −1 0 3, sum of squares 14, sample var 14/3, se √(14/3)/2
    assert stats.se([1, 2, 3, 6]) == pytest.approx(math.sqrt(14 / 3) / 2, rel=1e-15)
    assert stats.sd([1, 2, 3, 6]) == pytest.approx(math.sqrt(14 / 3), rel=1e-15)
    m, s = stats.mean_se([1, 2, 3, 6])
    assert (m, s) == (3.0, stats.se([1, 2, 3, 6]))
    # non-finite values and None are left out
    assert stats.se([1, None, float("nan"), 3]) == pytest.approx(math.sqrt(2) / math.sqrt(2))


def test_single_seed_gives_no_band():
    assert math.isnan(stats.se([0.7]))
    assert math.isnan(stats.paired([1.0], [0.0])[1])
    assert stats.paired([1.0], [0.0])[0] == 1.0
    # a comparison with no band is inconclusive, however large the difference
    assert stats.decide(100.0, stats.se([0.7])) is None
    assert stats.decide(100.0, None) is None
    assert math.isnan(stats.se_of_difference([1.0], [2.0, 3.0]))


def test_se_along_numpy_and_torch():
    x = np.array([[1, 2, 3, 6], [0, 0, 0, 4]], dtype=float)
    np.testing.assert_allclose(stats.se_along(x, 1), [stats.se(x[0]), stats.se(x[1])], rtol=1e-15)
    t = torch.tensor(x)
    np.testing.assert_allclose(stats.se_along(t, 1).numpy(), [stats.se(x[0]), stats.se(x[1])], rtol=1e-12)
    assert torch.isnan(stats.se_along(t[:, :1], 1)).all()
    assert np.isnan(stats.se_along(x[:, :1], 1)).all()


def test_paired_by_hand():
    # differences 1, 3: mean 2, sample sd √2, se 1
    assert stats.paired([2, 5], [1, 2]) == pytest.approx((2.0, 1.0))


def test_decide_margin_within_every_cell():
    assert stats.decide(2.1, 1.0) is True and stats.decide(-2.1, 1.0) is False and stats.decide(1.9, 1.0) is None
    assert stats.decide(float("nan"), 1.0) is None
    assert stats.margin(3.0, 0.5) == {"diff": 3.0, "noise": 0.5, "k": 2.0, "band": 1.0}
    assert stats.within(1.05, 0.01, 0.1) is True        # 0.05 + 0.02 ≤ 0.1
    assert stats.within(1.2, 0.01, 0.1) is False        # 0.2 − 0.02 > 0.1
    assert stats.within(1.09, 0.01, 0.1) is None        # 0.09 + 0.02 > 0.1 ≥ 0.09 − 0.02
    assert stats.within(1.2, float("nan"), 0.1) is None  # no band: cannot be decided either way
    assert stats.every_cell({"a": True, "b": True}) == (True, None)
    assert stats.every_cell({"a": True, "b": False})[0] is False
    held, why = stats.every_cell({"a": True, "b": None})
    assert held is None and "1 of 2 cells" in why and "b" in why


def _r(verdict_held, applicable=True, name="r"):
    return reading(name, verdict_held, name=name, applicable=applicable,
                   reason=None if applicable else "its event cannot happen here")


@pytest.mark.parametrize("readings, held, why", [
    ([_r(True, name="a"), _r(True, name="b")], True, None),
    ([_r(False, name="a"), _r(False, name="b")], False, None),
    ([_r(True, name="a"), _r(False, name="b")], None, "readings disagree"),
    ([_r(True, name="a"), _r(None, name="b")], None, "readings disagree"),
    ([_r(None, name="a"), _r(None, name="b")], None, "every reading inconclusive"),
    # not applicable is set aside, never a veto
    ([_r(True, name="a"), _r(None, applicable=False, name="b")], True, None),
    ([_r(False, name="a"), _r(True, applicable=False, name="b")], False, None),
    ([_r(None, applicable=False, name="a")], None, "no reading applies"),
])
def test_combine_rule(readings, held, why):
    h, reason = stats.combine(readings)
    assert h is held
    assert (reason is None) if why is None else why in reason


def test_not_applicable_reading_needs_a_reason():
    r = _r(None, applicable=False)
    assert r["verdict"] == "not applicable" and r["reason"]
    with pytest.raises(ValueError, match="needs its reason"):
        reading("x", None, applicable=False)


def test_claim_provenance_is_required(tmp_path):
    c = claim("a", "s", True, source="paper", quote="the words", paper="§1", definition="d")
    assert c["source"] == "paper" and c["quote"] == "the words"
    d = claim("b", "s", None, source="derived", derived="tdyn's extrapolation", paper="§1", definition="d",
              readings=[_r(True, name="x"), _r(None, applicable=False, name="y")])
    assert d["verdict"] == "holds" and d["readings"][1]["verdict"] == "not applicable"
    with pytest.raises(ValueError, match="quotes the paper"):
        claim("a", "s", True, source="paper", paper="§1", definition="d")
    with pytest.raises(ValueError, match="what it adds"):
        claim("a", "s", True, source="derived", paper="§1", definition="d")
    with pytest.raises(ValueError, match="source must be"):
        claim("a", "s", True, source="mine", paper="§1", definition="d")
    with pytest.raises(ValueError, match="has no source"):
        write_results(tmp_path, {"experiment": "x", "claims": [{"id": "a", "verdict": "holds"}]})


#: A standard error (or a seed standard deviation) computed outside tdyn.stats.
INLINE_SE = [re.compile(p) for p in (r"ddof\s*=\s*1", r"unbiased\s*=\s*True", r"correction\s*=\s*1",
                                     r"std\([^()]*(\([^()]*\))?[^()]*\)\s*/\s*(math\.|np\.|torch\.)?sqrt",
                                     r"statistics\.(stdev|variance)")]


def test_no_standard_error_outside_the_stats_module():
    where = [p for d in ("experiments", "probes", "papers", "report") for p in (SRC / d).rglob("*.py")]
    found = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in where
             for i, line in enumerate(p.read_text().splitlines(), 1) if any(r.search(line) for r in INLINE_SE)]
    assert not found, "compute standard errors with tdyn.stats:\n" + "\n".join(found)


def test_median_of_finite_values():
    assert stats.median([3, None, float("nan"), 1, 2]) == 2.0
    assert stats.median([None, float("nan")]) is None
