"""The records of tdyn's directories, each read and checked: a run's ``config.json``, ``meta.json`` and
``metrics.jsonl``, a job's ``ensemble.json``, a sweep's ``sweep.json``, a reproduction's
``results.json`` and a ``reproduce --all`` directory's ``reproduce.json``; and which run directories a
job or sweep holds (:func:`job_dirs`). A bad file is a :class:`~tdyn.runs.io.CorruptFile` naming it.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import torch

from tdyn.config import RunConfig, validate_config
from tdyn.errors import UserError
from tdyn.runs.atomic import atomic_write_bytes
from tdyn.runs.checkpoints import checkpoint_path, checkpoint_steps, read_checkpoint
from tdyn.runs.identity import IDENTITY, METRICS_KEY, ForeignFile, check, config_digest, notice_old
from tdyn.runs.io import (METRICS_LIMIT, CorruptFile, _field, _json_type, _object, _parse_json, _read_bytes, _short,
                          content_checksum)
from tdyn.runs.names import CONFIG, DONE, ENSEMBLE, LINE_CRC, META, METRICS, SEAL, STATUSES, SWEEP


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).exists() and (Path(path) / META).exists()


def read_results(path: Path) -> dict:
    """A reproduction's ``results.json``, checked: a JSON object whose ``claims`` (if present) is a list of
    objects (what the report and the verdict table read)."""
    path = Path(path)
    res = _object(path, "a reproduction's results")
    claims = res.get("claims", [])
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise CorruptFile(path, f"has 'claims' = {_short(claims)}, not a list of claims (JSON objects)")
    return res


def read_manifest(path: Path) -> dict:
    """A ``reproduce --all`` directory's ``reproduce.json``, checked: a JSON object whose ``reproductions``
    is a list of objects each naming its ``dir`` (a subdirectory's name)."""
    path = Path(path)
    man = _object(path, "a reproduce --all manifest")
    entries = _field(path, man, "reproductions", list, "a list of reproductions")
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("dir"), str) or not e["dir"] \
                or Path(e["dir"]).name != e["dir"] or e["dir"] in (".", ".."):
            raise CorruptFile(path, f"has a reproduction {_short(e)} without a subdirectory name 'dir'")
    return man


# metrics.jsonl's lines: each record's JSON with its CRC-32 last, ``, "crc": "xxxxxxxx"}``, chained (each line's
# CRC starts from the one before it), so a changed digit, a dropped, repeated or moved line is found by the
# reader (:func:`scan_metrics`); the last line's loss is found from the run's status (:func:`_check_end`).
_CRC_AT = f', "{LINE_CRC}": "'.encode()          # 10 bytes, then 8 hex digits and '"}'
_CRC_ONLY = f'{{"{LINE_CRC}": "'.encode()           # an empty record's line: this, 8 hex digits, '"}'
_encode = json.JSONEncoder(allow_nan=False).encode   # json.dumps(allow_nan=False)'s text, its encoder made once


def _line(r: dict, n: int, identity: str | None, prev: int) -> tuple[bytes, int]:
    """Record number ``n`` (from 0) as a line and its CRC, chained from ``prev`` (the line before's; 0 for the
    first); the first line carries the run's identity (``run``)."""
    if LINE_CRC in r:
        raise UserError(f"a metrics record may not have the key {LINE_CRC!r} (metrics.jsonl's line checksum): "
                        f"record {n} (step {_short(r.get('step'))})")
    body = _encode(r | {METRICS_KEY: identity} if n == 0 and identity else r).encode()
    crc = zlib.crc32(body, prev)
    if body == b"{}":
        return b'{"%s": "%08x"}\n' % (LINE_CRC.encode(), crc), crc
    return body[:-1] + _CRC_AT + b"%08x" % crc + b'"}\n', crc


def _lines(records: list[dict], identity: str | None, start: int = 0, prev: int = 0):
    """The lines of ``records`` (numbered from ``start``, chained from ``prev``), and each one's CRC."""
    for n, r in enumerate(records, start):
        line, prev = _line(r, n, identity, prev)
        yield line, prev


def metrics_file(run_dir: Path, records: list[dict], identity: str | None = None) -> tuple[Path, bytes]:
    """``metrics.jsonl``'s path and contents for ``records`` (for :func:`atomic_write_many`); ``identity``:
    the run's, written into the first record."""
    return Path(run_dir) / METRICS, b"".join(line for line, _ in _lines(records, identity))


class MetricsLines:
    """``metrics.jsonl``'s contents for one growing list of records, each record encoded once: the trainer
    writes the whole file at every checkpoint, and encoding every record again each time would make a
    dense schedule's checkpoints dearer as the run goes on. The same bytes as :func:`metrics_file`."""

    def __init__(self, identity: str | None = None) -> None:
        self.identity = identity
        self._records: list[dict] | None = None
        self._lines: list[bytes] = []
        self._crc = 0            # the last line's CRC: the next line's chains from it

    def file(self, run_dir: Path, records: list[dict]) -> tuple[Path, bytes]:
        """``(path, contents)`` for ``records``: those encoded before (the same list, records only appended
        since) are reused; another list, or a shorter one, is encoded afresh."""
        if records is not self._records or len(records) < len(self._lines):
            self._records, self._lines, self._crc = records, [], 0
        for line, self._crc in _lines(records[len(self._lines):], self.identity, len(self._lines), self._crc):
            self._lines.append(line)
        return Path(run_dir) / METRICS, b"".join(self._lines)


def write_metrics(run_dir: Path, records: list[dict], identity: str | None = None) -> None:
    """Write ``records`` as ``run_dir``'s metrics.jsonl (atomically), carrying ``identity``; by default, in a run
    directory, the run's own (its ``meta.json``'s), so a run's metrics rewritten (e.g. cut at a step) stay its."""
    if identity is None and (Path(run_dir) / META).is_file():
        ident = read_meta(run_dir).get(IDENTITY)
        identity = ident if isinstance(ident, str) else None
    atomic_write_bytes(*metrics_file(run_dir, records, identity))


def _record_problem(rec: Any, prev: int | None) -> str | None:
    if not isinstance(rec, dict):
        return f"is a JSON {_json_type(rec)}, not a record"
    step = rec.get("step")
    if type(step) is not int or step < 0:
        return f"has step {_short(step)}, not a whole number"
    if prev is not None and step <= prev:
        return f"has step {step} after step {prev} (steps must increase)"
    for k, v in rec.items():
        if v is not None and not isinstance(v, (int, float)):
            return f"has {k!r} = {_short(v)}, not a number"
    return None


_LOOKUP = object()   # identity=: read the run's own (run_identity)


def _crc_problem(line: bytes, rec: dict, prev: int) -> tuple[str | None, int]:
    """What is wrong with ``line``'s checksum (None: it holds, the line is as tdyn wrote it after a line of
    CRC ``prev``), and its CRC; ``rec`` (the line parsed) loses its ``crc``."""
    stored = rec.pop(LINE_CRC)
    if line[-20:-10] == _CRC_AT and line[-2:] == b'"}':
        body, have = line[:-20] + b"}", line[-10:-2]
    elif len(line) == 19 and line[:9] == _CRC_ONLY and line[-2:] == b'"}':   # an empty record
        body, have = b"{}", line[9:17]
    else:
        return f"has its checksum {_short(stored)} elsewhere than tdyn writes it (last): edited", prev
    if not isinstance(stored, str) or stored.encode() != have:   # a second "crc" key before the last
        return f"has two checksums ({_short(stored)}, {have.decode(errors='replace')}): edited", prev
    crc = zlib.crc32(body, prev)
    if b"%08x" % crc != have:
        return (f"fails its checksum (crc {stored}, but the line gives {crc:08x}): changed since tdyn wrote it (a "
                f"flipped digit, an edit), or a line before it dropped, repeated or moved"), prev
    return None, crc


def scan_metrics(run_dir: Path, identity: str | None | object = _LOOKUP) -> tuple[list[dict], CorruptFile | None]:
    """``metrics.jsonl``'s records up to its first bad line, and what is wrong with that line (None
    when all are good; a missing file gives no records and its problem). Resume keeps such a prefix;
    every other reader uses :func:`read_metrics`. Each line's checksum (``crc``, chained from the line
    before) must hold: a changed line, or a line dropped, repeated or moved before it, is its problem; a file
    written before checksums (no ``crc`` on line 1) is read unchecked, with a one-line notice. The first
    record's run identity (``run``, not among the records returned) must be ``identity`` (by default the
    run's, :func:`run_identity`): a file of another run gives no records and a
    :class:`~tdyn.runs.identity.ForeignFile`."""
    p = Path(run_dir) / METRICS
    try:
        data = _read_bytes(p, METRICS_LIMIT)
    except CorruptFile as e:
        return [], e
    recs: list[dict] = []
    lines = data.split(b"\n")
    sealed, crc = True, 0
    for n, line in enumerate(lines, 1):
        if n == len(lines) and not line:   # after the last newline
            break
        try:
            rec = _parse_json(line)
        except ValueError:                  # not UTF-8, not JSON (UnicodeDecodeError is a ValueError)
            return recs, CorruptFile(p, f"line {n} is not valid JSON: truncated or garbled")
        has = isinstance(rec, dict) and LINE_CRC in rec
        if n == 1 and not has:
            sealed = False
            notice_old(p, "no checksums on its lines")
        elif has != sealed:
            return recs, CorruptFile(p, f"line {n} has a checksum ({LINE_CRC!r}) but line 1 has none: edited, or lines "
                                        f"of another file mixed in" if has else
                                        f"line {n} has no checksum ({LINE_CRC!r}), unlike the lines before it: edited")
        if has:
            problem, crc = _crc_problem(line, rec, crc)
            if problem:
                return recs, CorruptFile(p, f"line {n} {problem}")
        if n == 1:
            found = rec.pop(METRICS_KEY, None) if isinstance(rec, dict) else None
            if found is not None and not isinstance(found, str):
                return recs, CorruptFile(p, f"line 1 has {METRICS_KEY!r} = {_short(found)}, not a run identity")
            if identity is _LOOKUP:
                try:
                    identity = run_identity(run_dir) if is_run_dir(run_dir) else found   # outside a run: unchecked
                except CorruptFile as e:
                    return recs, e
            try:
                check(p, found, identity, run_dir)
            except ForeignFile as e:
                return recs, e
        problem = _record_problem(rec, recs[-1]["step"] if recs else None)
        if problem:
            return recs, CorruptFile(p, f"line {n} {problem}")
        recs.append(rec)
    return recs, None


def read_metrics(run_dir: Path) -> list[dict]:
    """Every record of ``metrics.jsonl``; a bad line is a :class:`CorruptFile` naming it. No file yet is
    no records only for a run without a checkpoint or a result (running, or failed or interrupted before
    its first checkpoint when ``checkpoint.initial`` is false)."""
    recs, problem = scan_metrics(run_dir)
    if problem is None:
        _check_end(run_dir, recs)
        return recs
    if isinstance(problem, ForeignFile):
        raise problem
    if not (Path(run_dir) / METRICS).exists() and not checkpoint_steps(run_dir) \
            and read_meta(run_dir)["status"] not in DONE:
        return []
    if not (Path(run_dir) / METRICS).exists():
        raise CorruptFile(problem.path, "is missing, but the run has checkpoints or has ended")
    raise problem


def _check_end(run_dir: Path, recs: list[dict]) -> None:
    """A run with a result ends its metrics with it: a finished run with the record of its last step (its
    config's ``optim.steps``: every run is evaluated there), a diverged one with its divergence record. Lines
    lost at the end (which no checksum can show: the lines before are intact) are a :class:`CorruptFile`."""
    if not is_run_dir(run_dir):
        return
    status = read_meta(run_dir)["status"]
    if status == "finished":
        T = _steps_of(run_dir)
        if not recs or recs[-1]["step"] != T:
            raise CorruptFile(Path(run_dir) / METRICS, f"ends at step {recs[-1]['step'] if recs else '(none)'}, but the "
                                                       f"run finished at step {T} ({META}): its last lines are lost")
    elif status == "diverged" and (not recs or recs[-1].get("diverged") is not True):
        raise CorruptFile(Path(run_dir) / METRICS, f"does not end with the divergence record its {META} reports "
                                                   f"(status diverged): its last lines are lost")


def _steps_of(run_dir: Path) -> int:
    """The run's ``optim.steps``, read from its config.json as written: a run of a task registered elsewhere
    (a plugin's, not imported by this reader) is read without validating its config."""
    raw = read_config(run_dir)
    steps = raw.get("optim", {}).get("steps") if isinstance(raw.get("optim"), dict) else None
    if not isinstance(steps, int) or isinstance(steps, bool):
        return load_run_config(run_dir).optim.steps     # the validator names what is wrong
    return steps


def read_config(run_dir: Path) -> dict:
    """``config.json`` as written (a JSON object; :func:`load_run_config` validates it)."""
    return _object(Path(run_dir) / CONFIG, "a run config")


def config_from(raw: Any, path: Path) -> RunConfig:
    """``raw``, read from ``path``, validated as a run config; a bad key is a CorruptFile naming the file."""
    if not isinstance(raw, dict):
        raise CorruptFile(path, f"holds {_short(raw)} where a run config (a JSON object) belongs")
    try:
        return validate_config(raw)
    except UserError as e:
        raise CorruptFile(path, f"is not a valid run config: {e}") from None


def load_run_config(run_dir: Path) -> RunConfig:
    """A run's ``config.json``, validated."""
    return config_from(read_config(run_dir), Path(run_dir) / CONFIG)


def run_identity(run_dir: Path) -> str | None:
    """The identity of the run in ``run_dir`` (``meta.json``'s ``identity``), checked against its
    ``config.json``: a config edited or swapped since the run wrote it is a
    :class:`~tdyn.runs.identity.ForeignFile`. None for a run written before identities (with a notice)."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    ident = meta.get(IDENTITY)
    if ident is None:
        notice_old(run_dir)
        return None
    if not isinstance(ident, str) or "@" not in ident:
        raise CorruptFile(run_dir / META, f"has {IDENTITY!r} = {_short(ident)}, not a run identity (member@digest)")
    digest = config_digest(read_config(run_dir))
    if digest != ident.rpartition("@")[2]:
        raise ForeignFile(run_dir / CONFIG, f"has digest {digest}, not {ident.rpartition('@')[2]} as run {ident} "
                                            f"recorded in {META} ({str(run_dir)!r}): edited or swapped since the run "
                                            f"wrote it; restore it, or train the run again with --force")
    return ident


def check_run(run_dir: Path, expected: str | None, reader: Path | str) -> str | None:
    """The run in ``run_dir`` is ``expected`` (what a job's or sweep's record says it must be; None: an
    older record without identities, nothing to compare); its identity."""
    ident = run_identity(run_dir)
    if expected is not None and ident is not None:
        check(Path(run_dir), ident, expected, reader)
    return ident


def read_meta(run_dir: Path) -> dict:
    """``meta.json``, checked: its checksum (``checksum``, not among the keys returned: a ``meta.json`` changed
    since tdyn wrote it is a :class:`CorruptFile`; one written before checksums is read unchecked, with a
    one-line notice), a known ``status`` and a whole-number ``seed``."""
    path = Path(run_dir) / META
    meta = _object(path, "run metadata")
    seal = meta.pop(SEAL, None)
    if seal is None:
        notice_old(path, "no checksum")
    elif seal != (want := content_checksum(meta)):
        raise CorruptFile(path, f"fails its checksum ({SEAL} {_short(seal)}, but its content gives {want}): changed "
                                f"since tdyn wrote it (a flipped digit, an edit); restore it, or train the run again "
                                f"with --force")
    _field(path, meta, "status", str, f"one of {', '.join(STATUSES)}")
    if meta["status"] not in STATUSES:
        raise CorruptFile(path, f"has status {meta['status']!r}, not one of {', '.join(STATUSES)}")
    _field(path, meta, "seed", int, "a whole number")
    return meta



def read_ensemble(out: str | Path) -> dict:
    """A job's ``ensemble.json``, checked: ``config`` (an object), ``members`` and ``dirs`` (lists of names,
    as many of each). :func:`ensemble_dirs` checks where the directories lie."""
    path = Path(out) / ENSEMBLE
    ens = _object(path, "an ensemble manifest")
    _field(path, ens, "config", dict, "a run config (a JSON object)")
    for key in ("members", "dirs"):
        v = _field(path, ens, key, list, "a list of names")
        if not all(isinstance(x, str) and x for x in v):
            raise CorruptFile(path, f"has {key!r} = {_short(v)}, not a list of names")
    if len(ens["members"]) != len(ens["dirs"]):
        raise CorruptFile(path, f"lists {len(ens['members'])} members but {len(ens['dirs'])} directories")
    ids = ens.get("identities")
    if ids is not None and (not isinstance(ids, list) or len(ids) != len(ens["dirs"])
                            or not all(isinstance(x, str) for x in ids)):
        raise CorruptFile(path, f"has 'identities' = {_short(ids)}, not one run identity per directory")
    return ens


def ensemble_dirs(out: str | Path) -> list[Path]:
    """The member directories ``ensemble.json`` in ``out`` lists, each checked to lie inside ``out`` (or,
    for a sweep's job manifest ``SWEEP_DIR/.jobs/<job>``, inside the sweep directory): a manifest
    naming ``../elsewhere`` is refused, so resume never writes outside the job."""
    out = Path(out)
    root = out.parent.parent if out.parent.name == ".jobs" else out
    dirs = []
    ens = read_ensemble(out)
    for p in ens["dirs"]:
        d = out / p
        if not d.resolve().is_relative_to(root.resolve()) or d.resolve() == root.resolve():
            raise UserError(f"{str(out / ENSEMBLE)!r}: member directory {p!r} lies outside {str(root)!r}")
        dirs.append(d)
    for d, ident in zip(dirs, ens.get("identities") or [None] * len(dirs)):
        if is_run_dir(d):   # each member directory holds the run the manifest put there
            check_run(d, ident, out / ENSEMBLE)
    return dirs


def read_sweep(out: str | Path) -> dict:
    """A sweep's ``sweep.json``, checked: ``spec`` (an object) and ``runs``, each with a ``name`` (one
    path component: a directory of the sweep), a ``status`` and its ``axes``."""
    path = Path(out) / SWEEP
    sw = _object(path, "a sweep record")
    _field(path, sw, "spec", dict, "a sweep spec (a JSON object)")
    for i, r in enumerate(_field(path, sw, "runs", list, "a list of runs")):
        if not isinstance(r, dict):
            raise CorruptFile(path, f"has runs[{i}] = {_short(r)}, not a run record")
        name = _field(path, r, "name", str, "a run name")
        if name in ("", ".", "..") or Path(name).name != name or "\\" in name or "\0" in name:
            raise CorruptFile(path, f"has run name {name!r}, not a directory name inside the sweep")
        _field(path, r, "status", str, "a status")
        _field(path, r, "axes", dict, "the run's axes (a JSON object)")
        if r.get(IDENTITY) is not None and not isinstance(r[IDENTITY], str):
            raise CorruptFile(path, f"has runs[{i}].{IDENTITY} = {_short(r[IDENTITY])}, not a run identity")
    return sw


def sweep_dirs(out: Path) -> list[Path]:
    """A sweep's run directories, each checked to hold the run ``sweep.json`` expects there (a run of
    another cell or another sweep is a ForeignFile naming both); a run recorded with a result whose
    directory is gone is named (a CorruptFile), never left out."""
    out = Path(out)
    sw = read_sweep(out)
    owner = {r[IDENTITY]: r["name"] for r in sw["runs"] if r.get(IDENTITY)}
    dirs = []
    for r in sw["runs"]:
        d = out / r["name"]
        if not is_run_dir(d):
            if r["status"] in DONE:
                raise CorruptFile(d, f"is missing (or not a run directory), but {SWEEP} records run {r['name']!r} "
                                     f"as {r['status']}")
            continue
        try:
            check_run(d, r.get(IDENTITY), out / SWEEP)
        except ForeignFile as e:
            found = run_identity(d) if e.path == d else None
            if found in owner:   # a run of this sweep in another's place: say whose
                raise ForeignFile(d, f"holds run {owner[found]!r} of this sweep ({found}), not run {r['name']!r} "
                                     f"({r[IDENTITY]}) as {SWEEP} records: run directories swapped or copied") from None
            raise
        dirs.append(d)
    return dirs


def job_dirs(out: str | Path) -> list[Path]:
    """The run directories of a job (``ensemble.json``: every member it lists, one missing is a
    :class:`CorruptFile` naming it), a sweep (``sweep.json``), or ``out`` itself."""
    out = Path(out)
    if (out / SWEEP).exists():
        return sweep_dirs(out)
    if (out / ENSEMBLE).exists():
        dirs = ensemble_dirs(out)
        for d, member in zip(dirs, read_ensemble(out)["members"]):
            if not is_run_dir(d):   # named, never left out: a report of the others would pass for the job's
                raise CorruptFile(d, f"is missing (or not a run directory), but {ENSEMBLE} in {str(out)!r} lists it "
                                     f"as member {member!r}: restore it, or train the job again with --force")
        return dirs
    return [out] if is_run_dir(out) else []


def check_identity(path: Path, meta: dict[str, str], run_dir: Path, identity: str | None | object = _LOOKUP) -> None:
    """Checkpoint ``path`` (its metadata ``meta``) was written by the run in ``run_dir``, whose identity is
    ``identity`` (by default read from the run: :func:`run_identity`)."""
    if identity is _LOOKUP:
        if not is_run_dir(run_dir):   # checkpoints outside a run directory: no run to compare with
            return
        identity = run_identity(run_dir)
    check(path, meta.get(IDENTITY), identity, run_dir)


def load_checkpoint(run_dir: Path, step: int | str = "final",
                    identity: str | None | object = _LOOKUP) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint ``step`` (or ``"final"``), verified (:func:`read_checkpoint`) and checked
    to be the run's own (:func:`check_identity`; ``identity``: the run's, when the caller has read it)."""
    path = checkpoint_path(run_dir, step)
    if not path.exists():
        raise UserError(f"no checkpoint {path.name} in {run_dir}")
    tensors, meta = read_checkpoint(path)
    if step != "final" and meta.get("step") != str(int(step)):
        raise CorruptFile(path, f"holds step {_short(meta.get('step'))}, not {int(step)} as its name says")
    check_identity(path, meta, run_dir, identity)
    if step == "final":
        check_final_step(path, meta, run_dir)
    return tensors


def check_final_step(path: Path, meta: dict[str, str], run_dir: Path, steps: int | None = None) -> None:
    """The final checkpoint ``path`` (its metadata ``meta``) of a finished run holds the step the run finished
    at, its config's ``optim.steps`` (resume's rule, ``tdyn.train.trainer.check_done``): an older checkpoint
    copied over ``final.safetensors`` is a :class:`CorruptFile`, never the run's result. A run that has not
    finished (running, interrupted, diverged) is not checked: its final state is whatever step it reached.
    ``steps``: the caller knows the run finished and its steps (resume's check), nothing is read again."""
    run_dir = Path(run_dir)
    if steps is None:
        if not is_run_dir(run_dir) or read_meta(run_dir)["status"] != "finished":
            return
        steps = load_run_config(run_dir).optim.steps
    T = steps
    if meta.get("step") != str(T):
        raise CorruptFile(path, f"holds step {_short(meta.get('step'))}, but {CONFIG} trains {T} steps and "
                                f"{META} says the run finished: not the run's final state")
