"""The names of tdyn's files and directories (defined here only), and the statuses a run can have.

Every other module, in runs and above, names these files through these constants, so renaming one is
one edit here. What a layer above writes into a directory (a report page, a sweep's submitit folder) it
records there itself (:func:`tdyn.runs.record`); a sink's directory, written wherever a run is, is declared
with :func:`tdyn.runs.own`.
"""

from __future__ import annotations

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
