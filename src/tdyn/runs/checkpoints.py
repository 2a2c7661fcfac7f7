"""Checkpoints: safetensors files (no pickle) in ``checkpoints/``, by step.

A checkpoint at step t holds the state *before* step t's update (as the Scan and Snap authors'
``iter-t.pth``), the optimizer state and the data RNG state; ``final.safetensors`` holds the state after
the last update. Each carries the SHA-256 of its tensors in its metadata (:func:`tensor_checksum`),
verified whenever it is read, and the identity of the run that wrote it (``identity``,
:mod:`tdyn.runs.identity`), compared with the reading run's; its bytes are the same in every process (the
header's keys sorted).
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
import struct
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors, save

from tdyn.errors import UserError
from tdyn.runs.atomic import atomic_write_bytes
from tdyn.runs.io import CorruptFile, _os_error, _read_bytes
from tdyn.runs.names import CHECKSUM, CKPT_DIR, FINAL

_STEP_RE = re.compile(r"step-(\d+)\.safetensors$")


def _ckpt_name(step: int | str) -> str:
    """A checkpoint's file name: ``final`` or a step number ≥ 0 (an int, or a string of digits); anything else
    (``'../x'``, ``-3``, ``5.5``, ``True``) is a one-line UserError naming it."""
    if step == "final":
        return FINAL
    try:
        n = int(step) if isinstance(step, str) and step.isdecimal() else operator.index(step)   # ints, numpy ints
    except TypeError:
        n = -1
    if isinstance(step, bool) or n < 0:
        raise UserError(f"checkpoint step {step!r}: allowed: 'final' or a step number >= 0")
    return f"step-{n:07d}.safetensors"


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a checkpoint's tensors in key order: for each, the line ``name dtype shape`` and then
    its bytes (native order). Stored in the checkpoint's metadata (``sha256``), checked on every read."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        h.update(f"{k} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def checkpoint_file(run_dir: Path, step: int | str, tensors: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> tuple[Path, bytes]:
    """A checkpoint's path and contents (for :func:`atomic_write_many`; :func:`save_checkpoint` writes one)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    return checkpoint_path(run_dir, step), _safetensors_bytes(
        tensors, dict(metadata or {}) | {CHECKSUM: tensor_checksum(tensors)})


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """``safetensors.torch.save`` with the header's metadata in key order: safetensors writes it from a
    Rust hash map, whose order changes from process to process, so the same checkpoint's bytes did too.
    The header is the same JSON with its keys reordered (same length, same padding), the data untouched."""
    data = save(tensors, metadata=metadata)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    fixed = {"__metadata__": dict(sorted(meta.items()))} | header if meta is not None else header
    text = json.dumps(fixed, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:      # never: the same keys and values, reordered
        raise RuntimeError("safetensors header grew when its metadata was sorted")
    return data[:8] + text + b" " * (n - len(text)) + data[8 + n:]


def save_checkpoint(run_dir: Path, step: int | str, tensors: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> Path:
    path, data = checkpoint_file(run_dir, step, tensors, metadata)
    atomic_write_bytes(path, data)
    return path


def checkpoint_steps(run_dir: Path) -> list[int]:
    d = Path(run_dir) / CKPT_DIR
    if not d.exists():
        return []
    return sorted(int(m.group(1)) for f in d.iterdir() if (m := _STEP_RE.fullmatch(f.name)))


def _unreadable(path: Path, e: Exception) -> CorruptFile:
    what = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
    return CorruptFile(path, f"is not a readable safetensors file ({what}): truncated or garbled")


def _header_metadata(data: bytes, size: int | None = None) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file from its first bytes (length prefix + JSON header).
    ``size``: the whole file's length, checked against the tensor bytes the header declares."""
    (n,) = struct.unpack("<Q", data[:8])
    if len(data) < 8 + n:
        raise ValueError("header cut short")
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise ValueError("bad __metadata__")
    if size is not None:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        if size < 8 + n + end:
            raise ValueError(f"{size} bytes, but its header declares {8 + n + end}")
    return meta


def _checksum_of(path: Path, meta: dict[str, str]) -> str:
    if CHECKSUM not in meta:
        raise CorruptFile(path, f"carries no checksum ({CHECKSUM!r} in its metadata): damaged, or written "
                                f"by a tdyn without checksums")
    return meta[CHECKSUM]


def read_checkpoint_metadata(path: Path) -> dict[str, str]:
    """A checkpoint file's metadata (its ``step``, ``sha256``, ...) from its header alone, checked as far as
    the header allows (a checksum is present, the file is as long as its header declares), but neither its
    tensors nor their checksum are read: for a run whose files were verified or written moments before
    (the sweep's check of a job's runs after training them). Every other read is :func:`read_checkpoint`."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
            meta = _header_metadata(head + f.read(min(n, size)), size)
    except OSError as e:
        raise _os_error(path, e) from None
    except Exception as e:   # struct / JSON errors of a damaged header, a file shorter than declared
        raise _unreadable(path, e) from None
    _checksum_of(path, meta)
    return meta


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A checkpoint file's tensors and metadata, its checksum verified: a truncated, garbled or
    bit-flipped file (or one without a checksum) is a :class:`CorruptFile`."""
    data = _read_bytes(path)
    try:
        tensors = load_safetensors(data)
        meta = _header_metadata(data)
    except Exception as e:   # safetensors' own error type, struct / JSON errors of a damaged header
        raise _unreadable(path, e) from None
    want = _checksum_of(path, meta)
    if tensor_checksum(tensors) != want:
        raise CorruptFile(path, "fails its checksum: its tensors are damaged (a flipped bit, a partial overwrite)")
    return tensors, meta


def checkpoint_path(run_dir: Path, step: int | str = "final") -> Path:
    return Path(run_dir) / CKPT_DIR / _ckpt_name(step)


def params_of(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model parameters stored in a checkpoint (keys without the ``param/`` prefix)."""
    return {k[len("param/"):]: v for k, v in ckpt.items() if k.startswith("param/")}
