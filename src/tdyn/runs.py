"""Run directories: ``config.json``, ``meta.json``, ``metrics.jsonl``, ``checkpoints/*.safetensors``.

Every file is written atomically (temporary file in the same directory, fsync, rename), so a kill
never leaves a half-written file. Checkpoints are safetensors (no pickle); a checkpoint at step t
holds the state *before* step t's update (as the Scan and Snap authors' ``iter-t.pth``), the
optimizer state and the data RNG state; ``final.safetensors`` holds the state after the last update.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

CKPT_DIR = "checkpoints"
_STEP_RE = re.compile(r"step-(\d+)\.safetensors$")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def write_metrics(run_dir: Path, records: list[dict]) -> None:
    atomic_write_text(Path(run_dir) / "metrics.jsonl",
                      "".join(json.dumps(r, allow_nan=False) + "\n" for r in records))


def read_metrics(run_dir: Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def read_config(run_dir: Path) -> dict:
    return read_json(Path(run_dir) / "config.json")


def read_meta(run_dir: Path) -> dict:
    return read_json(Path(run_dir) / "meta.json")


def save_checkpoint(run_dir: Path, step: int | str, tensors: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> Path:
    name = "final.safetensors" if step == "final" else f"step-{int(step):07d}.safetensors"
    path = Path(run_dir) / CKPT_DIR / name
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, save(tensors, metadata=metadata))
    return path


def checkpoint_steps(run_dir: Path) -> list[int]:
    d = Path(run_dir) / CKPT_DIR
    if not d.exists():
        return []
    return sorted(int(m.group(1)) for f in d.iterdir() if (m := _STEP_RE.search(f.name)))


def load_checkpoint(run_dir: Path, step: int | str = "final") -> dict[str, torch.Tensor]:
    name = "final.safetensors" if step == "final" else f"step-{int(step):07d}.safetensors"
    path = Path(run_dir) / CKPT_DIR / name
    if not path.exists():
        from tdyn.errors import UserError

        raise UserError(f"no checkpoint {name} in {run_dir}")
    return load_file(path)


def params_of(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model parameters stored in a checkpoint (keys without the ``param/`` prefix)."""
    return {k[len("param/"):]: v for k, v in ckpt.items() if k.startswith("param/")}


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.json").exists() and (Path(path) / "meta.json").exists()


def now() -> str:
    """UTC time stamp written into run and reproduction metadata."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the tdyn checkout in use, or None outside a git checkout."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
