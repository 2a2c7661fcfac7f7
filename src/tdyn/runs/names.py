"""The names of tdyn's files and directories (defined here only), the statuses a run can have, and the one
scheme of run directory names (:func:`run_name`).

Every other module, in runs and above, names these files through these constants, so renaming one is
one edit here. What a layer above writes into a directory (a report page, a sweep's submitit folder) it
records there itself (:func:`tdyn.runs.record`); a sink's directory, written wherever a run is, is declared
with :func:`tdyn.runs.own`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tdyn.errors import ConfigError

CONFIG = "config.json"          # a run's resolved config (trains that member alone)
META = "meta.json"              # versions, seed, times, status
METRICS = "metrics.jsonl"       # one record per evaluation
CKPT_DIR = "checkpoints"        # step-XXXXXXX.safetensors and final.safetensors
FINAL = "final.safetensors"
ENSEMBLE = "ensemble.json"      # a job's manifest: config, members, member directories
SWEEP = "sweep.json"            # a sweep's spec and every run's status
SUMMARY = "summary.csv"         # a sweep's per-cell summary
RESULTS = "results.json"        # a reproduction's claims and numbers
REPRODUCE = "reproduce.json"    # a `reproduce --all` directory's options, metadata, each reproduction's status
LOCK = ".tdyn.lock"             # the writer's lock (pid@host) while a process writes the directory
JOBS = ".jobs"                  # a sweep's job directories (ensemble.json of each job, their locks)
REPRODUCING = ".reproducing.json"   # a reproduction under way (its name): removed once its results.json is written
WRITTEN = ".tdyn-written.json"  # what layers above runs wrote into this directory (names, by runs.record)

STATUSES = ("running", "finished", "diverged", "failed", "interrupted")   # meta.json's status
DONE = ("finished", "diverged")                                          # a result: nothing left to train
CHECKSUM = "sha256"             # checkpoint metadata key: tensor_checksum of its tensors
SEAL = "checksum"               # meta.json's key: the SHA-256 of the rest of its content (io.content_checksum)
SEALED = (META,)                # the JSON records io.json_file seals with SEAL (and their readers verify)
LINE_CRC = "crc"                # metrics.jsonl's key on every line: its CRC-32, chained (records.metrics_file)

MARKERS = (ENSEMBLE, SWEEP, RESULTS, REPRODUCE, REPRODUCING)   # besides CONFIG + META (a run): what makes a directory tdyn's
RUNS = "runs"        # a reproduction's trained runs: OUT/runs/<job> (jobs, sweeps)


# ---------------------------------------------------------------- run directory names
#
# One scheme names every run directory tdyn makes for a member: an ensemble member's (``OUT/<name>``) and a sweep
# run's (``SWEEP/<name>``). A name is the overrides that make the run, ``key=value`` joined by ``__``, the seed last:
# ``optim.groups.Y.lr=0.001__init_scale=10__seed=0``. Each key is what a sweep axis (and ``--set``) calls it;
# ``run_name`` is the one function that writes it. Directories written by an older tdyn keep the names they
# were given (``seed0_lrY0.001_init10`` for an ensemble's members): their ``ensemble.json`` and ``sweep.json``
# record them, and resume continues under the recorded names (:func:`legacy_member_name` recognises them).

LR_AXIS = "optim.groups.{}.lr"   # a learning rate: the sweep axis (and the name's key) of group {}
INIT_AXIS = "init_scale"         # an init scale: the sweep axis and the name's key
NAME_MAX_BYTES = 255             # a directory name's limit on ext4, APFS, NTFS
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,+-]")   # kept as they are; '=' and '%' among those escaped


def format_value(v: Any) -> str:
    """A value as a name shows it: a float in ``:g`` form where that is the same float (``0.001``, ``1e-05``,
    ``10``), else in full (``0.0010000000000000002``), so two distinct rates never share a name; lists and
    dicts as compact JSON; anything else as ``str``."""
    if isinstance(v, float):
        short = f"{v:g}"
        return short if float(short) == v else repr(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _escape(text: str) -> str:
    """``text`` with every character outside ``A-Za-z0-9_.,+-`` as ``%XX`` of its UTF-8 bytes (``*`` → ``%2A``,
    ``/`` → ``%2F``, ``=`` → ``%3D``, ``%`` → ``%25``): safe on every filesystem, and distinct texts stay distinct."""
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), text)


def run_name(axes: dict[str, Any], seed: int) -> str:
    """The directory name of the run that ``axes`` (override key → value, in order) and ``seed`` make:
    ``key=value`` parts joined by ``__``, ``seed=N`` last. The one naming function of ensemble members and sweep
    runs. A name longer than a filesystem allows is a ConfigError naming it."""
    name = "__".join(f"{_escape(str(k))}={_escape(format_value(v))}" for k, v in [*axes.items(), ("seed", seed)])
    if len(name.encode()) > NAME_MAX_BYTES:
        raise ConfigError(f"run name {name[:80]}… is {len(name.encode())} bytes, more than a directory name may "
                          f"have ({NAME_MAX_BYTES}): fewer or shorter axes (sweep axes: shorter values)")
    return name


def member_axes(lrs: dict[str, float] | None, init_scale: float | None) -> dict[str, Any]:
    """An ensemble member's axes: its learning rate per group (those its ``ensemble.lrs`` entry sets, by group
    name; None: no ``ensemble.lrs``) and its init scale (None: no ``ensemble.init_scales``)."""
    axes: dict[str, Any] = {LR_AXIS.format(g): v for g, v in sorted((lrs or {}).items())}
    if init_scale is not None:
        axes[INIT_AXIS] = init_scale
    return axes


def legacy_member_name(seed: int, lrs: dict[str, float] | None, init_scale: float | None) -> str:
    """The name tdyn gave the same member before (up to this version's run names): ``seed0``,
    ``seed1_lrY0.5_lrZ0.5``, ``seed0_lrall0.001_init10``. Read only, to continue directories it wrote."""
    parts = [f"seed{seed}"] + [f"lr{g}{v:g}" for g, v in sorted((lrs or {}).items())]
    return "_".join(parts + ([f"init{init_scale:g}"] if init_scale is not None else []))
