"""Intra-op thread count for training.

The models here are small: with 2 threads on a 2-core machine shared with any other job, a parallel
region waits for a descheduled thread and steps slow down up to 25× (Fig 6 quick panels: 1.0 s with
1 thread vs 25.7 s with 2, measured back to back). The CLI therefore trains with
``DEFAULT_THREADS`` = 1 unless ``tdyn --threads N`` or ``TDYN_THREADS`` says otherwise.
"""

from __future__ import annotations

import os

DEFAULT_THREADS = 1


def cli_threads() -> int:
    return int(os.environ.get("TDYN_THREADS", DEFAULT_THREADS))

