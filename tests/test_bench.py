"""`tdyn bench` writes bench.json with machine info and the entry's figures (no timing asserted)."""

import json


def test_bench_only_one_entry(cli, tmp_path):
    out = tmp_path / "bench.json"
    r = cli("bench", "--quick", "--only", "scan_snap_single", "--out", out)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())
    assert {"cpu_count", "torch_threads", "torch"} <= b["machine"].keys()
    assert b["scan_snap_single"]["steps_per_s"] > 0
    r = cli("bench", "--only", "nope", "--out", out)
    assert r.returncode == 2 and "allowed" in r.stderr
