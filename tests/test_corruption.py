"""Damaged files are detected and named (issue 17, item 5).

``CASES`` is the table: one row per corruption (which directory, which file, how it is damaged, which
command), each driven through the CLI in a subprocess and checked with ``hostile.assert_rejected``: exit
2, one stderr line naming the file, no traceback, nothing outside the case's directory touched. Adding a
case is one line. The directories are built once per module and copied per case.

Below the table: checkpoint checksums (every flipped bit of a checkpoint file is refused), resume
falling back to the newest intact checkpoint (the result equal bit for bit to an uninterrupted run),
and the checks of a finished run that resume and the sweep make before believing its status.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import tdyn_cli
from hostile import assert_rejected, tree_state
from tdyn import runs
from tdyn.threads import cli_threads
from tdyn.train.trainer import train

# scan_snap samples batches (a data RNG to restore), tiny: 20 steps, checkpoints at 0, 5, 10, 15
CFG = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
       "seeds": [0], "optim": {"steps": 20, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
       "checkpoint": {"schedule": "none", "every": 5}}
STEPS = [0, 5, 10, 15]
NEWEST = "checkpoints/step-0000015.safetensors"
STEP5 = "checkpoints/step-0000005.safetensors"
FINAL = "checkpoints/final.safetensors"
R1, R2 = "optim.groups.Y.lr=1__seed=0", "optim.groups.Y.lr=2__seed=0"   # the sweep's two runs
ALL_STEPS = "checkpoints/step-*.safetensors"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Finished and unfinished runs, an ensemble and a sweep, built once: {kind: directory}, plus the
    sweep's spec file (``spec``). Trained with the CLI's thread count: the resume tests compare the CLI's
    continuation bit for bit with these runs, and a reduction's last bits depend on how many threads share
    it (with torch's default of one per core, a norm at step 16 differed in its 8th digit)."""
    root = tmp_path_factory.mktemp("built")
    threads = torch.get_num_threads()
    torch.set_num_threads(cli_threads())
    try:
        return _build(root)
    finally:
        torch.set_num_threads(threads)


def _build(root: Path) -> dict[str, Path]:
    train(CFG, root / "run", progress=False)
    shutil.copytree(root / "run", root / "unfinished")            # as if killed before the final state
    (root / "unfinished" / runs.CKPT_DIR / runs.FINAL).unlink()
    meta = runs.read_meta(root / "unfinished")
    runs.write_json(root / "unfinished" / runs.META, meta | {"status": "running", "ended": None})
    train(dict(CFG, seeds=[0, 1]), root / "ensemble", progress=False)
    (root / "base.json").write_text(json.dumps(dict(CFG, checkpoint={"schedule": "none"})))
    spec = {"base": str(root / "base.json"), "set": ["optim.steps=4"], "seeds": [0],
            "axes": {"grid": {"optim.groups.Y.lr": [1.0, 2.0]}}}
    (root / "spec.json").write_text(json.dumps(spec))
    from tdyn.sweep import run_sweep

    assert set(run_sweep(spec, root / "sweep", workers=1, progress=False).values()) == {"finished"}
    # another run (its lr 2) and another sweep (5 steps; the same run names): files to copy in from elsewhere
    train(dict(CFG, optim=dict(CFG["optim"], groups={"Y": {"params": ["Y"], "lr": 2.0},
                                                     "Z": {"params": ["Z"], "lr": 1.0}})), root / "run2", progress=False)
    assert set(run_sweep(dict(spec, set=["optim.steps=5"]), root / "sweep2", workers=1, progress=False).values()) == {"finished"}
    return {k: root / k for k in ("run", "unfinished", "ensemble", "sweep", "run2", "sweep2")} | {"spec": root / "spec.json"}


# ---------------------------------------------------------------- ways to damage a file


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _set(obj, path: str, value) -> None:
    """Set ``obj``'s field at ``a.b.0.c`` (list indices as numbers)."""
    *head, last = path.split(".")
    for k in head:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    obj[int(last) if isinstance(obj, list) else last] = value


def damage(path: Path, how: str, root: Path | None = None, built: dict[str, Path] | None = None) -> None:
    """``how``: truncate (keep the first half), empty, garble (8 bytes in the middle → 0xff), bitflip (the
    last byte's low bit), delete (a file or a directory), text:T (replace by T), fifo (a FIFO in its place),
    devzero (a link to /dev/zero), sparse (65 MB of zeros), deep (JSON nested 200000 deep), set:KEY.PATH=JSON (a JSON
    file's field), sealset:KEY.PATH=JSON (meta.json's field, its checksum recomputed: a deliberate forgery),
    sub:OLD=>NEW (the first OLD in the file's text replaced, in place), drop_line:N / dup_line:N / line:N=T
    / swap_lines:N
    (metrics.jsonl's N-th line, from 1; swapped with the next), digit:N (line N's loss changed in its last digit, in place: the line
    stays valid JSON), uncrc:N (line N's checksum removed), unkey:K (the first line's key K removed),
    copy:FILE (another file of the same directory in its place); and from
    elsewhere: swap:REL (exchanged with ``root/REL``, a file or a directory), symlink:REL (replaced by a
    link to ``root/REL``), copyfrom:KIND/REL (``built[KIND]/REL`` copied in its place)."""
    kind, _, arg = how.partition(":")
    if kind in ("swap", "symlink", "copyfrom") or (kind == "delete" and path.is_dir()):
        other = built[arg.split("/", 1)[0]] / arg.split("/", 1)[1] if kind == "copyfrom" else root / arg
        if kind == "swap":
            tmp = path.with_name(path.name + ".swap")
            path.rename(tmp)
            other.rename(path)
            tmp.rename(other)
            return
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        if kind == "symlink":
            path.symlink_to(other.resolve())
        elif kind == "copyfrom":
            (shutil.copytree if other.is_dir() else shutil.copyfile)(other, path)
        return
    data = path.read_bytes() if path.exists() else b""
    if kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garble":
        mid = len(data) // 2
        path.write_bytes(data[:mid] + b"\xff" * 8 + data[mid + 8:])
    elif kind == "bitflip":
        path.write_bytes(_flip(data, len(data) - 1))
    elif kind == "delete":
        path.unlink()
    elif kind == "text":
        path.write_text(arg)
    elif kind in ("set", "sealset"):
        key, _, value = arg.partition("=")
        obj = json.loads(data)
        _set(obj, key, json.loads(value))
        (runs.write_json(path, obj) if kind == "sealset" else path.write_text(json.dumps(obj)))
    elif kind == "sub":
        old, _, new = arg.partition("=>")
        assert old in data.decode(), (path, old)
        path.write_text(data.decode().replace(old, new, 1))
    elif kind in ("digit", "uncrc"):
        lines = data.decode().splitlines(keepends=True)
        i = int(arg) - 1
        if kind == "uncrc":
            lines[i] = re.sub(r', "crc": "[0-9a-f]{8}"', "", lines[i])
        else:   # the last digit of the second value (the loss): a changed number, the line still valid JSON
            m = list(re.finditer(r"\d(?=[,}])", lines[i]))[1]
            lines[i] = lines[i][:m.start()] + str((int(m[0]) + 1) % 10) + lines[i][m.end():]
        path.write_text("".join(lines))
    elif kind in ("drop_line", "dup_line", "line", "swap_lines"):
        n, _, text = arg.partition("=")
        lines = data.decode().splitlines(keepends=True)
        i = int(n) - 1
        lines[i:i + 1 + (kind == "swap_lines")] = {"drop_line": [], "dup_line": [lines[i]] * 2, "line": [text + "\n"],
                                                   "swap_lines": lines[i:i + 2][::-1]}[kind]
        path.write_text("".join(lines))
    elif kind == "unkey":
        first, _, rest = data.decode().partition("\n")
        rec = json.loads(first)
        del rec[arg]
        path.write_text(json.dumps(rec) + "\n" + rest)
    elif kind == "copy":
        shutil.copyfile(path.parent / arg, path)
    elif kind == "fifo":        # reading it would block for ever
        path.unlink()
        os.mkfifo(path)
    elif kind == "devzero":     # reading it would never end
        path.unlink()
        path.symlink_to("/dev/zero")
    elif kind == "sparse":      # 65 MB of zeros (over the 64 MB tdyn reads from a record), no disk used
        with open(path, "r+b") as f:
            f.truncate(65 << 20)
    elif kind == "deep":        # JSON nested past Python's recursion limit
        path.write_text("[" * 200000 + "]" * 200000)
    else:
        raise ValueError(how)


COMMANDS = {
    "resume": ["run", "--resume", "{dir}", "--quiet"],
    "report": ["report", "{dir}"],
    "sweep": ["sweep", "{spec}", "--out", "{dir}", "--workers", "1", "--quiet"],
    "summarize": ["sweep", "--summarize", "{dir}"],
}

# (case, directory, file (glob) below it, damage, command, what the one stderr line must name — default: the file)
CASES = [
    ("meta truncated", "run", "meta.json", "truncate", "resume", None),
    ("meta garbled", "run", "meta.json", "garble", "resume", None),
    ("meta empty", "run", "meta.json", "empty", "resume", None),
    ("meta not an object", "run", "meta.json", "text:[1, 2]", "resume", None),
    ("meta unknown status", "run", "meta.json", "set:status=\"done\"", "resume", None),
    ("meta seed not a number", "run", "meta.json", "set:seed=\"zero\"", "resume", None),
    ("meta deleted", "run", "meta.json", "delete", "resume", None),
    ("config truncated", "run", "config.json", "truncate", "resume", None),
    ("config not UTF-8", "run", "config.json", "garble", "resume", None),
    ("config steps a string", "run", "config.json", "set:optim.steps=\"many\"", "resume", None),
    ("config steps below checkpoints", "run", "config.json", "set:optim.steps=3", "resume", None),
    ("config null", "run", "config.json", "text:null", "resume", None),
    ("metrics deleted", "run", "metrics.jsonl", "delete", "resume", None),
    ("metrics truncated", "run", "metrics.jsonl", "truncate", "resume", None),
    ("metrics garbled line", "run", "metrics.jsonl", "line:6={\"step\": 5, \"loss\": 0.7", "resume", None),
    ("metrics step a string", "run", "metrics.jsonl", "line:3={\"step\": \"x\", \"loss\": 1.0}", "resume", None),
    ("metrics loss a string", "run", "metrics.jsonl", "line:3={\"step\": 2, \"loss\": \"high\"}", "resume", None),
    ("metrics line dropped", "run", "metrics.jsonl", "drop_line:8", "resume", None),
    ("metrics line repeated", "run", "metrics.jsonl", "dup_line:8", "resume", None),
    ("final deleted", "run", "checkpoints/final.safetensors", "delete", "resume", None),
    ("final truncated", "run", "checkpoints/final.safetensors", "truncate", "resume", None),
    ("final bit flipped", "run", "checkpoints/final.safetensors", "bitflip", "resume", None),
    ("final empty", "run", "checkpoints/final.safetensors", "empty", "resume", None),
    ("final is an older state", "run", "checkpoints/final.safetensors", "copy:step-0000015.safetensors", "resume", None),
    ("every checkpoint bit flipped", "unfinished", ALL_STEPS, "bitflip", "resume", NEWEST),
    ("every checkpoint truncated", "unfinished", ALL_STEPS, "truncate", "resume", NEWEST),
    ("unfinished, metrics deleted", "unfinished", "metrics.jsonl", "delete", "resume", None),
    ("unfinished, steps below checkpoints", "unfinished", "config.json", "set:optim.steps=12", "resume", None),
    ("ensemble manifest truncated", "ensemble", "ensemble.json", "truncate", "resume", None),
    ("ensemble config not an object", "ensemble", "ensemble.json", "set:config=5", "resume", None),
    ("ensemble dirs not a list", "ensemble", "ensemble.json", "set:dirs=\"seed=0\"", "resume", None),
    ("ensemble member meta garbled", "ensemble", "seed=1/meta.json", "garble", "resume", None),
    ("ensemble member config edited", "ensemble", "seed=1/config.json", "set:optim.groups.Y.lr=3.0", "resume", None),
    ("ensemble member final bit flipped", "ensemble", "seed=0/checkpoints/final.safetensors", "bitflip", "resume", None),
    ("report: metrics garbled", "run", "metrics.jsonl", "garble", "report", None),
    ("report: checkpoint bit flipped", "run", "checkpoints/step-0000005.safetensors", "bitflip", "report", None),
    ("sweep record truncated", "sweep", "sweep.json", "truncate", "sweep", None),
    ("sweep spec damaged", "sweep", "sweep.json", "set:spec.axes=5", "sweep", None),
    ("sweep run name escapes", "sweep", "sweep.json", "set:runs.0.name=\"../x\"", "summarize", None),
    ("sweep runs not a list", "sweep", "sweep.json", "set:runs={}", "summarize", None),
    # files and runs of another run (issue 36): each file carries its run's identity, checked where it is read
    ("finished run's lr edited", "run", "config.json", "set:optim.groups.Y.lr=2.0", "resume", None),
    ("finished run's lr edited, report", "run", "config.json", "set:optim.groups.Y.lr=2.0", "report", None),
    ("meta's identity edited", "run", "meta.json", f"set:identity=\"seed=0@{'0' * 16}\"", "resume", None),
    ("meta's identity edited and resealed", "run", "meta.json", f"sealset:identity=\"seed=0@{'0' * 16}\"", "resume",
     "config.json"),
    ("final copied from another run", "run", FINAL, f"copyfrom:run2/{FINAL}", "resume", None),
    ("final copied from another run, report", "run", FINAL, f"copyfrom:run2/{FINAL}", "report", None),
    ("checkpoint copied from another run, report", "run", STEP5, f"copyfrom:run2/{STEP5}", "report", None),
    ("checkpoint of another step renamed", "run", "checkpoints/step-0000010.safetensors",
     "copy:step-0000005.safetensors", "report", None),
    ("metrics of another run", "run", "metrics.jsonl", "copyfrom:run2/metrics.jsonl", "resume", None),
    ("metrics without the run's identity", "run", "metrics.jsonl", "unkey:run", "report", None),
    ("unfinished: checkpoint copied from another run", "unfinished", NEWEST, f"copyfrom:run2/{NEWEST}", "resume", None),
    ("unfinished: older checkpoint from another run", "unfinished", STEP5, f"copyfrom:run2/{STEP5}", "resume", None),
    ("unfinished: metrics of another run", "unfinished", "metrics.jsonl", "copyfrom:run2/metrics.jsonl", "resume", None),
    ("unfinished: config of another run", "unfinished", "config.json", "copyfrom:run2/config.json", "resume", None),
    ("ensemble members swapped", "ensemble", "seed=0", "swap:seed=1", "report", "seed=0"),
    ("ensemble members swapped, resume", "ensemble", "seed=0", "swap:seed=1", "resume", "seed=0"),
    ("ensemble member replaced by another", "ensemble", "seed=0", "copyfrom:ensemble/seed=1", "report", "seed=0"),
    ("ensemble metrics of another member", "ensemble", "seed=0/metrics.jsonl", "copyfrom:ensemble/seed=1/metrics.jsonl",
     "report", None),
    ("ensemble final of another member", "ensemble", f"seed=0/{FINAL}", f"copyfrom:ensemble/seed=1/{FINAL}", "resume", None),
    ("sweep final swapped between runs", "sweep", f"{R1}/{FINAL}", f"swap:{R2}/{FINAL}", "sweep", None),
    ("sweep final symlinked to another run's", "sweep", f"{R1}/{FINAL}", f"symlink:{R2}/{FINAL}", "sweep", None),
    ("sweep final from another run, report", "sweep", f"{R1}/{FINAL}", f"copyfrom:sweep/{R2}/{FINAL}", "report", None),
    ("sweep runs swapped, summarize", "sweep", R1, f"swap:{R2}", "summarize", R1),
    ("sweep runs swapped, report", "sweep", R1, f"swap:{R2}", "report", R1),
    ("sweep runs swapped, re-run", "sweep", R1, f"swap:{R2}", "sweep", R1),
    ("sweep config swapped", "sweep", f"{R1}/config.json", f"swap:{R2}/config.json", "summarize", None),
    ("sweep meta swapped", "sweep", f"{R1}/meta.json", f"swap:{R2}/meta.json", "report", R1),
    ("sweep metrics of another run", "sweep", f"{R1}/metrics.jsonl", f"copyfrom:sweep/{R2}/metrics.jsonl", "summarize", None),
    ("sweep run deleted, report", "sweep", R1, "delete", "report", R1),
    ("sweep run deleted, summarize", "sweep", R1, "delete", "summarize", R1),
    ("sweep run of another sweep", "sweep", R1, f"copyfrom:sweep2/{R1}", "summarize", R1),
    ("sweep run of another sweep, re-run", "sweep", R1, f"copyfrom:sweep2/{R1}", "sweep", R1),
    ("sweep record's identity edited", "sweep", "sweep.json", f"set:runs.0.identity=\"optim.groups.Y.lr=1__seed=0@{'0' * 16}\"",
     "summarize", R1),
    ("meta a FIFO, report", "run", "meta.json", "fifo", "report", None),
    ("metrics a FIFO, report", "run", "metrics.jsonl", "fifo", "report", None),
    ("config a FIFO, resume", "run", "config.json", "fifo", "resume", None),
    ("metrics linked to /dev/zero, report", "run", "metrics.jsonl", "devzero", "report", None),
    ("meta over the size limit, report", "run", "meta.json", "sparse", "report", "64.0 MB"),
    ("meta nested too deep, report", "run", "meta.json", "deep", "report", "nested too deep"),
    ("sweep record nested too deep", "sweep", "sweep.json", "deep", "summarize", "nested too deep"),
    ("ensemble member deleted, report", "ensemble", "seed=1", "delete", "report", "seed=1"),
    ("final is an older state, report", "run", FINAL, "copy:step-0000015.safetensors", "report", None),
    # checksums (issue 36): a change that leaves metrics.jsonl or meta.json valid, found by its checksum
    ("metrics digit changed, report", "run", "metrics.jsonl", "digit:6", "report", "metrics.jsonl' line 6 fails"),
    ("metrics digit changed, resume", "run", "metrics.jsonl", "digit:6", "resume", "metrics.jsonl' line 6 fails"),
    ("metrics step's digit changed, report", "run", "metrics.jsonl", 'sub:{"step": 7,=>{"step": 8,', "report", "line 8 fails"),
    ("metrics first line digit changed, report", "run", "metrics.jsonl", "digit:1", "report", "line 1 fails"),
    ("metrics digit changed, summarize", "sweep", f"{R1}/metrics.jsonl", "digit:5", "summarize", "line 5 fails"),
    ("metrics line dropped, report", "run", "metrics.jsonl", "drop_line:8", "report", "line 8 fails"),
    ("metrics line repeated, report", "run", "metrics.jsonl", "dup_line:8", "report", "line 9 fails"),
    ("metrics two lines swapped, report", "run", "metrics.jsonl", "swap_lines:6", "report", "line 6 fails"),
    ("ensemble member meta edited, resume", "ensemble", "seed=0/meta.json", 'sub:"status": "finished"=>"status": "running"',
     "resume", "seed=0/meta.json' fails its checksum"),
    ("metrics last line dropped, report", "run", "metrics.jsonl", "drop_line:21", "report", "last lines are lost"),
    ("metrics last line dropped, summarize", "sweep", f"{R1}/metrics.jsonl", "drop_line:5", "summarize", "lost"),
    ("metrics line without its checksum, report", "run", "metrics.jsonl", "uncrc:4", "report", "line 4 has no checksum"),
    ("metrics checksum lengthened, report", "run", "metrics.jsonl", 'sub:"crc": "=>"crc": "0', "report", "line 1"),
    ("ensemble member metrics digit changed", "ensemble", "seed=1/metrics.jsonl", "digit:9", "report", "line 9 fails"),
    ("meta digit changed, report", "run", "meta.json", 'sub:"seed": 0=>"seed": 1', "report", "checksum"),
    ("meta digit changed, resume", "run", "meta.json", 'sub:"seed": 0=>"seed": 1', "resume", "checksum"),
    ("meta status edited, summarize", "sweep", f"{R1}/meta.json", 'sub:"finished"=>"diverged"', "summarize", "checksum"),
    ("meta checksum changed, report", "run", "meta.json", 'sub:"checksum": "=>"checksum": "f', "report", "checksum"),
    ("unfinished meta digit changed, resume", "unfinished", "meta.json", 'sub:"seed": 0=>"seed": 1', "resume",
     "checksum"),
]


@pytest.mark.parametrize("case,kind,target,how,command,names", CASES, ids=[c[0] for c in CASES])
def test_corruption_is_named(built, preloaded_cli, tmp_path, case, kind, target, how, command, names):
    d = tmp_path / "case"
    shutil.copytree(built[kind], d)
    files = sorted(d.glob(target))
    assert files or how == "delete", f"[{case}] {target} matches nothing"
    for f in files:
        damage(f, how, d, built)
    args = [a.format(dir=d, spec=built["spec"]) for a in COMMANDS[command]]
    before = tree_state(tmp_path, exclude=(d,))
    r = preloaded_cli(*args)
    assert_rejected(r, names or str(Path(target)), before, tree_state(tmp_path, exclude=(d,)), case=case)
    # never reported as a result: the run's status was not turned into "finished" by the attempt
    if kind == "unfinished" and (d / runs.META).exists():
        assert json.loads((d / runs.META).read_text())["status"] == "running"


def test_table_is_large_enough():
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


# ---------------------------------------------------------------- checksums


def test_every_flipped_bit_of_a_checkpoint_is_refused(built, tmp_path):
    """Brute force over a trainer's checkpoint file: flipping the low bit of any byte of its header
    (every byte) or of its tensors (every 31st byte: each lies under the same hash) makes
    ``load_checkpoint`` refuse it — the header's JSON breaks, the sizes disagree, the step no longer
    matches the file name, or the tensors, names, dtypes or shapes no longer match the stored SHA-256."""
    d = tmp_path / "r"
    shutil.copytree(built["run"], d)
    path = runs.checkpoint_path(d, 5)
    good = path.read_bytes()
    ref = runs.load_checkpoint(d, 5)
    assert ref.keys() and runs.read_checkpoint(path)[1][runs.CHECKSUM] == runs.tensor_checksum(ref)
    header = 8 + int.from_bytes(good[:8], "little")
    accepted = []
    for at in [*range(header), *range(header, len(good), 31), len(good) - 1]:
        path.write_bytes(_flip(good, at))
        try:
            runs.load_checkpoint(d, 5)
            accepted.append(at)
        except runs.CorruptFile:
            pass
    assert not accepted, f"flips at bytes {accepted[:10]} of {len(good)} went undetected"
    path.write_bytes(good)
    assert all(torch.equal(runs.load_checkpoint(d, 5)[k], ref[k]) for k in ref)


def test_checkpoint_without_checksum_is_refused(tmp_path):
    from safetensors.torch import save

    path = runs.checkpoint_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(save({"param/w": torch.ones(3)}, metadata={"step": "0"}))
    with pytest.raises(runs.CorruptFile, match="no checksum"):
        runs.load_checkpoint(tmp_path, 0)
    runs.save_checkpoint(tmp_path, 0, {"param/w": torch.ones(3)}, {"step": "0"})
    assert torch.equal(runs.load_checkpoint(tmp_path, 0)["param/w"], torch.ones(3))


def test_checksum_covers_names_dtypes_and_shapes():
    t = torch.arange(6, dtype=torch.float32)
    base = runs.tensor_checksum({"a": t})
    assert runs.tensor_checksum({"a": t.clone()}) == base
    for other in ({"b": t}, {"a": t.view(2, 3)}, {"a": t.view(torch.int32)}, {"a": t + 0.5}, {"a": t, "b": t[:0]}):
        assert runs.tensor_checksum(other) != base


def test_every_changed_digit_of_metrics_and_meta_is_refused(built, tmp_path):
    """Brute force over a trainer's metrics.jsonl and meta.json (issue 36): every digit of every line (and of
    meta.json) changed to another digit, leaving the file valid JSON, is refused by the reader with the file
    and the line named — each line's CRC-32 (chained from the line before) and meta.json's checksum. Restored,
    both read as before."""
    d = tmp_path / "r"
    shutil.copytree(built["run"], d)
    for name, read in ((runs.METRICS, runs.read_metrics), (runs.META, runs.read_meta)):
        path, ref = d / name, read(d)
        good = path.read_text()
        accepted, tried = [], 0
        for m in re.finditer(r"\d", good):
            for new in {str((int(m[0]) + 1) % 10), str((int(m[0]) + 5) % 10)}:
                path.write_text(good[:m.start()] + new + good[m.end():])
                tried += 1
                try:
                    read(d)
                    accepted.append((m.start(), new))
                except runs.CorruptFile as e:
                    assert str(path) in str(e) and (name == runs.META or " line " in str(e)), e
        assert not accepted, f"{name}: {len(accepted)} of {tried} changed digits went undetected: {accepted[:5]}"
        assert tried > 40
        path.write_text(good)
        assert read(d) == ref


def test_a_run_written_before_checksums_loads_with_one_notice(built, tmp_path, monkeypatch, caplog):
    """A run directory whose meta.json and metrics.jsonl carry no checksums (an older tdyn's, with run
    identities) loads, unchecked, with one notice per process; the CLI's report says it in one stderr line
    and exits 0; resumed, such a run ends with the checksummed files of a run trained uninterrupted. A
    checksum on some lines only is refused (a line edited, or lines mixed in)."""
    from tdyn.runs import identity

    monkeypatch.setattr(identity, "_noticed", False)
    for k in ("run", "unfinished"):
        shutil.copytree(built[k], tmp_path / k)
        _strip_checksums(tmp_path / k)
        assert '"crc"' not in (tmp_path / k / runs.METRICS).read_text()
        assert runs.SEAL not in json.loads((tmp_path / k / runs.META).read_text())
    with caplog.at_level("WARNING", logger="tdyn.runs.identity"):
        for k in ("run", "unfinished", "run"):
            r = runs.load_run(tmp_path / k)
            assert r.identity is not None and r.metrics == runs.read_metrics(built["run"])[:len(r.metrics)]
    notices = [x for x in caplog.records if "written by an older tdyn" in x.getMessage()]
    assert len(notices) == 1 and "no checksum" in notices[0].getMessage(), [x.getMessage() for x in caplog.records]
    rep = tdyn_cli("report", tmp_path / "run")
    assert rep.returncode == 0, rep.stderr
    lines = [ln for ln in rep.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "written by an older tdyn" in lines[0], rep.stderr
    res = tdyn_cli("run", "--resume", tmp_path / "unfinished", "--quiet")
    assert res.returncode == 0, res.stderr
    _same_run(tmp_path / "unfinished", built["run"])
    assert (tmp_path / "unfinished" / runs.META).read_text().count(f'"{runs.SEAL}"') == 1
    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "run", mixed)
    lines = (mixed / runs.METRICS).read_text().splitlines(keepends=True)
    lines[2] = (built["run"] / runs.METRICS).read_text().splitlines(keepends=True)[2]
    (mixed / runs.METRICS).write_text("".join(lines))
    with pytest.raises(runs.CorruptFile, match="line 3 has a checksum .* but line 1 has none"):
        runs.read_metrics(mixed)


def test_meta_checksum_covers_content_not_layout(built, tmp_path):
    """meta.json's checksum is of its content (sorted keys, compact JSON): the same content laid out otherwise
    (keys reordered, another indentation) reads as before; any changed value does not."""
    d = tmp_path / "r"
    shutil.copytree(built["run"], d)
    ref = runs.read_meta(d)
    meta = json.loads((d / runs.META).read_text())
    (d / runs.META).write_text(json.dumps(dict(reversed(list(meta.items())))))
    assert runs.read_meta(d) == ref
    (d / runs.META).write_text(json.dumps(meta | {"seed": 0.0}))          # 0 and 0.0: another value
    with pytest.raises(runs.CorruptFile, match="fails its checksum"):
        runs.read_meta(d)


def test_metrics_lines_keep_the_write_path_cheap_and_the_bytes_stable(tmp_path):
    """The writers of metrics.jsonl (the trainer's MetricsLines, encoding each record once, and
    metrics_file) give the same bytes, each line ``{...json..., "crc": "<8 hex>"}``; a record may not use the
    checksum's key; an empty record has a line too."""
    recs = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(50)]
    lines = runs.MetricsLines("seed=0@" + "0" * 16)
    grown: list[dict] = []
    for r in recs:
        grown.append(r)
        data = lines.file(tmp_path, grown)[1]
    assert data == runs.metrics_file(tmp_path, recs, "seed=0@" + "0" * 16)[1]
    assert all(re.fullmatch(r'\{"step": \d+, "loss": [0-9.e-]+(, "run": "seed=0@0+")?, "crc": "[0-9a-f]{8}"\}', x)
               for x in data.decode().splitlines())
    with pytest.raises(runs.UserError, match="'crc'"):
        runs.write_metrics(tmp_path, [{"step": 0, "crc": 1.0}])
    runs.write_metrics(tmp_path, [{"step": 0}, {}])
    recs, problem = runs.scan_metrics(tmp_path)
    assert recs == [{"step": 0}] and "line 2 is a JSON" not in str(problem) and "line 2 has step" in str(problem)


# ---------------------------------------------------------------- resume falls back to an intact checkpoint


def _same_run(a: Path, b: Path) -> None:
    assert (a / runs.METRICS).read_text() == (b / runs.METRICS).read_text()
    fa, fb = runs.load_checkpoint(a), runs.load_checkpoint(b)
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


@pytest.mark.parametrize("target,how,from_step", [
    (NEWEST, "bitflip", 10),                                      # the newest checkpoint is damaged
    (NEWEST, "truncate", 10),
    ("metrics.jsonl", "line:13={\"step\": 12, \"lo", 10),          # metrics intact only up to step 11
    ("metrics.jsonl", "digit:13", 10),                            # step 12's loss changed: its checksum fails
    ("metrics.jsonl", "truncate", None),                          # cut somewhere: the newest covered checkpoint
])
def test_resume_falls_back_to_the_newest_intact_checkpoint(built, tmp_path, target, how, from_step):
    """A damaged newest checkpoint (or metrics damaged before it) is passed over: resume continues from
    the newest checkpoint that is intact and whose metrics are intact up to it, cuts the metrics to it,
    says so in one warning, and ends equal bit for bit (metrics text and final tensors) to the
    uninterrupted run."""
    d = tmp_path / "u"
    shutil.copytree(built["unfinished"], d)
    damage(d / target, how)
    if from_step is None:   # the records that survived the cut decide
        good = runs.scan_metrics(d)[0]
        from_step = max(s for s in STEPS if s <= len(good))
    r = tdyn_cli("run", "--resume", d, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    meta = runs.read_meta(d)
    assert meta["status"] == "finished" and meta["resumed"][-1]["from_step"] == from_step
    if from_step < 15:
        assert "passed over" in r.stderr and len(meta["resumed"][-1]["passed_over"]) >= 1
    _same_run(d, built["run"])


def test_resume_without_damage_takes_the_newest_checkpoint(built, tmp_path):
    d = tmp_path / "u"
    shutil.copytree(built["unfinished"], d)
    r = tdyn_cli("run", "--resume", d, "--quiet")
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    last = runs.read_meta(d)["resumed"][-1]
    assert last["from_step"] == 15 and "passed_over" not in last
    _same_run(d, built["run"])


def test_scan_metrics_keeps_the_intact_prefix(tmp_path):
    runs.write_metrics(tmp_path, [{"step": s, "loss": 1.0 / (s + 1)} for s in range(5)])
    assert [r["step"] for r in runs.read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    p = tmp_path / runs.METRICS
    p.write_text(p.read_text()[:-9])        # the last line cut
    recs, problem = runs.scan_metrics(tmp_path)
    assert [r["step"] for r in recs] == [0, 1, 2, 3] and "line 5" in str(problem) and str(p) in str(problem)
    with pytest.raises(runs.CorruptFile, match="line 5"):
        runs.read_metrics(tmp_path)


def test_sweep_repairs_a_damaged_finished_run(built, tmp_path):
    """Re-running a finished sweep whose run has a garbled meta.json (or a bit-flipped final checkpoint, a
    metrics line or meta.json with a changed digit) re-checks it, never counts it finished as it stands, and
    repairs it (its job trains again, to the same numbers)."""
    from tdyn.sweep import run_statuses

    d = tmp_path / "sw"
    shutil.copytree(built["sweep"], d)
    names = [r["name"] for r in runs.read_sweep(d)["runs"]]
    ref = {n: (d / n / runs.METRICS).read_text() for n in names}
    damage(d / names[0] / runs.META, "garble")
    damage(d / names[1] / runs.CKPT_DIR / runs.FINAL, "bitflip")
    assert run_statuses([d / n for n in names]) == {names[0]: "damaged", names[1]: "damaged"}
    r = tdyn_cli(*[a.format(dir=d, spec=built["spec"]) for a in COMMANDS["sweep"]])
    assert r.returncode == 0, r.stderr
    damage(d / names[0] / runs.METRICS, "digit:3")                      # a changed digit: checksums (issue 36)
    damage(d / names[1] / runs.META, 'sub:"seed": 0=>"seed": 1')
    assert run_statuses([d / n for n in names]) == {names[0]: "damaged", names[1]: "damaged"}
    r = tdyn_cli(*[a.format(dir=d, spec=built["spec"]) for a in COMMANDS["sweep"]])
    assert r.returncode == 0, r.stderr
    assert {x["status"] for x in runs.read_sweep(d)["runs"]} == {"finished"}
    assert {n: (d / n / runs.METRICS).read_text() for n in names} == ref
    assert runs.read_meta(d / names[0])["status"] == "finished"


def test_checkpoint_metadata_from_the_header_alone(built, tmp_path):
    """read_checkpoint_metadata (the sweep's check of runs it has just trained) returns what
    read_checkpoint returns as metadata, from the header; a cut header or a missing file is a
    CorruptFile naming it. The light check (tensors=False) still finds a finished run whose final
    checkpoint is missing or holds another step, and only the full check finds a flipped tensor bit."""
    from tdyn.sweep import run_statuses

    d = tmp_path / "sw"
    shutil.copytree(built["sweep"], d)
    names = [r["name"] for r in runs.read_sweep(d)["runs"]]
    final = d / names[0] / runs.CKPT_DIR / runs.FINAL
    assert runs.read_checkpoint_metadata(final) == runs.read_checkpoint(final)[1]
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(final.read_bytes()[:20])
    with pytest.raises(runs.CorruptFile, match="cut.safetensors.*truncated or garbled"):
        runs.read_checkpoint_metadata(cut)
    with pytest.raises(runs.CorruptFile, match="is missing"):
        runs.read_checkpoint_metadata(tmp_path / "none.safetensors")
    with pytest.raises(runs.CorruptFile, match="is a directory"):
        runs.read_checkpoint_metadata(tmp_path)
    tail_cut = tmp_path / "tail.safetensors"        # the whole header, the tensor bytes cut
    tail_cut.write_bytes(final.read_bytes()[:-1])
    with pytest.raises(runs.CorruptFile, match="tail.safetensors.*header declares"):
        runs.read_checkpoint_metadata(tail_cut)
    huge = tmp_path / "huge.safetensors"            # a garbled length prefix
    huge.write_bytes((10 ** 15).to_bytes(8, "little") + b"{}")
    with pytest.raises(runs.CorruptFile, match="header cut short"):
        runs.read_checkpoint_metadata(huge)
    tensors, meta = runs.read_checkpoint(final)
    unsummed = tmp_path / "unsummed.safetensors"
    from safetensors.torch import save_file
    save_file(tensors, str(unsummed), metadata={k: v for k, v in meta.items() if k != runs.CHECKSUM})
    for read in (runs.read_checkpoint_metadata, runs.read_checkpoint):
        with pytest.raises(runs.CorruptFile, match="carries no checksum"):
            read(unsummed)
    damage(final, "bitflip")
    dirs = [d / n for n in names]
    assert run_statuses(dirs, tensors=False)[names[0]] == "finished"
    assert run_statuses(dirs)[names[0]] == "damaged"
    other = d / names[1] / runs.CKPT_DIR / runs.FINAL
    tensors, meta = runs.read_checkpoint(other)
    runs.save_checkpoint(d / names[1], "final", tensors, {k: v for k, v in meta.items() if k != "sha256"} | {"step": "1"})
    final.unlink()
    assert run_statuses(dirs, tensors=False) == {names[0]: "damaged", names[1]: "damaged"} | {
        n: "finished" for n in names[2:]}


# ---------------------------------------------------------------- run identities (issue 36)


def test_every_file_carries_its_runs_identity(built):
    """meta.json, every checkpoint, metrics.jsonl's first record, ensemble.json and sweep.json record the
    identity member@digest, the digest that of the run's config.json as written; members differ."""
    for kind in ("run", "ensemble", "sweep"):
        dirs = runs.job_dirs(built[kind])
        idents = []
        for d in dirs:
            ident = runs.read_meta(d)[runs.IDENTITY]
            assert ident == f"{runs.read_meta(d)['member']}@{runs.config_digest(runs.read_config(d))}"
            first = json.loads((d / runs.METRICS).read_text().splitlines()[0])
            assert first[runs.METRICS_KEY] == ident and runs.METRICS_KEY not in runs.read_metrics(d)[0]
            for f in (d / runs.CKPT_DIR).iterdir():
                assert runs.read_checkpoint_metadata(f)[runs.IDENTITY] == ident
            idents.append(ident)
        assert len(set(idents)) == len(idents)
        if kind == "ensemble":
            assert runs.read_ensemble(built[kind])["identities"] == idents
        if kind == "sweep":
            assert [r[runs.IDENTITY] for r in runs.read_sweep(built[kind])["runs"]] == idents


def test_the_digest_is_computed_once_per_member(tmp_path, monkeypatch):
    """The hot path never hashes a config: one digest per member for the whole run, whatever the number
    of checkpoints (here 20 per member)."""
    from tdyn.runs import identity

    calls = []
    real = identity.config_digest
    monkeypatch.setattr(identity, "config_digest", lambda c: calls.append(1) or real(c))
    monkeypatch.setattr(runs, "make_identity", lambda c, m: f"{m}@{identity.config_digest(c)}")
    train(dict(CFG, seeds=[0, 1], checkpoint={"schedule": "none", "every": 1}), tmp_path / "e", progress=False)
    assert len(calls) == 2
    assert len(list((tmp_path / "e" / "seed=1" / runs.CKPT_DIR).iterdir())) == 21


def _strip_checksums(d: Path) -> None:
    """Make ``d``'s meta.json and metrics.jsonl as a tdyn before their checksums wrote them."""
    meta = runs.read_meta(d)
    (d / runs.META).write_text(runs.dumps_json(meta) + "\n")
    lines = (d / runs.METRICS).read_text().splitlines(keepends=True)
    (d / runs.METRICS).write_text("".join(re.sub(r', "crc": "[0-9a-f]{8}"', "", x) for x in lines))


def _strip_identity(d: Path) -> None:
    """Make ``d`` a run directory as a tdyn before identities (and checksums) wrote it."""
    _strip_checksums(d)
    meta = json.loads((d / runs.META).read_text())
    del meta[runs.IDENTITY]
    (d / runs.META).write_text(json.dumps(meta))
    damage(d / runs.METRICS, f"unkey:{runs.METRICS_KEY}")
    for f in (d / runs.CKPT_DIR).iterdir():
        tensors, m = runs.read_checkpoint(f)
        f.unlink()
        runs.save_checkpoint(d, "final" if f.name == runs.FINAL else int(m["step"]), tensors,
                             {k: v for k, v in m.items() if k not in (runs.IDENTITY, runs.CHECKSUM)})


def test_an_old_run_without_identity_loads_with_one_notice(built, tmp_path, monkeypatch, caplog):
    """Run directories written before identities load, unchecked, with one notice per process (two old
    runs read many times: one line); the CLI's report says it in one stderr line and exits 0; an old
    unfinished run resumes to the same numbers (its new files without an identity, as its old ones)."""
    from tdyn.runs import identity

    monkeypatch.setattr(identity, "_noticed", False)
    for k in ("run", "unfinished"):
        shutil.copytree(built[k], tmp_path / k)
        _strip_identity(tmp_path / k)
    with caplog.at_level("WARNING", logger="tdyn.runs.identity"):
        for k in ("run", "unfinished", "run"):
            r = runs.load_run(tmp_path / k)
            assert r.identity is None and r.metrics and r.model(5) is not None
    notices = [x for x in caplog.records if "written by an older tdyn" in x.getMessage()]
    assert len(notices) == 1 and str(tmp_path / "run") in notices[0].getMessage()
    rep = tdyn_cli("report", tmp_path / "run")
    assert rep.returncode == 0, rep.stderr
    lines = [ln for ln in rep.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "written by an older tdyn" in lines[0], rep.stderr
    res = tdyn_cli("run", "--resume", tmp_path / "unfinished", "--quiet")
    assert res.returncode == 0, res.stderr
    assert runs.read_meta(tmp_path / "unfinished")["status"] == "finished"
    assert runs.read_metrics(tmp_path / "unfinished") == runs.read_metrics(built["run"])
    fa, fb = runs.load_checkpoint(tmp_path / "unfinished"), runs.load_checkpoint(built["run"])
    assert all(torch.equal(fa[k], fb[k]) for k in fb)
    assert runs.IDENTITY not in runs.read_checkpoint_metadata(runs.checkpoint_path(tmp_path / "unfinished"))


def test_the_python_api_refuses_another_runs_files(built, tmp_path):
    """load_run, Run's checkpoints and model, and load_sweep: a file or run from elsewhere is a ForeignFile
    (a UserError: exit 2 from the CLI) naming the file, the run it belongs to and the run reading it."""
    d = tmp_path / "run"
    shutil.copytree(built["run"], d)
    r = runs.load_run(d)
    shutil.copyfile(built["run2"] / FINAL, d / FINAL)
    with pytest.raises(runs.ForeignFile) as e:
        r.model()
    mine, theirs = runs.run_identity(d), runs.run_identity(built["run2"])
    assert str(d / FINAL) in str(e.value) and mine in str(e.value) and theirs in str(e.value)
    assert torch.equal(r.param("Y", 5), runs.load_run(built["run"]).param("Y", 5))   # its own files still read
    damage(d / runs.CONFIG, "set:optim.groups.Y.lr=3.0")
    with pytest.raises(runs.ForeignFile, match="config.json.*edited"):
        runs.load_run(d)
    sw = tmp_path / "sweep"
    shutil.copytree(built["sweep"], sw)
    damage(sw / R1, f"swap:{R2}", sw)
    with pytest.raises(runs.ForeignFile, match=f"holds run {R2!r} of this sweep"):
        runs.load_sweep(sw)


def test_a_sweep_retrains_a_deleted_run_and_names_it(built, tmp_path):
    """A finished sweep run whose directory was deleted: the re-run names it (one warning) and trains it
    again to the same numbers; the summary then counts it."""
    sw = tmp_path / "sweep"
    shutil.copytree(built["sweep"], sw)
    ref = (sw / R1 / runs.METRICS).read_text()
    shutil.rmtree(sw / R1)
    r = tdyn_cli(*[a.format(dir=sw, spec=built["spec"]) for a in ["sweep", "{spec}", "--out", "{dir}", "--workers", "1"]])
    assert r.returncode == 0, r.stderr
    assert f"{sw / R1} is missing" in r.stderr and "training it again" in r.stderr
    assert (sw / R1 / runs.METRICS).read_text() == ref
    assert (sw / runs.SUMMARY).read_text() == (built["sweep"] / runs.SUMMARY).read_text()


# ---------------------------------------------------------------- the Python API


@pytest.mark.parametrize("target,how", [("config.json", "fifo"), (FINAL, "copy:step-0000015.safetensors"),
                                        ("meta.json", 'sub:"seed": 0=>"seed": 1'), ("metrics.jsonl", "digit:4"),
                                        ("metrics.jsonl", "drop_line:21")])
def test_load_run_refuses_what_the_cli_refuses(built, tmp_path, target, how):
    """``tdyn.load_run(d)``, its model and its metrics: a FIFO config (which blocked the read), an older
    checkpoint as the finished run's final state (which was loaded as its result), a changed digit in
    meta.json or a metrics line and a lost last metrics line are CorruptFiles naming the file."""
    import tdyn

    d = tmp_path / "case"
    shutil.copytree(built["run"], d)
    damage(d / target, how)
    with pytest.raises(runs.CorruptFile, match=Path(target).name):
        r = tdyn.load_run(d)
        r.model()
        r.metrics


# ---------------------------------------------------------------- a reproduction's tables (--judge-only)


@pytest.fixture(scope="module")
def fig4(tmp_path_factory, preloaded_cli) -> Path:
    """``reproduce scan-snap/fig4 --quick``'s directory (its results.json records its tables' digests)."""
    out = tmp_path_factory.mktemp("fig4") / "f"
    r = preloaded_cli("reproduce", "scan-snap/fig4", "--quick", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    return out


def _cut(path: Path) -> None:           # the first 300 bytes: the header and a few rows, the last cut
    path.write_bytes(path.read_bytes()[:300])


def _extra_field(path: Path) -> None:   # row 3 with one field more than the header
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].rstrip("\n") + ",1\n"
    path.write_text("".join(lines))


def _maps_from_classes(path: Path) -> None:
    shutil.copyfile(path.with_name("fig4_classes.csv"), path)


# (case, table, damage, whether results.json keeps its digests, what the one stderr line must name)
JUDGE_CASES = [
    ("table truncated", "loss.csv", _cut, True, "loss.csv"),
    ("table replaced by another", "fig4_maps.csv", _maps_from_classes, True, "missing column 'iteration'"),
    ("no digests: last line cut", "loss.csv", _cut, False, "loss.csv"),
    ("no digests: a row's fields", "loss.csv", _extra_field, False, "row 3"),
    ("no digests: table replaced by another", "fig4_maps.csv", _maps_from_classes, False, "missing column 'iteration'"),
]


@pytest.mark.parametrize("case,table,how,digests,names", JUDGE_CASES, ids=[c[0] for c in JUDGE_CASES])
def test_judge_only_refuses_tables_it_did_not_write(fig4, preloaded_cli, tmp_path, case, table, how, digests, names):
    d = tmp_path / "f"
    shutil.copytree(fig4, d)
    if not digests:   # a results.json from before the digests (the committed docs/results): judged as written
        res = json.loads((d / runs.RESULTS).read_text())
        del res["table_digests"]
        (d / runs.RESULTS).write_text(json.dumps(res))
    how(d / table)
    before = tree_state(tmp_path, exclude=(d,))
    r = preloaded_cli("reproduce", "scan-snap/fig4", "--judge-only", "--out", d)
    assert_rejected(r, names, before, tree_state(tmp_path, exclude=(d,)), case=case)


def test_judge_only_judges_an_edited_table_as_it_is_and_says_so(fig4, preloaded_cli, tmp_path):
    """A table edited by hand (whole rows dropped: it still parses) is judged as it now is, exit 0, with one
    warning line naming it, and results.json lists it under tables_edited (rows written, rows now)."""
    d = tmp_path / "f"
    shutil.copytree(fig4, d)
    lines = (d / "loss.csv").read_text().splitlines(keepends=True)
    (d / "loss.csv").write_text("".join(lines[:11]))                       # the header and 10 of 200 rows
    r = preloaded_cli("reproduce", "scan-snap/fig4", "--judge-only", "--out", d)
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "loss.csv" in ln]
    assert len(warn) == 1 and "edited since" in warn[0]
    res = json.loads((d / runs.RESULTS).read_text())
    assert res["tables_edited"] == [{"table": "loss.csv", "rows_written": 200, "rows_now": 10}]
    page = preloaded_cli("report", d)                                       # and the report page shows it
    assert page.returncode == 0, page.stderr
    text = (d / "index.html").read_text()
    assert "judged on tables edited by hand" in text and "loss.csv (200 rows written, 10 now)" in text


def test_judge_only_keeps_and_checks_the_digests(fig4, preloaded_cli, tmp_path):
    """Tables as written: judged again (twice: the digests are kept in the new results.json), exit 0."""
    d = tmp_path / "f"
    shutil.copytree(fig4, d)
    digests = json.loads((d / runs.RESULTS).read_text())["table_digests"]
    assert digests["loss"]["rows"] == 200 and len(digests["loss"]["sha256"]) == 64
    for _ in range(2):
        r = preloaded_cli("reproduce", "scan-snap/fig4", "--judge-only", "--out", d)
        assert r.returncode == 0, r.stderr
        res = json.loads((d / runs.RESULTS).read_text())
        assert res["table_digests"] == digests and "tables_edited" not in res
