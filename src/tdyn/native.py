"""Small C kernels, compiled on first use with the machine's C compiler and loaded with ``ctypes``.

Why by hand: the papers' models are made of many tiny per-sequence products (11 × 11 for von Oswald et al.'s
LSA) that torch runs as batched MKL calls over tensors larger than the caches, at 10–30 % of the matmul rate;
``torch.compile`` keeps them as the same calls (benchmarks/README.md, "twenty-fourth"). A C loop over a chunk of
sequences held in L1, the batch in the vector lanes, runs them 2–3× faster. ``torch.utils.cpp_extension`` would
compile the same loops against torch's headers (tens of seconds a build, and ninja); these kernels take raw
pointers and need neither.

Bits: every kernel is compiled with ``-O3 -march=native -ffp-contract=off`` and no fast-math, so the compiler may
neither fuse a multiply-add nor reorder a sum. Its float results then depend on the source alone, not on the
vector width the machine offers (tested: a build for plain x86-64-v2 gives the same bits). Without a compiler, or
with ``TDYN_NATIVE=0``, :func:`library` returns None and callers take their torch path (other bits, equal to
rounding); :func:`status` says which, and every run's meta.json records it (``machine.native``).

Builds are cached in ``$TDYN_CACHE``/native (default ``~/.cache/tdyn/native``) under a hash of the source, the
defines, the flags, the compiler's version and the CPU's feature flags (``-march=native`` code must not run on
another CPU), written to a temporary file and renamed into place, so concurrent first uses are safe.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from tdyn.errors import UserError

FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=gnu11", "-shared", "-fPIC")


def cache_dir() -> Path:
    base = os.environ.get("TDYN_CACHE")
    return Path(base) / "native" if base else Path.home() / ".cache" / "tdyn" / "native"


@functools.lru_cache(maxsize=None)
def compiler() -> tuple[str | None, str]:
    """(the C compiler's path, its first version line), or (None, why there is none)."""
    if os.environ.get("TDYN_NATIVE", "1") == "0":
        return None, "off (TDYN_NATIVE=0)"
    name = os.environ.get("CC") or "cc"
    path = shutil.which(name) or (shutil.which("gcc") if "CC" not in os.environ else None)
    if path is None:
        return None, f"no C compiler ({name!r} not on PATH)"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"C compiler {path} does not run ({e})"
    if out.returncode != 0:
        return None, f"C compiler {path} does not run (exit {out.returncode})"
    return path, (out.stdout.splitlines() or ["?"])[0].strip()


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    """The CPU's model and feature flags (Linux) or what platform knows: part of every build's key."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
        return "\n".join(sorted(set(keep)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def status() -> str:
    """One line for meta.json and ``tdyn bench``: the compiler the kernels are built with, or why there are none."""
    path, what = compiler()
    return f"C kernels: {what}" if path else f"torch paths only: {what}"


@contextlib.contextmanager
def disabled():
    """Inside the block no kernel is built or used (as ``TDYN_NATIVE=0``): the callers' torch paths, for
    comparisons (``tdyn bench``, tests)."""
    old = os.environ.get("TDYN_NATIVE")
    os.environ["TDYN_NATIVE"] = "0"
    compiler.cache_clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TDYN_NATIVE", None)
        else:
            os.environ["TDYN_NATIVE"] = old
        compiler.cache_clear()


_LOADED: dict[str, ctypes.CDLL] = {}


def library(source: Path, defines: dict[str, int | str] | None = None) -> ctypes.CDLL | None:
    """The C file ``source`` built with ``-D`` ``defines`` and loaded, or None without a compiler (see
    :func:`status`). A cache that cannot be written is a one-line UserError; a compiler that fails on tdyn's own
    source is a bug: RuntimeError with its message."""
    path, version = compiler()
    if path is None:
        return None
    text = Path(source).read_bytes()
    args = [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    key = hashlib.sha256(b"\0".join([text, " ".join(FLAGS + tuple(args)).encode(), version.encode(),
                                     path.encode(), _cpu().encode()])).hexdigest()[:20]
    if key in _LOADED:
        return _LOADED[key]
    out = cache_dir() / f"{Path(source).stem}-{key}.so"
    if not out.exists():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".so.tmp", dir=out.parent)
        except OSError as e:
            raise UserError(f"the C kernels' cache {str(out.parent)!r} is not writable ({e.strerror}): set TDYN_CACHE "
                            "to a writable directory, or TDYN_NATIVE=0 for the torch paths") from None
        os.close(fd)
        try:
            r = subprocess.run([path, *FLAGS, *args, str(source), "-o", tmp], capture_output=True, text=True,
                               timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"compiling {source} failed ({path}): {r.stderr.strip()[-2000:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    _LOADED[key] = lib
    return lib


def ptr(t, first: int = 0) -> ctypes.c_void_p:
    """A contiguous tensor's data pointer for a kernel's argument, at index ``first`` of its leading axis."""
    if not t.is_contiguous():
        raise ValueError("native.ptr: the tensor must be contiguous")
    return ctypes.c_void_p(t.data_ptr() + first * t.stride(0) * t.element_size())


def check(code: int, what: str) -> None:
    """A kernel's return code: 0, or MemoryError (the one failure the kernels report: their buffers)."""
    if code != 0:
        raise MemoryError(f"{what}: could not allocate its buffers (code {code})")


_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def over_members(call, S: int, threads: int) -> None:
    """``call(first, count)`` over members 0 … S−1: at once with one thread, else in ``threads`` contiguous
    groups on a thread pool (``ctypes`` lets go of the GIL while a kernel runs). A kernel computes each member
    alone and in a fixed order, so its results do not depend on ``threads``."""
    global _POOL
    threads = max(1, min(threads, S))
    if threads == 1:
        call(0, S)
        return
    if _POOL is None or _POOL._max_workers < threads:
        _POOL = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tdyn-native")
    bounds = [S * i // threads for i in range(threads + 1)]
    for f in [_POOL.submit(call, a, b - a) for a, b in zip(bounds, bounds[1:])]:
        f.result()
