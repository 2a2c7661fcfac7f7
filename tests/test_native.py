"""tdyn.native: C kernels compiled on first use, cached by what makes the build, loaded with ctypes; a missing
compiler is a None (the callers' torch paths), a failing build an error naming the file."""

import ctypes

import pytest

from tdyn import native

SRC = "double twice(double x) { return SCALE * x; }\n"


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache in tmp_path and a compiler lookup made again (lru-cached per process)."""
    monkeypatch.setenv("TDYN_CACHE", str(tmp_path / "cache"))
    native.compiler.cache_clear()
    native._LOADED.clear()
    failed = dict(native.FAILED)
    native.FAILED.clear()
    yield tmp_path
    native.compiler.cache_clear()
    native._LOADED.clear()
    native.FAILED.clear()
    native.FAILED.update(failed)


needs_cc = pytest.mark.skipif(native.compiler()[0] is None, reason=native.status())


@needs_cc
def test_builds_once_and_by_its_defines(fresh):
    src = fresh / "twice.c"
    src.write_text(SRC)
    lib = native.library(src, {"SCALE": 2})
    lib.twice.restype, lib.twice.argtypes = ctypes.c_double, [ctypes.c_double]
    assert lib.twice(3.5) == 7.0
    built = sorted((fresh / "cache" / "native").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so" and built[0].name.startswith("twice-")
    assert built[0].stat().st_mode & 0o044 == 0o044 & ~_umask()          # readable by others as the umask allows
    assert native.library(src, {"SCALE": 2}) is lib                      # loaded once per process
    native._LOADED.clear()
    native.library(src, {"SCALE": 2})
    assert sorted((fresh / "cache" / "native").iterdir()) == built      # and built once per cache
    three = native.library(src, {"SCALE": 3})                            # other defines: another build
    three.twice.restype, three.twice.argtypes = ctypes.c_double, [ctypes.c_double]
    assert three.twice(1.0) == 3.0
    assert len(list((fresh / "cache" / "native").glob("*.so"))) == 2
    assert not list((fresh / "cache" / "native").glob(".*"))           # no temporary file left


@needs_cc
def test_a_failing_build_warns_once_and_gives_the_torch_path(fresh):
    src = fresh / "broken.c"
    src.write_text("this is not C\n")
    with pytest.warns(RuntimeWarning, match="building broken.c failed"):
        assert native.library(src) is None
    assert not list((fresh / "cache" / "native").iterdir())             # nothing half-built kept
    assert "broken" in native.FAILED and "failed here, torch paths instead: broken" in native.status()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # remembered: no second build, no warning
        assert native.library(src) is None


def test_off_and_missing_compilers_give_the_torch_paths(fresh, monkeypatch):
    src = fresh / "twice.c"
    src.write_text(SRC)
    monkeypatch.setenv("TDYN_NATIVE", "0")
    native.compiler.cache_clear()
    assert native.library(src, {"SCALE": 2}) is None
    assert native.status() == "torch paths only: off (TDYN_NATIVE=0)"
    monkeypatch.delenv("TDYN_NATIVE")
    monkeypatch.setenv("CC", "no-such-compiler-tdyn")
    native.compiler.cache_clear()
    assert native.library(src, {"SCALE": 2}) is None
    assert native.status() == "torch paths only: no C compiler ('no-such-compiler-tdyn' not on PATH)"
    assert not (fresh / "cache").exists()


@needs_cc
def test_status_names_the_compiler():
    assert native.status().startswith("C kernels: ")


@needs_cc
def test_an_unwritable_cache_or_no_home_gives_the_torch_path(fresh, monkeypatch):
    src = fresh / "twice.c"
    src.write_text(SRC)
    blocker = fresh / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TDYN_CACHE", str(blocker))
    with pytest.warns(RuntimeWarning, match="TDYN_CACHE"):
        assert native.library(src, {"SCALE": 2}) is None
    native.FAILED.clear()
    monkeypatch.delenv("TDYN_CACHE")
    monkeypatch.delenv("HOME", raising=False)
    import pathlib

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    with pytest.warns(RuntimeWarning, match="home directory"):
        assert native.library(src, {"SCALE": 2}) is None


def test_members_in_groups_on_threads_that_end():
    import threading

    seen = []
    before = threading.active_count()
    native.over_members(lambda a, n: seen.append((a, n)), 5, 2)
    assert sorted(seen) == [(0, 2), (2, 3)] and threading.active_count() == before
    seen.clear()
    native.over_members(lambda a, n: seen.append((a, n)), 5, 1)
    assert seen == [(0, 5)]

    def boom(a, n):
        raise ValueError(f"group {a}")
    with pytest.raises(ValueError, match="group"):
        native.over_members(boom, 4, 2)


def test_a_kernels_failure_code_is_an_error():
    native.check(0, "k")
    with pytest.raises(MemoryError, match="k: could not allocate"):
        native.check(1, "k")
