"""Run directories: ``config.json``, ``meta.json``, ``metrics.jsonl``, ``checkpoints/*.safetensors``.

Every file is written atomically (temporary file in the same directory, fsync, rename), so a kill
never leaves a half-written file. Checkpoints are safetensors (no pickle); a checkpoint at step t
holds the state *before* step t's update (as the Scan and Snap authors' ``iter-t.pth``), the
optimizer state and the data RNG state; ``final.safetensors`` holds the state after the last update.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import datetime as _dt
import numpy as np
import platform
import subprocess
import torch
from safetensors.torch import load_file, save

from tdyn.config import validate_config
from tdyn.errors import UserError
from tdyn.tasks import Member, build_task

# ---------------------------------------------------------------- file names (defined here only)

CONFIG = "config.json"          # a run's resolved config (trains that member alone)
META = "meta.json"              # versions, seed, times, status
METRICS = "metrics.jsonl"       # one record per evaluation
CKPT_DIR = "checkpoints"        # step-XXXXXXX.safetensors and final.safetensors
FINAL = "final.safetensors"
ENSEMBLE = "ensemble.json"      # a job's manifest: config, members, member directories
SWEEP = "sweep.json"            # a sweep's spec and every run's status
SUMMARY = "summary.csv"         # a sweep's per-cell summary
RESULTS = "results.json"        # a reproduction's claims and numbers
REPRODUCE = "reproduce.json"    # a `reproduce --all` directory's options, metadata, each reproduction's status

_STEP_RE = re.compile(r"step-(\d+)\.safetensors$")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()   # what open() would give a new file: 0644 under umask 022


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temp file in the same directory, fsync, rename), readable
    as the umask allows (``mkstemp`` alone would leave it 0600, unreadable by colleagues)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_csv(path: str | Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    """Write ``rows`` with exactly ``columns`` (atomically)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r[c] for c in columns})
    atomic_write_text(Path(path), buf.getvalue())
    return Path(path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def write_metrics(run_dir: Path, records: list[dict]) -> None:
    atomic_write_text(Path(run_dir) / METRICS,
                      "".join(json.dumps(r, allow_nan=False) + "\n" for r in records))


def read_metrics(run_dir: Path) -> list[dict]:
    p = Path(run_dir) / METRICS
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def read_config(run_dir: Path) -> dict:
    return read_json(Path(run_dir) / CONFIG)


def read_meta(run_dir: Path) -> dict:
    return read_json(Path(run_dir) / META)


def _ckpt_name(step: int | str) -> str:
    return FINAL if step == "final" else f"step-{int(step):07d}.safetensors"


def save_checkpoint(run_dir: Path, step: int | str, tensors: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> Path:
    path = Path(run_dir) / CKPT_DIR / _ckpt_name(step)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, save(tensors, metadata=metadata))
    return path


def checkpoint_steps(run_dir: Path) -> list[int]:
    d = Path(run_dir) / CKPT_DIR
    if not d.exists():
        return []
    return sorted(int(m.group(1)) for f in d.iterdir() if (m := _STEP_RE.search(f.name)))


def load_checkpoint(run_dir: Path, step: int | str = "final") -> dict[str, torch.Tensor]:
    name = _ckpt_name(step)
    path = Path(run_dir) / CKPT_DIR / name
    if not path.exists():
        raise UserError(f"no checkpoint {name} in {run_dir}")
    return load_file(path)


def params_of(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model parameters stored in a checkpoint (keys without the ``param/`` prefix)."""
    return {k[len("param/"):]: v for k, v in ckpt.items() if k.startswith("param/")}


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).exists() and (Path(path) / META).exists()


def now() -> str:
    """UTC time stamp written into run and reproduction metadata."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict:
    """The machine and torch settings of this process (bench.json, report pages)."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available()}


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the tdyn checkout in use, or None outside a git checkout."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


MARKERS = (ENSEMBLE, SWEEP, RESULTS, REPRODUCE)   # besides CONFIG + META (a run): what makes a directory tdyn's


def is_tdyn_dir(path: Path) -> bool:
    """Whether ``path`` is a directory tdyn wrote: a run (config + meta), a job (ensemble.json), a sweep
    (sweep.json), a reproduction (results.json) or a ``reproduce --all`` directory (reproduce.json)."""
    path = Path(path)
    return is_run_dir(path) or any((path / m).exists() for m in MARKERS)


def prepare_dir(out: Path, force: bool, *, clear: bool = False, hint: str = "") -> Path:
    """Create ``out`` for writing. A non-empty ``out`` is a UserError unless ``force``; then with
    ``clear`` its contents are removed first (a run directory), else its files get overwritten (a
    reproduction directory). ``force`` applies only to a directory tdyn wrote (:func:`is_tdyn_dir`):
    anything else is refused, so ``--force`` never deletes or overwrites a user's files.
    ``hint`` is appended to the error (e.g. "or --resume to continue it")."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UserError(f"output directory {str(out)!r} already exists and is not empty; "
                            f"use --force to overwrite{hint}")
        if not is_tdyn_dir(out):
            first = sorted(p.name for p in out.iterdir())[0]
            raise UserError(f"--force: {str(out)!r} is not a tdyn output directory (it holds {first!r}, and no "
                            f"{CONFIG}/{META}, {', '.join(MARKERS)}); tdyn deletes only its own outputs — "
                            f"choose another --out")
        if clear:
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


# ---------------------------------------------------------------- reading a run directory


class Run:
    """One run directory, read: ``config``, ``meta``, ``metrics`` (records, or ``arrays()`` /
    ``frame()``), checkpoints by step, and the model rebuilt from a checkpoint.

    Everything that reads run directories (trainer resume, sweep, report, analyses) goes through
    this class or the functions above, so the format has one owner.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not is_run_dir(self.path):
            raise UserError(f"{str(self.path)!r} is not a run directory (no {CONFIG}/{META})")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @functools.cached_property
    def config(self) -> dict:
        return read_config(self.path)

    @property
    def meta(self) -> dict:  # not cached: the status changes while a run trains
        return read_meta(self.path)

    @property
    def status(self) -> str:
        return self.meta["status"]

    @property
    def seed(self) -> int:
        return self.meta["seed"]

    @property
    def lrs(self) -> dict[str, float]:
        """The learning rate of each parameter group."""
        return {g: v["lr"] for g, v in self.config["optim"]["groups"].items()}

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.path)

    def arrays(self, *keys: str) -> dict[str, "np.ndarray"]:
        """Metrics as arrays keyed by name (``step`` included); a record missing a key gives NaN."""
        recs = self.metrics
        keys = keys or tuple(dict.fromkeys(k for r in recs for k in r))
        return {k: np.array([r.get(k, np.nan) for r in recs], dtype=np.float64) for k in keys}

    def frame(self):
        """Metrics as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.metrics)

    @property
    def df(self):
        """The metrics, one row per evaluated step: a pandas DataFrame when pandas is installed, else
        ``arrays()`` (a dict of arrays, NaN where a step lacks a metric)."""
        try:
            import pandas  # noqa: F401
        except ImportError:
            return self.arrays()
        return self.frame()

    def steps(self) -> list[int]:
        """Steps with a checkpoint (the final state is ``checkpoint("final")``)."""
        return checkpoint_steps(self.path)

    def checkpoint(self, step: int | str = "final") -> dict[str, torch.Tensor]:
        return load_checkpoint(self.path, step)

    def params(self, step: int | str = "final") -> dict[str, torch.Tensor]:
        """This member's model parameters at ``step`` (no ensemble axis)."""
        return params_of(self.checkpoint(step))

    def param(self, name: str, step: int | str = "final") -> torch.Tensor:
        return self.params(step)[name]

    def probe(self, key: str, step: int | str = "final") -> torch.Tensor:
        """An array probe ``<probe>/<key>`` saved at ``step``."""
        return self.checkpoint(step)[f"probe/{key}"]

    def task(self):
        """The run's task built from its config (one member; no weights loaded)."""
        cfg = validate_config(self.config)
        lrs = {g: gc.lr for g, gc in cfg.optim.groups.items()}
        scale = (cfg.ensemble.init_scales or [1.0])[0]
        return build_task(cfg, [Member(cfg.seeds[0], lrs, scale, self.path.name)])

    def model(self, step: int | str = "final") -> torch.nn.Module:
        """The model rebuilt from its config (ensemble axis of size 1) with the weights of ``step``."""
        model = self.task().model
        ckpt = self.checkpoint(step)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(ckpt[f"param/{name}"].to(p.dtype).reshape(p.shape))  # the model's ensemble axis has size 1
            for name, b in model.named_buffers():
                if f"buffer/{name}" in ckpt:   # persistent buffers (running statistics)
                    b.copy_(ckpt[f"buffer/{name}"].to(b.dtype).reshape(b.shape))
        return model


def load_run(path: str | Path) -> Run:
    """The run in ``path``: a run directory, or a job / sweep directory that holds exactly one run
    (an ensemble of several: use :func:`load_sweep`, or ``load_run(path / member)``)."""
    path = Path(path)
    if is_run_dir(path):
        return Run(path)
    dirs = job_dirs(path)
    if len(dirs) != 1:
        raise UserError(f"{str(path)!r} holds {len(dirs)} runs, not one; use tdyn.load_sweep({str(path)!r}) "
                        f"or load_run on one of {', '.join(d.name for d in dirs[:4])}")
    return Run(dirs[0])


def load_sweep(path: str | Path):
    """Every run of a sweep, ensemble or run directory with its metrics in one long table: one row per
    (run, evaluated step) with columns ``run``, ``seed``, the sweep's axes (or the member's learning
    rates ``lr.<group>`` and ``init_scale``), ``status``, ``step`` and every metric. A pandas DataFrame
    when pandas is installed, else a dict of columns (numpy arrays; strings as object arrays)."""
    path = Path(path)
    dirs = job_dirs(path)
    if not dirs:
        raise UserError(f"{str(path)!r} holds no run directory")
    axes = {r["name"]: r.get("axes", {}) for r in read_json(path / SWEEP)["runs"]} if (path / SWEEP).exists() else {}
    rows = []
    for d in dirs:
        run = Run(d)
        meta = run.meta
        info = {"run": d.name if d != path else path.name, "seed": meta.get("seed")}
        info |= axes.get(d.name) or {f"lr.{g}": v for g, v in (meta.get("lrs") or {}).items()} | \
            {"init_scale": meta.get("init_scale")}
        info["status"] = meta.get("status")
        rows += [info | r for r in run.metrics]
    try:
        import pandas as pd
    except ImportError:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        cols = {}
        for k in keys:
            vals = [r.get(k) for r in rows]
            num = all(v is None or isinstance(v, (int, float)) for v in vals)
            cols[k] = (np.array([np.nan if v is None else v for v in vals], dtype=np.float64) if num
                       else np.array(vals, dtype=object))
        return cols
    return pd.DataFrame.from_records(rows)


def ensemble_dirs(out: str | Path) -> list[Path]:
    """The member directories ``ensemble.json`` in ``out`` lists, each checked to lie inside ``out`` (or,
    for a sweep's job manifest ``SWEEP_DIR/.jobs/<job>``, inside the sweep directory): a manifest
    naming ``../elsewhere`` is refused, so resume never writes outside the job."""
    out = Path(out)
    root = out.parent.parent if out.parent.name == ".jobs" else out
    dirs = []
    for p in read_json(out / ENSEMBLE).get("dirs", []):
        d = out / p
        if not isinstance(p, str) or not d.resolve().is_relative_to(root.resolve()) or d.resolve() == root.resolve():
            raise UserError(f"{str(out / ENSEMBLE)!r}: member directory {p!r} lies outside {str(root)!r}")
        dirs.append(d)
    return dirs


def job_dirs(out: str | Path) -> list[Path]:
    """The run directories of a job (``ensemble.json``), a sweep (``sweep.json``), or ``out`` itself."""
    out = Path(out)
    if (out / SWEEP).exists():
        return [out / r["name"] for r in read_json(out / SWEEP)["runs"] if is_run_dir(out / r["name"])]
    if (out / ENSEMBLE).exists():
        return [d for d in ensemble_dirs(out) if is_run_dir(d)]
    return [out] if is_run_dir(out) else []
