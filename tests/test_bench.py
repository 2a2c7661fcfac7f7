"""`tdyn bench` writes bench.json with machine info and the entry's figures (no timing asserted)."""

import json

import pytest


def test_bench_only_one_entry(cli, tmp_path):
    out = tmp_path / "bench.json"
    r = cli("bench", "--quick", "--only", "scan_snap_single", "--out", out)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())
    assert {"cpu_count", "torch_threads", "torch"} <= b["machine"].keys()
    assert b["scan_snap_single"]["steps_per_s"] > 0
    r = cli("bench", "--only", "nope", "--out", out, "--force")
    assert r.returncode == 2 and "allowed" in r.stderr
    before = out.read_bytes()
    r = cli("bench", "--quick", "--only", "scan_snap_single", "--out", out)   # no --force: the file is kept
    assert r.returncode == 2 and "exists" in r.stderr and "--force" in r.stderr and out.read_bytes() == before
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


def test_bench_lm_entry_records_both_precisions_and_the_matmul_ceiling(cli, tmp_path):
    """The LM entry: tokens/s in float32 and bf16 for S = 1, 5, 25, and the decoder's matmuls alone per step
    (the ceiling any implementation of the step has on this machine). Structure only: no timing asserted."""
    out = tmp_path / "bench.json"
    r = cli("--threads", "1", "bench", "--quick", "--only", "real_lm_tokens_per_s", "--out", out, timeout=900)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())["real_lm_tokens_per_s"]
    assert b["V"] == 2000 and b["device"] == "cpu"
    for S in (1, 5, 25):
        for p in ("float32", "bfloat16"):
            assert b[f"S{S}_{p}"]["tokens_per_s"] > 0
            floor = b[f"S{S}_decoder_matmul_floor"][p]
            assert floor["s_per_step"] > 0 and floor["tokens_per_s_max"] == pytest.approx(S * 700 / floor["s_per_step"])


def test_checkpoint_entry_replays_both_protocols(tmp_path, monkeypatch):
    """The checkpoint entry is listed with the papers' entries and writes the same checkpoint steps either
    way: two durable writes per step, or written behind in group commits (counted, never timed)."""
    import tempfile

    from tdyn import bench

    assert "checkpoint_write" in bench.BENCHES.table and bench.BENCHES.get("checkpoint_write")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert bench._checkpoint_steps(2, 5, behind=False)[1] == 10
    assert 1 <= bench._checkpoint_steps(2, 5, behind=True)[1] <= 5
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_only_a_bench_result(tmp_path):
    """``--force`` (bench.run) replaces a JSON that tdyn bench wrote, recognised by its keys, and nothing else:
    a user's JSON, a text file, a JSON list, a directory are refused before anything is measured."""
    from tdyn import bench
    from tdyn.errors import UserError

    ours = tmp_path / "b.json"
    ours.write_text(json.dumps({k: 1 for k in bench.RESULT_KEYS} | {"startup": {}}))
    bench.check_replaceable(ours)
    bench.check_replaceable(tmp_path / "new.json")
    (tmp_path / "d").mkdir()
    for name, text in (("mine.json", '{"machine": 1}'), ("list.json", "[1]"), ("t.txt", "notes"), ("d", None)):
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match=name):
            bench.run(tmp_path / name, quick=True, only=["nope"])
