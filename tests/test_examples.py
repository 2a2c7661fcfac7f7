"""The worked examples of docs/library.md run (at small settings) and produce what they promise."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, timeout=600, cwd=ROOT, code=0):
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "TDYN_THREADS": "1"}
    env.pop("TDYN_IMPORT", None)
    r = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == code, r.stderr[-3000:]
    return r.stdout if code == 0 else r.stderr


def test_example_a_new_distribution(tmp_path):
    out = _run("examples/shared_distinct_tokens.py", "--small", "--out", tmp_path / "a")
    lines = [ln for ln in out.splitlines() if ln.startswith("seed")]
    assert len(lines) == 2
    for ln in lines:   # attention masses over distinct / shared / commons sum to 1 (the queries hold none)
        m = re.search(r"distinct ([\d.]+), shared ([\d.]+), commons ([\d.]+)", ln)
        assert m and sum(map(float, m.groups())) == pytest.approx(1.0, abs=2e-3)


def test_example_a_checks_its_config_in_one_line(tmp_path):
    """The example's data config rejects a bad value as tdyn's own do: one line, exit 2 (docs/library.md)."""
    import json

    cfg = {"task": "shared_distinct", "data": {"shared": 10, "distinct_per_class": 10}, "seeds": [0],
           "optim": {"steps": 2, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}}}
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    err = _run("-m", "tdyn", "--import", ROOT / "examples/shared_distinct_tokens.py", "run", tmp_path / "bad.json",
               "--out", tmp_path / "o", code=2)
    assert err.strip() == "tdyn: error: data.shared = 10: must be below data.distinct_per_class = 10"


@pytest.mark.slow
def test_examples_b_plain_module_sweep_and_c_reading_back(tmp_path):
    sweep = tmp_path / "b"
    out = _run("examples/plain_attention_block.py", "--small", "--out", sweep, "--workers", "2")
    assert out.count(": finished") == 6
    out = _run(ROOT / "examples/read_results.py", "--sweep", sweep, "--png", tmp_path / "c.png", cwd=tmp_path)
    assert "6 runs, learning rates [0.0003, 0.001, 0.003]" in out
    assert "AttentionBlock" in out and (tmp_path / "c.png").stat().st_size > 10_000


# ---------------------------------------------------------------- the notebook walkthrough (issue 37 item 10)

WALKTHROUGH = ROOT / "examples/notebook_walkthrough.py"


def _cells(script: str) -> list[str]:
    """The script's ``# %%`` cells, each from its ``# %%`` line on (what Jupytext and VS Code make cells of)."""
    parts = re.split(r"(?m)^(?=# %%)", script)
    return [p.strip() for p in parts if p.startswith("# %%")]


def test_the_walkthrough_in_library_md_is_the_script():
    """docs/library.md shows the walkthrough's cells, each as a python block, in order and nothing else:
    what the doc shows is what CI runs."""
    doc = (ROOT / "docs/library.md").read_text(encoding="utf-8")
    section = doc.split("<!-- walkthrough:begin -->")[1].split("<!-- walkthrough:end -->")[0]
    blocks = [b.strip() for b in re.findall(r"```python\n(.*?)```", section, flags=re.S)]
    assert blocks == _cells(WALKTHROUGH.read_text(encoding="utf-8"))
    assert len(blocks) == 5


def test_the_notebook_walkthrough_runs(tmp_path):
    """The walkthrough run as CI runs a notebook: a new task, a 4 seeds × 3 rates sweep with its probe, the task
    edited and registered again (one notice, no error), a plot."""
    import time

    t0 = time.time()
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "TDYN_THREADS": "1", "MPLBACKEND": "Agg"}
    env.pop("TDYN_IMPORT", None)
    r = subprocess.run([sys.executable, str(WALKTHROUGH)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "task 'icl_linreg' registered again by __main__.build: the new one replaces the old" in r.stderr
    assert "Traceback" not in r.stderr
    out = tmp_path / "runs/walkthrough"
    sweep = [d for d in (out / "sweep").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(sweep) == 12
    assert re.search(r"0\.030\s+\d", r.stdout) and "gap_to_gd" in r.stdout
    assert "optim.groups.all.lr=0.01__seed=0" in r.stdout and "optim.groups.all.lr=0.03__seed=0" in r.stdout
    noisy = json.loads((out / "noisy/optim.groups.all.lr=0.01__seed=0/config.json").read_text())
    assert noisy["data"]["noise"] == 0.5                     # the edited task's default reached the run
    assert (out / "icl_loss.png").stat().st_size > 10_000
    print(f"walkthrough: {time.time() - t0:.1f} s")
