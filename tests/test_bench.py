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
    assert b["reference_matmul"]["gflops_1_thread"] > 0 and b["device"] == "cpu"
    u = b["scan_snap_single"]["usage"]
    assert u["minor_faults"] >= 0 and u["user_s"] > 0 and u["sys_s"] >= 0


def test_bench_startup_and_device(cli, tmp_path):
    """The start-up entry times the light commands and one Syn-Small run as processes; --device cuda
    without CUDA is one line, exit 2."""
    import torch

    out = tmp_path / "bench.json"
    r = cli("bench", "--quick", "--only", "startup", "--out", out)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())["startup"]
    assert {"list_s", "help_s", "config_s", "syn_small_run_process_s", "python_import_torch_s"} <= b.keys()
    if not torch.cuda.is_available():
        r = cli("bench", "--quick", "--only", "startup", "--device", "cuda", "--out", tmp_path / "c.json")
        assert r.returncode == 2 and "CUDA is not available" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bench_allocation_entry(cli, tmp_path):
    """The allocation entry trains the same job in two child processes, allocator default vs tuned,
    and records each one's faults and system time."""
    out = tmp_path / "bench.json"
    r = cli("bench", "--quick", "--only", "allocation", "--out", out, timeout=900)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())["allocation"]
    for k in ("glibc_default", "tuned"):
        assert b[k]["train_s"] > 0 and b[k]["minor_faults"] > 0 and b[k]["sys_s"] >= 0
    assert b["fault_ratio"] > 0
