"""Intra-op thread count for training.

The models here are small: with 2 threads on a 2-core machine shared with any other job, a parallel
region waits for a descheduled thread and steps slow down up to 25× (Fig 6 quick panels: 1.0 s with
1 thread vs 25.7 s with 2, measured back to back). The CLI therefore trains with
``DEFAULT_THREADS`` = 1 unless ``tdyn --threads N`` or ``TDYN_THREADS`` says otherwise.
"""

from __future__ import annotations

import functools
import os

from tdyn.errors import UserError

DEFAULT_THREADS = 1

#: The most intra-op threads ``--threads`` / ``TDYN_THREADS`` accept. A fixed number, not a multiple of
#: this machine's cores: ``TDYN_THREADS`` travels to sweep workers on other hosts (Slurm, Ray) whose core
#: counts the driver does not know. 1024 is above the hardware threads of any single node tdyn trains on
#: and far below where OpenMP fails outright (libgomp segfaults at 100000 threads and refuses 20000 with
#: only its own line; 1024 runs, merely slowly on few cores).
MAX_THREADS = 1024


def check_threads(n: int, what: str | None = None) -> int:
    """``n`` if it is a usable thread count (1 to :data:`MAX_THREADS`), else a one-line :class:`UserError`
    naming ``what`` (default ``--threads N``)."""
    what = what or f"--threads {n}"
    if n < 1:
        raise UserError(f"{what}: must be at least 1")
    if n > MAX_THREADS:
        raise UserError(f"{what}: at most {MAX_THREADS} threads (this machine has {os.cpu_count() or 1} "
                        f"cores; more threads than cores only slows training)")
    return n


def cli_threads() -> int:
    """``$TDYN_THREADS`` (default 1): the threads the CLI and every sweep worker train with."""
    text = os.environ.get("TDYN_THREADS", str(DEFAULT_THREADS))
    if not text.strip().isdigit() or int(text) < 1:
        raise UserError(f"TDYN_THREADS={text!r}: must be a whole number of at least 1")
    return check_threads(int(text), f"TDYN_THREADS={text!r}")



_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_TUNED = False


def tune_allocator() -> bool:
    """Keep freed tensor memory in the process instead of handing it back to the OS every step.

    PyTorch's CPU allocator is glibc ``malloc``: a block above the mmap threshold (≤ 32 MB by default) is
    a fresh ``mmap`` and is unmapped on free, and freed heap tops are trimmed, so a training step that
    allocates the same tens of megabytes of activations and gradients each step page-faults them in
    again every step. Here ``mallopt`` turns mmap
    off for allocations (``M_MMAP_MAX`` = 0: every block of the main thread, which trains, comes from the
    heap, which still grows by mmap where it cannot grow in place; glibc's per-thread arenas still map
    blocks above 64 MB) and turns trimming off (``M_TRIM_THRESHOLD`` = −1), so a freed block is reused by
    the next step (what it saves: benchmarks/README.md#measurements-behind-the-code; ``tdyn bench``'s ``allocation`` entry). Results are bit-identical (only where
    memory comes from changes). The heap's free memory goes back to the OS when a training run ends
    (:func:`release_memory`), so a sweep worker does not keep the peak of its largest job. No library
    exposes this for CPU torch, hence ctypes. A no-op off glibc or when ``TDYN_MALLOPT=0``. Returns
    whether the settings were applied.
    """
    global _TUNED
    if _TUNED or os.environ.get("TDYN_MALLOPT", "1") == "0":
        return _TUNED
    import ctypes
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _TUNED = all(libc.mallopt(k, v) == 1 for k, v in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1), (_M_TOP_PAD, 1 << 29)))
    return _TUNED


def release_memory() -> None:
    """Hand the heap's free memory back to the OS (glibc ``malloc_trim``), where :func:`tune_allocator`
    keeps it between steps: called when a training run ends. A no-op where the allocator was not tuned."""
    if _TUNED:
        _libc().malloc_trim(0)


@functools.cache
def _libc():
    """glibc (a ``ctypes.CDLL``), for ``mallopt`` and ``malloc_trim``; None off Linux or without them."""
    import ctypes
    import ctypes.util
    import sys
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
