"""What tdyn owns, checked file by file: ``--force`` deletes or overwrites only a directory tdyn wrote
(:func:`is_tdyn_dir`) whose every entry is tdyn's (:func:`foreign_entry`), never a user's file — inside
tdyn's own trees (checkpoints/, .jobs/, a sink's or the report's folder) too, each checked by its rule
(:data:`TREE_RULES`: names and contents).
:func:`prepare_dir` makes an output directory ready (refusing, clearing, locking). The file names of
runs are known here; what a layer above writes into these directories (a sink's directory, a report
page) it declares with :func:`own`, at import time of the module that writes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Iterable, Mapping

from tdyn.errors import UserError
from tdyn.runs.atomic import _TEMP_RE
from tdyn.runs.checkpoints import _STEP_RE
from tdyn.runs.locks import Locks, held_lock_files
from tdyn.runs.io import write_json
from tdyn.runs.names import (CKPT_DIR, CONFIG, ENSEMBLE, FINAL, JOBS, LOCK, MARKERS, META, METRICS, REPRODUCE,
                             REPRODUCING, RESULTS, RUNS, SUMMARY, SWEEP, WRITTEN)
from tdyn.runs.records import is_run_dir, read_manifest


def is_tdyn_dir(path: Path) -> bool:
    """Whether ``path`` is a directory tdyn wrote: a run (config + meta), a job (ensemble.json), a sweep
    (sweep.json), a reproduction (results.json, or .reproducing.json while it runs) or a ``reproduce --all``
    directory (reproduce.json), or a reproduction stopped before its results.json by an older tdyn: a
    ``runs/`` with nothing in or beside it that tdyn did not write (:func:`foreign_entry`)."""
    path = Path(path)
    return (is_run_dir(path) or any(_is_marker(path / m) for m in MARKERS)
            or ((path / RUNS).is_dir() and foreign_entry(path) is None))


_MARKER_KEYS = {RESULTS: "experiment", REPRODUCE: "reproductions", REPRODUCING: "experiment"}   # a file of the user's so named is not tdyn's


def reproduction_of(path: Path) -> str | None:
    """The experiment whose reproduction ``path`` holds: named by its results.json, or by its
    .reproducing.json where it stopped before one; None where neither is tdyn's."""
    for name in (RESULTS, REPRODUCING):
        if _is_marker(Path(path) / name):
            return str(json.loads((Path(path) / name).read_bytes())["experiment"])
    return None


def _is_marker(p: Path) -> bool:
    """Whether ``p`` (one of :data:`MARKERS`) is tdyn's: it exists and, for a results.json or reproduce.json,
    holds a JSON object with tdyn's key (``experiment``, ``reproductions``)."""
    if not p.is_file():
        return False
    key = _MARKER_KEYS.get(p.name)
    if key is None:
        return True
    try:
        obj = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and key in obj


OWN_FILES = {CONFIG, META, METRICS, ENSEMBLE, SWEEP, SUMMARY, LOCK, WRITTEN}   # and markers, checked; what own() adds
OS_LITTER = {".DS_Store", "Thumbs.db", "desktop.ini", ".ipynb_checkpoints"}          # a file browser's or Jupyter's
_REPRODUCTION_SUFFIXES = (".csv", ".png", ".json")                                  # a reproduction's tables and figures


# ---------------------------------------------------------------- what tdyn's trees hold, entry by entry
#
# A tree (a directory tdyn or a library it drives fills: checkpoints/, .jobs/, tensorboard/, wandb/,
# report_files/, .submitit/) is never taken whole: its rule (:data:`TREE_RULES`) names the first entry in
# it that tdyn did not write, by the names and contents tdyn (or TensorBoard, wandb, submitit, as tdyn calls
# them) gives its files. Everywhere in a tree: a symlink is foreign unless the rule names it (wandb's and
# submitit's own links), a directory the rule does not know is foreign unless empty (it holds nothing to
# lose), and so is any file the rule does not know (a file browser's litter, :data:`OS_LITTER`, excepted).
# The rules are written out in docs/reliability.md ("What --force deletes").

def _listing(d: Path) -> list[Path]:
    """``d``'s entries, sorted; a directory tdyn cannot read (permissions, I/O) is a one-line UserError naming
    it: what cannot be checked is never deleted."""
    try:
        return sorted(Path(d).iterdir())
    except OSError as e:
        raise UserError(f"cannot read the directory {str(d)!r} ({e.strerror or type(e).__name__}): tdyn deletes or "
                        f"writes over only what it has checked; fix its permissions, or choose another --out") from None


Rule = Callable[[Path], "Path | None"]   # a tree's root → the first entry below it that is not tdyn's, or None


def _walk(tree: Path, file_ok: Callable[[Path], bool], dirs: Callable[[Path], "Rule | None"] = lambda p: None,
          link_ok: Callable[[Path], bool] = lambda p: False) -> Path | None:
    """The first entry of ``tree`` that is not tdyn's: a file ``file_ok`` refuses, a non-empty directory for
    which ``dirs`` gives no rule (or whose rule names an entry), a symlink ``link_ok`` refuses."""
    for p in _listing(tree):
        if p.is_symlink():
            if not link_ok(p):
                return p
        elif p.is_dir():
            if not _entries(p):
                continue
            rule = dirs(p)
            inner = p if rule is None else rule(p)
            if inner is not None:
                return inner
        elif not (p.name in OS_LITTER or file_ok(p)):
            return p
    return None


def _whole(tree: Path) -> None:
    """A library's folder whose layout changes from version to version, inside a folder proven the
    library's (a wandb run's files/ and tmp/): what it holds is the library's."""
    return None


def _head(p: Path, n: int) -> bytes | None:
    """The first ``n`` bytes of file ``p`` (fewer if shorter), or None where it cannot be read."""
    try:
        with open(p, "rb") as f:
            return f.read(n)
    except OSError:
        return None


_CKPT_KEYS = ("param/", "buffer/", "optim/", "rng/", "probe/")   # a checkpoint's tensor names (the trainer's member state)
_CKPT_TEMP_RE = re.compile(r"^\.(?:step-\d+\.safetensors|" + re.escape(FINAL) + r")\.tdyn-.+\.tmp$")
_MAX_HEADER = 100 * 2**20                                          # safetensors' own limit on a header


def _is_checkpoint(p: Path) -> bool:
    """A checkpoint file of tdyn's by name (``step-N.safetensors``, ``final.safetensors``) and content: empty
    (nothing to lose), or safetensors framing (a header length within the file, a header that begins
    ``{``) whose header, where it parses, names only tdyn's tensors (:data:`_CKPT_KEYS`; a model from
    elsewhere saved under tdyn's name does not). A header that is framed but does not parse is a damaged
    checkpoint of tdyn's, which a resume says to replace with --force."""
    if not (_STEP_RE.fullmatch(p.name) or p.name == FINAL):
        return False
    try:
        size = p.stat().st_size
    except OSError:
        return False
    if size == 0:
        return True
    head = _head(p, 8)
    if head is None or len(head) < 8:
        return False
    n = int.from_bytes(head, "little")
    if not 2 <= n <= min(size - 8, _MAX_HEADER):
        return False
    text = (_head(p, 8 + n) or b"")[8:]
    if not text.startswith(b"{"):
        return False
    try:
        header = json.loads(text)
    except ValueError:
        return True
    keys = [k for k in header if k != "__metadata__"] if isinstance(header, dict) else []
    return bool(keys) and all(isinstance(k, str) and k.startswith(_CKPT_KEYS) for k in keys)


def _checkpoints(tree: Path) -> Path | None:
    """checkpoints/: tdyn's checkpoint files (:func:`_is_checkpoint`) and the temp files of their atomic writes."""
    return _walk(tree, lambda p: _is_checkpoint(p) or bool(_CKPT_TEMP_RE.match(p.name)))


_JOB_RE = re.compile(r"^job\d{4,}$")                               # a sweep's job ids (sweep.spec.plan)
_ENSEMBLE_TEMP_RE = re.compile(r"^\." + re.escape(ENSEMBLE) + r"\.tdyn-.+\.tmp$")


def _json_object_with(p: Path, keys: set[str]) -> bool:
    """``p`` is empty, or a JSON object holding ``keys``."""
    try:
        data = p.read_bytes()
        return not data or (isinstance(obj := json.loads(data), dict) and keys <= set(obj))
    except (OSError, ValueError):
        return False


def _job(tree: Path) -> Path | None:
    """One sweep job's directory: its manifest (an ensemble.json holding config, members and dirs), the temp
    file of its atomic write, its lock."""
    return _walk(tree, lambda p: ((p.name == ENSEMBLE and _json_object_with(p, {"config", "members", "dirs"}))
                                  or p.name == LOCK or bool(_ENSEMBLE_TEMP_RE.match(p.name))))


def _jobs(tree: Path) -> Path | None:
    """.jobs/: one directory per sweep job (``jobNNNN``, :func:`_job`), nothing else."""
    return _walk(tree, lambda p: False, lambda p: _job if _JOB_RE.match(p.name) else None)


_TFEVENTS_RE = re.compile(r"^events\.out\.tfevents\.\d+\..+$")


def _is_tfevents(p: Path) -> bool:
    """A TensorBoard event file: its name, and empty (nothing to lose) or a first TFRecord (length, CRC,
    payload) whose payload is TensorBoard's file-version event (``brain.Event:``)."""
    if not _TFEVENTS_RE.match(p.name):
        return False
    head = _head(p, 12)
    if head == b"":
        return True
    if head is None or len(head) < 12:
        return False
    n = int.from_bytes(head[:8], "little")
    return n <= 2**16 and b"brain.Event:" in (_head(p, 12 + n) or b"")[12:]


def _tensorboard(tree: Path) -> Path | None:
    """tensorboard/: the event files of TensorBoard's SummaryWriter (flat: tdyn's sink writes scalars only)."""
    return _walk(tree, _is_tfevents)


_WANDB_RUN_RE = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-([a-z0-9]+)$")
_WANDB_LINKS = {"latest-run", "debug.log", "debug-internal.log"}
_WANDB_LOG_RE = re.compile(r"^debug[\w.-]*\.log$")
_WANDB_MAGIC = b":W&B"                                            # the head of wandb's transaction log (run-<id>.wandb)


def _link_within(p: Path, tree: Path) -> bool:
    """Symlink ``p`` points inside ``tree`` (deleting a link never touches its target; this only keeps a
    user's link, to anywhere, from counting as a library's)."""
    try:
        target = os.readlink(p)
    except OSError:
        return False
    full = os.path.normpath(os.path.join(os.path.abspath(p.parent), target))
    root = os.path.normpath(os.path.abspath(tree))
    return full.startswith(root + os.sep)


def _wandb_run(tree: Path) -> Path | None:
    """A wandb run's folder (``[offline-]run-<time>-<id>``): wandb's only where it holds its transaction log
    ``run-<id>.wandb`` (beginning with wandb's magic); then that log, its ``.synced`` marker, ``logs/``
    (wandb's ``debug*.log`` files, and its link ``debug-core.log`` to wandb-core's log) and ``files/`` and ``tmp/`` (what wandb keeps for a run, its layout
    changing between versions: taken as wandb's once the folder is proven wandb's), nothing else."""
    rid = _WANDB_RUN_RE.match(tree.name).group(1)
    log_file = tree / f"run-{rid}.wandb"
    if log_file.is_symlink() or not log_file.is_file() or _head(log_file, 4) != _WANDB_MAGIC:
        return log_file if log_file.exists() or log_file.is_symlink() else tree
    logs = lambda d: _walk(d, lambda p: bool(_WANDB_LOG_RE.match(p.name)),  # noqa: E731
                           link_ok=lambda p: p.name == "debug-core.log")   # a link to wandb-core's log in its cache
    return _walk(tree, lambda p: p.name in (log_file.name, log_file.name + ".synced"),
                 lambda d: {"files": _whole, "tmp": _whole, "logs": logs}.get(d.name))


def _wandb(tree: Path) -> Path | None:
    """wandb/: wandb's run folders (:func:`_wandb_run`) and its links to the latest one (``latest-run``,
    ``debug.log``, ``debug-internal.log``, pointing inside wandb/)."""
    return _walk(tree, lambda p: False, lambda d: _wandb_run if _WANDB_RUN_RE.match(d.name) else None,
                 lambda p: p.name in _WANDB_LINKS and _link_within(p, tree))


_PNG = b"\x89PNG\r\n\x1a\n"
_FIGURE_RE = re.compile(r"^(?:curves|heatmap)_[\w.-]+\.png$")


def _is_png(p: Path) -> bool:
    return p.suffix == ".png" and _head(p, 8) in (b"", _PNG)


def _evidence_copy(tree: Path) -> Path | None:
    """A copy of an evidence directory's tables, figures and results (.csv, .png as PNG, .json)."""
    return _walk(tree, lambda p: _is_png(p) or p.suffix in (".csv", ".json"))


def _report_files(tree: Path) -> Path | None:
    """report_files/: the report's figures (``curves_*.png``, ``heatmap_*.png``, PNG inside) and its copies
    of the evidence (``evidence/<dir>/``, :func:`_evidence_copy`)."""
    return _walk(tree, lambda p: bool(_FIGURE_RE.match(p.name)) and _is_png(p),
                 lambda d: (lambda e: _walk(e, lambda p: False, lambda x: _evidence_copy)) if d.name == "evidence" else None)


_SUBMITIT_JOB = r"\d+(?:_\d+)?"                                   # a Slurm job id (array: <job>_<index>); local: a pid
_SUBMITIT_RE = re.compile(rf"^(?:{_SUBMITIT_JOB}_(?:submitted\.pkl|submission\.sh|\d+_(?:result\.pkl|log\.out|log\.err))"
                          r"|[0-9a-f]{32}\.pkl|\.submission_file_[0-9a-f]{32}\.sh)$")
_SUBMITIT_LINK_RE = re.compile(r"^\.submission_file_[0-9a-f]{32}\.sh$")


def _submitit_link(p: Path) -> bool:
    """submitit's link from a submission script's temporary name to ``<job>_submission.sh`` beside it."""
    try:
        target = os.path.normpath(os.path.join(os.path.abspath(p.parent), os.readlink(p)))
    except OSError:
        return False
    return (bool(_SUBMITIT_LINK_RE.match(p.name)) and os.path.dirname(target) == os.path.normpath(os.path.abspath(p.parent))
            and re.fullmatch(rf"{_SUBMITIT_JOB}_submission\.sh", os.path.basename(target)) is not None)


def _submitit(tree: Path) -> Path | None:
    """.submitit/: submitit's files for each job (``<job>_submitted.pkl``, ``<job>_submission.sh``,
    ``<job>_<task>_result.pkl``, ``<job>_<task>_log.out|err``), its pickles and submission scripts before
    the job has an id (``<uuid>.pkl``, ``.submission_file_<uuid>.sh``, kept as a link once moved)."""
    return _walk(tree, lambda p: bool(_SUBMITIT_RE.match(p.name)), link_ok=_submitit_link)


#: Each tree's rule, by its name: runs' own trees, and the formats of what layers above write (the sinks'
#: tensorboard/ and wandb/, declared by runs.own; the report's report_files/ and a slurm sweep's .submitit/,
#: recorded where they are written by runs.record). A layer may give its own: ``own(trees={name: rule})``.
TREE_RULES: dict[str, Rule] = {CKPT_DIR: _checkpoints, JOBS: _jobs, "tensorboard": _tensorboard, "wandb": _wandb,
                               "report_files": _report_files, ".submitit": _submitit}
OWN_TREES = {CKPT_DIR, JOBS}          # trees checked by their rule in every tdyn directory; and what own() adds


def own(files: Iterable[str] = (), trees: Iterable[str] | Mapping[str, Rule] = ()) -> None:
    """Declare what a layer above writes into tdyn's directories, for ``--force`` to count as tdyn's:
    ``files`` (file names) and ``trees`` (directories), each tree checked entry by entry by its rule: a
    name of :data:`TREE_RULES`, or ``{name: rule}`` (``rule(tree)`` → the first entry below ``tree`` that
    is not tdyn's, or None). Called at import time of the module that writes them, e.g.
    ``runs.own(trees=("tensorboard", "wandb"))`` in ``train/sinks.py``."""
    rules = dict(trees) if isinstance(trees, Mapping) else {t: TREE_RULES.get(t) for t in trees}
    for name in [*files, *rules]:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"runs.own: {name!r} is not a file or directory name")
    for name, rule in rules.items():
        if not callable(rule):
            raise ValueError(f"runs.own: no rule for what {name!r} holds: pass trees={{{name!r}: rule}}, "
                             f"rule(tree) naming the first entry below tree that is not tdyn's")
    OWN_FILES.update(files)
    TREE_RULES.update(rules)
    OWN_TREES.update(rules)


def record(directory: Path, *names: str) -> None:
    """Note in ``directory``'s :data:`WRITTEN` that tdyn wrote its entries ``names`` from a layer above runs
    (the report's page and its figures folder, a sweep's submitit folder): ``--force`` then counts them
    as tdyn's in that directory, and nowhere else: a file whole, a directory entry by entry by its rule in
    :data:`TREE_RULES` (a recorded directory without one is tdyn's only while empty)."""
    have = written(directory)
    if set(names) - have:
        write_json(Path(directory) / WRITTEN, sorted(have | set(names)))


def written(directory: Path) -> set[str]:
    """The entries recorded in ``directory``'s :data:`WRITTEN` (plain names only; none if unreadable)."""
    try:
        names = json.loads((Path(directory) / WRITTEN).read_bytes())
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str) and n not in ("", ".", "..") and "/" not in n
            and "\\" not in n} if isinstance(names, list) else set()


def foreign_entry(path: Path, reproduction: bool = False) -> Path | None:
    """The first entry below ``path`` that tdyn did not write, or None: what ``--force`` would otherwise
    delete. tdyn's are its file names (:data:`OWN_FILES`; results.json, reproduce.json and
    .reproducing.json only with tdyn's content), its trees (:data:`OWN_TREES`, and the directories recorded
    in its :data:`WRITTEN`) holding only what their rules (:data:`TREE_RULES`) recognise by name and
    content, its temp files, empty directories, a file browser's litter (:data:`OS_LITTER`), a
    reproduction's tables and figures (files beside its results.json, .reproducing.json or runs/; the
    subdirectories a ``reproduce --all`` manifest names are reproductions; ``reproduction``: ``path`` is
    one), and directories tdyn wrote (:func:`is_tdyn_dir`, and a reproduction's ``runs/``) whose own
    entries are all tdyn's. A symlink is never tdyn's, but where a tree's rule names it."""
    path = Path(path)
    reproduction = (reproduction or _is_marker(path / RESULTS) or _is_marker(path / REPRODUCING)
                    or (path / RUNS).is_dir())
    named: set[str] = set()
    if _is_marker(path / REPRODUCE):
        try:
            named = {e["dir"] for e in read_manifest(path / REPRODUCE)["reproductions"]}
        except UserError:
            pass
    recorded = written(path)
    for p in _listing(path):
        if p.is_symlink():
            return p
        if p.name in OS_LITTER:
            continue
        if p.is_dir():
            if not _entries(p):
                continue
            if p.name in OWN_TREES or p.name in recorded:
                inner = TREE_RULES[p.name](p) if p.name in TREE_RULES else p
                if inner is not None:
                    return inner
                continue
            if not (p.name in named or (p.name == RUNS and reproduction) or is_tdyn_dir(p)):
                return p
            inner = foreign_entry(p, reproduction=p.name in named)
            if inner is not None:
                return inner
        elif p.name in _MARKER_KEYS:
            if not _is_marker(p):
                return p
        elif not (p.name in OWN_FILES or p.name in recorded or _TEMP_RE.match(p.name)
                  or (reproduction and p.suffix in _REPRODUCTION_SUFFIXES)):
            return p
    return None


def _entries(out: Path) -> list[Path]:
    """What ``out`` holds besides a lock file (a directory holding only one counts as empty)."""
    return [p for p in _listing(out) if p.name != LOCK] if out.is_dir() else []


def leftover(out: Path, trees: Iterable[str] = ()) -> Path | None:
    """For a writer that starts ``out`` afresh: the first entry that makes it not empty — anything but its
    lock file and, of ``trees`` (names of :data:`TREE_RULES`, e.g. a sweep's ``.jobs``), those whose every
    entry is tdyn's by their rule — or None. ``out`` a file is a UserError."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    for p in _entries(out):
        if not (p.name in trees and p.is_dir() and not p.is_symlink() and TREE_RULES[p.name](p) is None):
            return p
    return None


def _check_out(out: Path, force: bool, hint: str, flag: str = "--force") -> None:
    first = leftover(out)
    if first is not None:
        if not force:
            raise UserError(f"output directory {str(out)!r} already exists and is not empty; "
                            f"use --force to overwrite{hint}")
        if not is_tdyn_dir(out):
            raise UserError(f"{flag}: {str(out)!r} is not a tdyn output directory (it holds {first.name!r}, and no "
                            f"{CONFIG}/{META}, {', '.join(MARKERS)}); tdyn deletes only its own outputs — "
                            f"choose another --out")


def prepare_dir(out: Path, force: bool, *, clear: bool = False, hint: str = "", locks: "Locks | None" = None,
                flag: str = "--force") -> Path:
    """Create ``out`` for writing. A non-empty ``out`` is a UserError unless ``force``; then with
    ``clear`` its contents are removed first (a run directory), else its files get overwritten (a
    reproduction directory). ``force`` applies only to a directory tdyn wrote (:func:`is_tdyn_dir`):
    anything else is refused, so ``--force`` never deletes or overwrites a user's files.
    ``hint`` is appended to the error (e.g. "or --resume to continue it"); ``flag`` names the option that
    allowed a non-empty ``out`` (``--force``, or ``--resume``).

    With ``locks``, ``out``'s lock is taken (a directory another process writes is refused naming it,
    before anything else is said about it) and kept in ``locks``; clearing then spares the lock files
    this process holds and stops at a directory below ``out`` that another process writes."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    if locks is not None and (out / LOCK).exists():
        locks.acquire(out)
    _check_out(out, force, hint, flag)
    if locks is not None and not locks.holds(out):
        locks.acquire(out)
        _check_out(out, force, hint, flag)     # again: written by someone else between the check and the lock?
    if clear and _entries(out):
        clear_own(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def clear_own(out: Path, reproduction: bool = False) -> None:
    """Delete ``out``'s contents, all of which tdyn wrote (:func:`check_own`; ``reproduction``: ``out`` is
    one, e.g. a subdirectory a ``reproduce --all`` manifest names), sparing the locks this process holds."""
    check_own(out, reproduction)
    _clear(out)


def check_own(out: Path, reproduction: bool = False) -> None:
    """Before ``--force`` deletes ``out``'s contents: a UserError naming the first entry tdyn did not write."""
    bad = foreign_entry(out, reproduction)
    if bad is not None:
        raise UserError(f"--force: {str(out)!r} holds {str(bad.relative_to(out))!r}, which tdyn did not write; "
                        f"tdyn deletes only its own outputs — move it, or choose another --out")


def _clear(out: Path) -> None:
    """Remove ``out``'s contents except the lock files this process holds. A directory below ``out``
    that another process is writing (its lock held) stops the clear with that process named."""
    inner = sorted({p.parent for p in Path(out).rglob(LOCK)} - {Path(out)})
    with Locks() as below:
        for d in inner:
            below.acquire(d)
        _remove_contents(Path(os.path.realpath(out)), held_lock_files())
    for d in sorted(inner, key=lambda p: len(p.parts), reverse=True):
        while d != Path(out):  # emptied: its lock file went with the release; and the folders it was in (.jobs/)
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent


def _remove_contents(root: Path, keep: set[str]) -> None:
    for p in _listing(root):
        if str(p) in keep:
            continue
        if p.is_dir() and not p.is_symlink():
            if any(k.startswith(str(p) + os.sep) for k in keep):
                _remove_contents(p, keep)
            else:
                shutil.rmtree(p)
        else:
            p.unlink()
