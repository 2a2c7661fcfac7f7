"""Where a CUDA-graph training step's time goes (issue 35 item 6; run by benchmarks/gpu_graphs.sh on a lent GPU).

For Syn-Small ensembles and one Fig 6 job, eager and with ``cuda_graph``, the training loop's seconds (meta.json)
and, timed around the trainer's calls with the device waited for at each boundary, the seconds spent drawing
the batch (host), in the loss/backward graph (or eager loss) and in the update. Prints one JSON line per case.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from tdyn import runs
from tdyn.papers.scan_snap.analysis import FIG6, fig6_spec
from tdyn.papers.scan_snap.data import SYN_SMALL
from tdyn.papers.scan_snap.task import yz_config
from tdyn.sweep.spec import load_spec, plan
from tdyn.train import graphs, trainer

SPENT: dict[str, float] = {}


def timed(name, fn):
    def wrapper(*a, **k):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*a, **k)
        torch.cuda.synchronize()
        SPENT[name] = SPENT.get(name, 0.0) + time.perf_counter() - t0
        return out
    return wrapper


def cases(steps: int) -> dict[str, dict]:
    out = {}
    for S, kind in ((16, "lrs"), (64, "lrs"), (16, "seeds"), (64, "seeds")):
        c = yz_config(SYN_SMALL, steps=steps, init="torch_default", seeds=range(S) if kind == "seeds" else (0,))
        c["probes"] = {"names": [], "every": steps}
        if kind == "lrs":
            c["ensemble"] = {"lrs": [{"Y": 10 ** (2 * i / (S - 1) - 1), "Z": 10 ** (2 * i / (S - 1) - 1)} for i in range(S)]}
        out[f"syn_small_S{S}_{kind}"] = c
    spec = fig6_spec(FIG6)
    spec["config"]["device"] = "cuda"
    out["fig6_panel_job"] = plan(load_spec(spec))[-1].config   # the largest panel (num_last 10): 160 members
    return out


def main(steps: int = 150) -> None:
    timers = {"sample": (trainer.Job, "_sample"), "loss_backward": (graphs.GraphedStep, "forward_backward"),
              "update": (graphs.GraphedStep, "update"), "prefetch_start": (graphs.Prefetch, "start")}
    # eager; graphs with the batch drawn at the step (0), beside the loop (1 thread), split over 4 threads
    for name, cfg in cases(steps).items():
        for graph, threads in ((False, None), (True, 0), (True, 1), (True, 4)):
            c = dict(cfg, device="cuda", cuda_graph=graph)
            if graph:
                graphs.PREFETCH_THREADS = threads
            with tempfile.TemporaryDirectory() as d:
                trainer.train(dict(c, optim=dict(c["optim"], steps=5)), Path(d) / "w", progress=False)  # warm-up
                plain = trainer.train(c, Path(d) / "plain", progress=False)
                loop = runs.read_meta(plain[0])["seconds"]["training"]
                SPENT.clear()
                if threads in (None, 1):   # where the time goes, timed at the trainer's calls (adds waits)
                    saved = {k: getattr(cls, attr) for k, (cls, attr) in timers.items()}
                    try:
                        for k, (cls, attr) in timers.items():
                            setattr(cls, attr, timed(k, saved[k]))
                        trainer.train(c, Path(d) / "timed", progress=False)
                    finally:
                        for k, (cls, attr) in timers.items():
                            setattr(cls, attr, saved[k])
            S = len(trainer.expand_members(trainer.load_config(c)))
            print(json.dumps({"case": name, "graph": graph, "prefetch_threads": threads, "members": S,
                              "steps": c["optim"]["steps"], "loop_s": loop,
                              "member_steps_per_s": round(S * c["optim"]["steps"] / loop),
                              "timed_s": {k: round(v, 4) for k, v in SPENT.items()}}), flush=True)
    graphs.PREFETCH_THREADS = 0   # the default


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
