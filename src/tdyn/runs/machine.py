"""This process and machine: ``host``, ``pid@host`` (:func:`writer_tag`, what lock files and temp file
names record), whether a pid still runs, the time stamp, the machine's settings and the git commit
written into metadata. Small and separate so that the writers (atomic writes, locks) and the metadata
share one definition.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

from tdyn import native


def host() -> str:
    return socket.gethostname()


def writer_tag() -> str:
    """``pid@host`` of this process: what lock files and temp file names record."""
    return f"{os.getpid()}@{host()}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):   # no /proc here
        return True



def now() -> str:
    """UTC time stamp written into run and reproduction metadata."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict:
    """The machine and torch settings of this process (bench.json, report pages)."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), "native": native.status()}


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the tdyn checkout in use, or None outside a git checkout."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
