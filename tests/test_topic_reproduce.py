"""The topic reproductions run from the CLI in quick mode and write the outputs the issue names."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _reproduce(name, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "tdyn", "reproduce", name, "--quick", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_stage1_quick(tmp_path):
    res = _reproduce("topic/stage1", tmp_path)
    assert {"dev_loss", "convex_optimum_dev_loss", "wv_block_contrast_per_topic", "claims"} <= set(res)
    assert len(res["wv_block_contrast_per_topic"][0]) == 10
    assert res["dev_loss"] >= res["convex_optimum_dev_loss"] - 0.05          # the optimum of the model class
    assert (tmp_path / "stage1_value.png").stat().st_size > 0 and (tmp_path / "stage1.csv").exists()


@pytest.mark.slow
def test_two_stage_quick(tmp_path):
    res = _reproduce("topic/two-stage", tmp_path)
    assert {"t_value_half", "t_kq_5pct", "ratio", "variants", "claims"} <= set(res)
    assert len(res["variants"]) == 3
    assert all({"t_value_half", "t_kq_5pct", "ratio"} <= set(v) for v in res["variants"])
    assert (tmp_path / "two_stage.png").exists()
