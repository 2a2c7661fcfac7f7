"""The one check shared by the hostile-input tables (bad inputs and corrupted files, issue 17).

A case is *rejected cleanly* when the CLI exits 2, prints exactly one non-empty line on stderr that
names the offending key or file, prints no traceback, and changes nothing outside the directories the
case is allowed to write (its ``--out``). :func:`tree_state` snapshots a directory tree (path → size,
mtime, mode) before the case; :func:`assert_rejected` compares it after. :class:`PreloadedCli` runs
the command in a process of its own per case without paying torch's import each time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def tree_state(root: Path, *, exclude: tuple[Path, ...] = ()) -> dict[str, tuple[int, int, int]]:
    """{relative path: (size, mtime_ns, mode)} of every file and directory under ``root`` except the
    ``exclude`` subtrees (the case's own ``--out``)."""
    root = Path(root)
    ex = [Path(e).resolve() for e in exclude]
    state = {}
    for p in sorted(root.rglob("*")):
        rp = p.resolve() if not p.is_symlink() else p.absolute()
        if any(rp == e or e in rp.parents for e in ex):
            continue
        st = p.lstat()
        # a directory's own mtime changes when --out is created inside it: entries added or removed
        # show up as keys instead
        is_file = p.is_file() and not p.is_symlink()
        state[str(p.relative_to(root))] = (st.st_size if is_file else 0, st.st_mtime_ns if is_file else 0, st.st_mode)
    return state


def assert_rejected(result, names: str | tuple[str, ...], before: dict | None = None, after: dict | None = None,
                    case: str = "") -> None:
    """``result`` (a ``subprocess.CompletedProcess``) is a clean rejection naming ``names`` (one string,
    or a tuple of which at least one must appear on the stderr line); ``before``/``after`` are
    :func:`tree_state` snapshots that must be equal (nothing outside ``--out`` touched)."""
    where = f"[{case}] " if case else ""
    err = result.stderr.strip()
    assert result.returncode == 2, f"{where}exit {result.returncode}, stderr: {err[-2000:]!r}"
    assert "Traceback" not in result.stderr, f"{where}traceback: {err[-2000:]}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{where}expected one stderr line, got {len(lines)}: {err[-2000:]!r}"
    wanted = (names,) if isinstance(names, str) else names
    assert any(w in lines[0] for w in wanted), f"{where}stderr does not name {wanted}: {lines[0]!r}"
    if before is not None and after is not None:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"{where}files outside --out changed: {changed[:10]}"


class PreloadedCli:
    """``tdyn ARGS`` in a process of its own, forked from a server that imported torch and tdyn once
    (``tests/cli_server.py``): the same exit status, stdout, stderr and files as ``python -m tdyn ARGS``,
    in ~0.1 s instead of ~2 s. Call it like ``conftest.tdyn_cli``; ``close()`` ends the server."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "cli_server.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=HERE.parent,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def __call__(self, *args, cwd: str | Path | None = None, env: dict | None = None,
                 timeout: int = 120) -> subprocess.CompletedProcess:
        argv = [str(a) for a in args]
        with tempfile.TemporaryDirectory() as t:
            out, err = Path(t, "stdout"), Path(t, "stderr")
            req = {"argv": argv, "cwd": str(cwd or HERE.parent), "timeout": timeout,
                   "env": dict(os.environ, PYTHONUNBUFFERED="1") | (env or {}), "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the preloaded tdyn server died (exit {self.proc.wait()})")
            return subprocess.CompletedProcess(["tdyn", *argv], int(line), out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
