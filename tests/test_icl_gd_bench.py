"""``tdyn bench --only icl_gd_authors``: the authors' JAX code of von Oswald et al. against tdyn's step (issue 38
item 6). Registration, the skip path, a wrong checkout, and benchmarks/icl_gd_authors.py's patch on a fake file;
the timing itself needs their code and a JAX environment (docs/reproductions/icl-gd.md#authors-code-side-by-side)."""

from pathlib import Path

import pytest
from conftest import benchmarks_script, check_text_patch

from tdyn.bench import BENCHES
from tdyn.papers.icl_gd import MANIFEST

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "icl_gd_authors.py"


def test_the_authors_bench_is_registered_and_skips_without_its_variables(monkeypatch):
    assert MANIFEST.benches["icl_gd_authors"] == "tdyn.papers.icl_gd.bench" and "icl_gd_authors" in BENCHES.table
    monkeypatch.delenv("TDYN_ANCHOR_ICL_GD", raising=False)
    monkeypatch.delenv("TDYN_ANCHOR_ICL_GD_PYTHON", raising=False)
    out = BENCHES.get("icl_gd_authors")(True)
    assert set(out) == {"skipped"} and "TDYN_ANCHOR_ICL_GD" in out["skipped"]
    monkeypatch.setenv("TDYN_ANCHOR_ICL_GD", "/somewhere")                 # one of the two is not enough
    assert set(BENCHES.get("icl_gd_authors")(True)) == {"skipped"}


def test_the_driver_is_where_the_bench_looks():
    from tdyn.papers.icl_gd import bench

    assert bench.DRIVER == SCRIPT and SCRIPT.is_file()


def test_the_authors_bench_refuses_a_wrong_checkout_with_one_line(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("TDYN_ANCHOR_ICL_GD", str(tmp_path / "nowhere"))
    monkeypatch.setenv("TDYN_ANCHOR_ICL_GD_PYTHON", "python3")
    r = cli("bench", "--quick", "--only", "icl_gd_authors", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "TDYN_ANCHOR_ICL_GD" in r.stderr, r.stderr
    assert not (tmp_path / "b.json").exists()


def test_the_authors_bench_refuses_an_unpatched_checkout(tmp_path, cli, monkeypatch):
    (tmp_path / "src").mkdir()
    for f in ("train.py", "data.py", "config.py", "transformer.py"):
        (tmp_path / "src" / f).write_text("")
    (tmp_path / "src" / "train.py").write_text("  rng: jnp.DeviceArray\n")
    monkeypatch.setenv("TDYN_ANCHOR_ICL_GD", str(tmp_path))
    monkeypatch.setenv("TDYN_ANCHOR_ICL_GD_PYTHON", "python3")
    r = cli("bench", "--quick", "--only", "icl_gd_authors", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not patched" in r.stderr, r.stderr


def test_the_patch_replaces_device_array_once(tmp_path):
    mod = benchmarks_script("icl_gd_authors")
    with pytest.raises(SystemExit, match="no transformers_learn_icl_by_gd"):
        mod.patch(tmp_path)
    (tmp_path / "src").mkdir()
    for f in ("data.py", "config.py", "transformer.py"):
        (tmp_path / "src" / f).write_text("")
    check_text_patch(mod, tmp_path, tmp_path / "src" / "train.py",
                     "class TrainState(NamedTuple):\n  params: hk.Params\n  rng: jnp.DeviceArray\n"
                     "  step: jnp.DeviceArray\nx = jnp.zeros(3)\n",
                     "class TrainState(NamedTuple):\n  params: hk.Params\n  rng: jax.Array\n"
                     "  step: jax.Array\nx = jnp.zeros(3)\n", "3d5547c")
