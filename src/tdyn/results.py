"""The typed schema of a reproduction's ``results.json``, beside :class:`tdyn.config.RunConfig`.

A result is its reproduction's name, its claims and what made it; each :class:`Claim` carries its
verdict, its provenance (``paper`` with the paper's words, or ``derived`` with what tdyn adds) and
its numbers; an open definition's readings are :class:`Reading`. Reproductions add their own numbers
as further keys (kept as they are). The reproduce core validates every result it writes
against it, and the report reads committed results through it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from tdyn import stats

Verdict = Literal["holds", "fails", "inconclusive"]
SOURCES = ("paper", "derived")


class Reading(BaseModel):
    """One reading of an open definition, with its own verdict (or not applicable, with its reason)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    definition: str
    verdict: Literal["holds", "fails", "inconclusive", "not applicable"]
    held: bool | None
    numbers: dict[str, Any] = {}
    reason: str | None = None


class Claim(BaseModel):
    """One checked claim (what a reproduction's ``claim(...)`` builds)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    claim: str
    source: Literal["paper", "derived"]
    verdict: Verdict
    held: bool | None
    paper: str
    definition: str
    quote: str | None = None
    derived: str | None = None
    reason: str | None = None
    measured: str | None = None
    expected: str | None = None
    readings: list[Reading] | None = None
    numbers: dict[str, Any] = {}
    quick: bool | None = None
    overrides: list[str] | None = None   # the --set the runs were made with: off the setting the claim text states

    @model_validator(mode="after")
    def _consistent(self):
        if self.verdict != stats.word(self.held):
            raise ValueError(f"claim {self.id!r}: verdict {self.verdict!r} but held={self.held!r}")
        if self.source == "paper" and not self.quote:
            raise ValueError(f"claim {self.id!r}: a paper claim quotes the paper (quote)")
        if self.source == "derived" and not self.derived:
            raise ValueError(f"claim {self.id!r}: a derived claim says what it adds (derived)")
        if self.held is None and not self.reason:
            raise ValueError(f"claim {self.id!r}: an inconclusive verdict says why (reason)")
        return self


class Results(BaseModel):
    """A reproduction's ``results.json``: the keys every result has; a reproduction's own numbers are extra keys."""

    model_config = ConfigDict(extra="allow")
    experiment: str
    claims: list[Claim] = []
    files: list[str] | None = None
    quick: bool | None = None
    wall_seconds: float | None = None
    made: dict[str, Any] | None = None
    docs: str | None = None
