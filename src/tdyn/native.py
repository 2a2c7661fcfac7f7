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

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path


FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=gnu11", "-shared", "-fPIC")


def cache_dir() -> Path:
    """``$TDYN_CACHE``/native, else ~/.cache/tdyn/native (an OSError where there is no home directory)."""
    base = os.environ.get("TDYN_CACHE")
    if base:
        return Path(base) / "native"
    try:
        return Path.home() / ".cache" / "tdyn" / "native"
    except RuntimeError as e:                     # no HOME and no passwd entry
        raise OSError(f"{e} (set TDYN_CACHE)") from None


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
    """One line for meta.json and ``tdyn bench``: the C compiler the kernels are built with where one is at hand
    (a task still takes its torch path where its kernel does not apply: on a GPU, beyond the kernel's sizes), or why
    there are none; builds that failed in this process are named."""
    path, what = compiler()
    line = f"C kernels: {what}" if path else f"torch paths only: {what}"
    if path and FAILED:
        line += "; failed here, torch paths instead: " + "; ".join(f"{k} ({v})" for k, v in sorted(FAILED.items()))
    return line


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
#: builds that failed in this process (source stem → why): their callers take the torch paths, and status() says so
FAILED: dict[str, str] = {}


def library(source: Path, defines: dict[str, int | str] | None = None) -> ctypes.CDLL | None:
    """The C file ``source`` built with ``-D`` ``defines`` and loaded, or None: no compiler (see :func:`status`), or
    a build that failed here (no home or cache directory to write, the compiler's error, its timeout). A failure
    warns once, is remembered for the process (:data:`FAILED`, named by :func:`status` in every later run's
    meta.json), and the callers take their torch paths."""
    path, version = compiler()
    if path is None or Path(source).stem in FAILED:
        return None
    text = Path(source).read_bytes()
    args = [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    key = hashlib.sha256(b"\0".join([text, " ".join(FLAGS + tuple(args)).encode(), version.encode(),
                                     path.encode(), _cpu().encode()])).hexdigest()[:20]
    if key in _LOADED:
        return _LOADED[key]
    try:
        out = cache_dir() / f"{Path(source).stem}-{key}.so"
        if not out.exists():
            _build(path, source, args, out)
        lib = ctypes.CDLL(str(out))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        why = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        FAILED[Path(source).stem] = why
        warnings.warn(f"tdyn: building {Path(source).name} failed, the torch path is used instead ({why}); set "
                      "TDYN_CACHE to a writable directory, or TDYN_NATIVE=0 to silence this", RuntimeWarning,
                      stacklevel=2)
        return None
    _LOADED[key] = lib
    return lib


def _build(path: str, source: Path, args: list[str], out: Path) -> None:
    """Compile ``source`` into ``out``: a temporary file beside it, readable as the umask allows, then renamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".so.tmp", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([path, *FLAGS, *args, str(source), "-o", tmp], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{path} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o755 & ~mask)       # mkstemp made it 0600: other users of a shared cache could not load it
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ptr(t, first: int = 0) -> ctypes.c_void_p:
    """A contiguous tensor's data pointer for a kernel's argument, at index ``first`` of its leading axis."""
    if not t.is_contiguous():
        raise ValueError("native.ptr: the tensor must be contiguous")
    return ctypes.c_void_p(t.data_ptr() + first * t.stride(0) * t.element_size())


def check(code: int, what: str) -> None:
    """A kernel's return code: 0, or MemoryError (the one failure the kernels report: their buffers)."""
    if code != 0:
        raise MemoryError(f"{what}: could not allocate its buffers (code {code})")


def over_members(call, S: int, threads: int) -> None:
    """``call(first, count)`` over members 0 … S−1: at once with one thread, else in ``threads`` contiguous groups,
    each on a thread of its own for this call (``ctypes`` lets go of the GIL while a kernel runs; no pool lingers to
    change how a later sweep starts its workers). A kernel computes each member alone and in a fixed order, so its
    results do not depend on ``threads`` (with denormals kept, torch's default: ``torch.set_flush_denormal`` is
    per thread and would reach only the caller's)."""
    threads = max(1, min(threads, S))
    if threads == 1:
        call(0, S)
        return
    bounds = [S * i // threads for i in range(threads + 1)]
    errors: list[BaseException] = []

    def run(a: int, n: int) -> None:
        try:
            call(a, n)
        except BaseException as e:                # raised in the caller, below
            errors.append(e)
    workers = [threading.Thread(target=run, args=(a, b - a), name="tdyn-native")
               for a, b in zip(bounds[1:], bounds[2:])]
    for w in workers:
        w.start()
    run(0, bounds[1])                            # the first group on the caller's thread
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
