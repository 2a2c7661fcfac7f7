"""Listing, --help and argument errors import no heavy module (a module-set assertion over
`python -X importtime`, not a timing); the catalog they read is generated from the registrations."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import json_differences

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "numpy", "scipy", "matplotlib", "sklearn", "ray", "submitit", "pandas", "safetensors", "tokenizers",
         "transformers"}


def _imported(argv: list[str]) -> set[str]:
    code = f"from tdyn.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    env.pop("TDYN_IMPORT", None)
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    mods = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "tdyn.cli" in mods, r.stderr[-2000:]
    return {m.split(".")[0] for m in mods}


@pytest.mark.parametrize("argv", [["list"], ["--help"], ["reproduce", "--help"], ["reproduce", "scan-snap/fig6", "--help"],
                                  ["reproduce", "nosuch", "--out", "x"], ["config", "nosuch"], ["run", "--resume"],
                                  ["sweep", "--bogus"], ["config", "scan-snap/fig6"], ["config", "topic/two-stage", "--quick"]])
def test_light_commands_import_nothing_heavy(argv):
    assert not (_imported(argv) & HEAVY), argv


def test_commands_that_import_torch_freeze_what_they_imported(tmp_path):
    """A command that imports torch moves the imported objects to the collector's permanent generation
    (``gc.freeze()``): no collection, the interpreter's last one at exit included, traverses them again."""
    code = ("import gc\nfrom tdyn.cli import main\n"
            f"assert main(['run', 'syn_small', '--out', {str(tmp_path / 'r')!r}, '--quiet', '--set', 'optim.steps=2']) == 0\n"
            "print(gc.get_freeze_count())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=os.environ | {"PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) > 100_000      # torch's ~170,000 objects, frozen


def test_json_differences_compare_floats_relatively():
    assert json_differences({"a": [1.0, {"b": 2.0}]}, {"a": [1.0 + 1e-10, {"b": 2.0}]}, 1e-8) == []
    assert json_differences({"a": [1.0]}, {"a": [1.0 + 1e-6]}, 1e-8) == ["/a[0]: 1.0 != 1.000001"]
    assert json_differences({"a": 1}, {"b": 1}, 1e-8) and json_differences([1.0], [1.0, 2.0], 1e-8)
    assert json_differences({"a": "x"}, {"a": "y"}, 1e-8) and json_differences({"a": None}, {"a": 0.0}, 1e-8)


def test_catalog_matches_the_registrations():
    from tdyn.reproduce import registry, runner

    fresh = json.loads(runner.catalog_text())
    # claim2's learning rate is 1/λ_max from an eigen-solve at c up to 4·10⁷: its last bits differ between CPUs,
    # measured up to 1.0e-10 relative between this project's AMD EPYC and Intel Xeon machines (2026-11-27)
    diff = json_differences(registry.catalog(), fresh, 1e-8)
    assert not diff, f"regenerate it (make catalog): {len(diff)} differences, first {diff[:3]}"
    assert fresh["scan-snap/fig4"]["configs"]["full"] and fresh["decision-list/claim1"]["configs"] == {}


def test_config_from_the_catalog_equals_the_resolved_one(cli):
    """`tdyn config NAME` (from the catalog, no torch) prints the configs the reproduction resolves (its one
    config bare: what `tdyn run` takes back)."""
    import yaml

    from tdyn.reproduce import registry, runner

    for quick in (False, True):
        r = cli("config", "scan-snap/fig4", *(["--quick"] if quick else []))
        ctx = registry.ReproduceContext(out=ROOT, quick=quick)
        want = {n: c.model_dump(mode="json") for n, c in runner.resolved_configs(registry.get("scan-snap/fig4"), ctx).items()}
        assert r.returncode == 0 and {"fig4": yaml.safe_load(r.stdout)} == want
