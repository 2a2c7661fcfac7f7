"""Run identities: which run wrote a file (issue 36).

A run's identity is ``<member>@<digest>``: the member's name (``seed=0``, ``optim.groups.Y.lr=0.5__seed=1``, ...:
:func:`tdyn.runs.run_name`; ``seed0``, ``seed1_lrY0.5`` in runs an older tdyn wrote, which keep them, as resume
reads each run's identity from its files and a sweep accepts the older form, :func:`tdyn.sweep.check_runs`) and the
first 16 hex digits of the SHA-256 of its ``config.json`` as written (keys sorted, compact JSON), the config
that determines its trajectory (all of it but where it runs, ``device``, whether its steps replay as CUDA
graphs, ``cuda_graph``, and where its metrics are copied, ``log``: :data:`EXECUTION_KEYS`). The trainer computes it once per member and writes it into every file of
the run: ``meta.json`` (``identity``), every checkpoint's safetensors metadata (``identity``) and the first
record of ``metrics.jsonl`` (``run``); a job's ``ensemble.json`` and a sweep's ``sweep.json`` record the
identity each of their runs must have. Readers (:func:`tdyn.runs.records.run_identity` and the readers of
checkpoints and metrics) compare: a file written by another run, a ``config.json`` edited after the run
wrote it, or a run directory in another's place is a :class:`ForeignFile` (exit 2) naming the file, the run
it belongs to and the run reading it. A run directory written before identities existed (no ``identity``
in its ``meta.json``) is read unchecked, with a one-line notice, once per process (the same notice as for a
``meta.json`` or ``metrics.jsonl`` written before checksums: :func:`notice_old`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from tdyn.runs.io import CorruptFile

IDENTITY = "identity"      # meta.json key and checkpoint metadata key
METRICS_KEY = "run"        # metrics.jsonl's first record: the identity of the run that wrote it
log = logging.getLogger(__name__)
_noticed = False


class ForeignFile(CorruptFile):
    """A file (or run directory) that belongs to another run than the one reading it: copied, swapped or
    symlinked in, or edited after the run wrote it. Never passed over (resume does not fall back past it)."""


#: config keys that say where a run executes, not what it computes: left out of its digest, so a run trained on a
#: GPU reads (and resumes) on a CPU after ``device`` is edited, and a sink can be switched on for a resume
EXECUTION_KEYS = ("device", "log", "cuda_graph")


def config_digest(config: dict) -> str:
    """The first 16 hex digits of the SHA-256 of ``config`` (but its :data:`EXECUTION_KEYS`) as compact JSON
    with sorted keys."""
    what = {k: v for k, v in config.items() if k not in EXECUTION_KEYS} if isinstance(config, dict) else config
    text = json.dumps(what, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_identity(config: dict, member: str) -> str:
    """The identity of member ``member`` trained by ``config`` (its own ``config.json``)."""
    return f"{member}@{config_digest(config)}"


def _show(identity: str | None) -> str:
    return f"run {identity}" if identity else "a run without an identity (an older tdyn's)"


def check(path: Path, found: str | None, expected: str | None, reader: Path | str) -> None:
    """``path`` (a file, or a run directory) carries ``found``; ``reader`` (the run, or the job or sweep
    that expects it) is ``expected``: unequal is a :class:`ForeignFile` naming both."""
    if found != expected:
        raise ForeignFile(path, f"belongs to {_show(found)}, not to {_show(expected)} that reads it "
                                f"({str(reader)!r}): copied, swapped or edited; restore it, or train the run "
                                f"again with --force")


def notice_old(path: Path, lacks: str = "no run identity") -> None:
    """One line, once per process, for the first file or run directory found written by an older tdyn:
    ``lacks`` says what it lacks (a run identity, a checksum), which is then not checked."""
    global _noticed
    if not _noticed:
        _noticed = True
        log.warning("%s has %s: written by an older tdyn (so may other files and runs be), it is read without "
                    "that check", str(path), lacks)
