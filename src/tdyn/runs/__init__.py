"""Run directories: ``config.json``, ``meta.json``, ``metrics.jsonl``, ``checkpoints/*.safetensors``, and the
directories of jobs, sweeps and reproductions around them. One owner of the format; callers use
``from tdyn import runs`` and ``runs.<name>`` whichever module below defines it.

* :mod:`~tdyn.runs.names` — every file name (``runs.CONFIG``, ``runs.META``, …), the run statuses, and the one
  scheme of run directory names (:func:`run_name`: ``optim.groups.Y.lr=0.001__seed=0``);
* :mod:`~tdyn.runs.machine` — this process and machine: ``pid@host``, time stamps, git commit;
* :mod:`~tdyn.runs.atomic` — atomic, durable writes (temp file, fsync or one syncfs, rename; now or in a
  :class:`GroupCommit`), stale temps;
* :mod:`~tdyn.runs.io` — JSON and CSV written and read (``meta.json`` sealed with its checksum), :class:`CorruptFile`
  for a bad file;
* :mod:`~tdyn.runs.checkpoints` — safetensors checkpoints with the SHA-256 of their tensors;
* :mod:`~tdyn.runs.identity` — which run wrote a file: ``member@digest`` of its config, checked on read;
* :mod:`~tdyn.runs.records` — each directory's records (config, meta, metrics, ensemble, sweep, results), checked
  (metrics.jsonl's lines carry a chained CRC-32, meta.json its checksum);
* :mod:`~tdyn.runs.locks` — one writer per directory (:class:`Locks`, ``.tdyn.lock`` naming ``pid@host``);
* :mod:`~tdyn.runs.ownership` — what tdyn owns, for ``--force`` (:func:`prepare_dir`, :func:`own`);
* :mod:`~tdyn.runs.reader` — :class:`Run`, :func:`load_run`, :func:`load_sweep`.

Every file is written atomically, so a kill never leaves a half-written file; whatever reads a file
checks it (a missing, truncated, garbled or ill-typed file is a :class:`CorruptFile`, exit 2, naming it);
a second writer of a directory is refused naming the first.
"""

from __future__ import annotations

import os  # noqa: F401  (runs.os: tests patch runs.os.fsync, as when runs was one module)
import sys
import types

from tdyn.errors import UserError  # noqa: F401  (runs.UserError, as before)
from tdyn.runs import atomic, checkpoints, identity, io, locks, machine, names, ownership, reader, records
from tdyn.runs.atomic import (SYNCFS_FILESYSTEMS, _BATCH_SYNC, _MODE, _SYNCFS, _TMP_RE, _syncfs_covers,  # noqa: F401
                              GroupCommit, atomic_write_bytes, atomic_write_many, atomic_write_text, mount_types,
                              remove_stale_temps)
from tdyn.runs.checkpoints import (checkpoint_file, checkpoint_path, checkpoint_steps,  # noqa: F401
                                   params_of, read_checkpoint, read_checkpoint_metadata, save_checkpoint,
                                   tensor_checksum)
from tdyn.runs.identity import IDENTITY, METRICS_KEY, ForeignFile, config_digest, make_identity  # noqa: F401
from tdyn.runs.io import CorruptFile, content_checksum, dumps_json, json_file, read_json, write_csv, write_json  # noqa: F401
from tdyn.runs.locks import LockError, Locks, _held, held_lock_files, holder_gone, lock_holder  # noqa: F401
from tdyn.runs.machine import git_commit, host, machine_info, now, pid_alive, writer_tag  # noqa: F401
from tdyn.runs.names import (CHECKSUM, CKPT_DIR, CONFIG, DONE, ENSEMBLE, FINAL, JOBS, LINE_CRC, LOCK, MARKERS,  # noqa: F401
                             META, METRICS, REPRODUCE, REPRODUCING, RESULTS, RUNS, SEAL, SEALED, STATUSES, SUMMARY,
                             SWEEP, WRITTEN, INIT_AXIS, LR_AXIS, format_value, legacy_member_name, member_axes,
                             run_name)
from tdyn.runs.ownership import (OS_LITTER, OWN_FILES, OWN_TREES, check_own, clear_own, foreign_entry,  # noqa: F401
                                 is_tdyn_dir, own, prepare_dir, record, reproduction_of, written)
from tdyn.runs.reader import Run, load_run, load_sweep  # noqa: F401
from tdyn.runs.records import (MetricsLines, check_final_step, check_identity, check_run, load_checkpoint, config_from, ensemble_dirs, is_run_dir, job_dirs,  # noqa: F401
                               load_run_config, run_identity, sweep_dirs, metrics_file, read_config, read_ensemble, read_manifest, read_meta, read_metrics,
                               read_results, read_sweep, scan_metrics, write_metrics)

_SUBMODULES = (names, machine, atomic, io, identity, checkpoints, records, locks, ownership, reader)
_UNSET = object()


class _Package(types.ModuleType):
    """``tdyn.runs`` itself. Setting one of its names (a test's ``monkeypatch.setattr(runs, "_SYNCFS", …)``)
    sets it too in every submodule that holds the same object, so the code there sees the change as it
    did when runs was one module."""

    def __setattr__(self, name: str, value) -> None:
        old = self.__dict__.get(name, _UNSET)
        if old is not _UNSET and not isinstance(old, types.ModuleType):
            for mod in _SUBMODULES:
                if mod.__dict__.get(name, _UNSET) is old:
                    setattr(mod, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
