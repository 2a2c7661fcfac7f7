"""A preloaded ``tdyn`` command for the hostile-input tables (driven by ``hostile.PreloadedCli``).

Importing torch and tdyn costs about 2 s per process here; a table of a hundred rejected inputs would
spend minutes on imports alone. This process imports them once, then reads one JSON request per line on
stdin — ``{"argv", "cwd", "env", "stdout", "stderr", "timeout"}`` — and forks a child per request that
runs ``tdyn.cli.main(argv)`` exactly as ``python -m tdyn`` does (its own process: working directory,
environment, stdout and stderr redirected to the named files, an uncaught exception printed as a traceback
with exit status 1). It answers each request with one line: the child's exit status (negative: killed by
that signal, e.g. -14 when it ran past ``timeout`` seconds).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import traceback

import torch  # noqa: F401  (what the preloading is for)

import tdyn.cli
import tdyn.config  # noqa: F401
import tdyn.runs  # noqa: F401
import tdyn.sweep  # noqa: F401
import tdyn.train.trainer  # noqa: F401


def _child(req: dict) -> None:
    """Become ``python -m tdyn ARGV`` for ``req``; never returns."""
    signal.alarm(int(req["timeout"]))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["tdyn", *req["argv"]]
    try:
        rc = tdyn.cli.main(req["argv"])
    except SystemExit as e:
        rc = e.code
    except BaseException:
        traceback.print_exc()
        rc = 1
    if not isinstance(rc, int):   # as the interpreter treats SystemExit's code
        if rc is not None:
            print(rc, file=sys.stderr)
        rc = 0 if rc is None else 1
    # the exit handlers (logging's flush, temporary directories, locks) run as at a normal exit; the
    # interpreter's teardown of the preloaded modules (~0.9 s, every page copied on write) is skipped
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        sys.stdout.write(f"{rc}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
