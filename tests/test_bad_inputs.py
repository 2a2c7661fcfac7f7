"""Bad inputs are refused at the door (issue 17, item 6).

``CASES`` is the table: one row per bad input — the command line, the files the case writes first, and
what the one stderr line must name (the key or the file). Each row runs the CLI in a process of its own
(``hostile.PreloadedCli``: forked from a preloaded server, as ``python -m tdyn`` would run) and is checked
with ``hostile.assert_rejected``: exit 2, one stderr line naming it, no traceback, nothing outside the
case's ``--out`` touched. Adding a case is one line.

In the command lines and file contents, ``{d}`` is the case's directory; ``{out}`` is ``{d}/out`` (the
only place a case may write). Every case directory holds the valid base configs of ``BASES`` (one per
task) beside the case's own files, and the command runs in ``{d}/cwd``.
"""

from __future__ import annotations

import json
import os

import pytest

from hostile import assert_rejected, tree_state

SS = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
      "seeds": [0], "optim": {"steps": 4, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
      "checkpoint": {"schedule": "none"}}
LDA = {"task": "lda_mlm", "data": {"num_topics": 2, "words_per_topic": 3, "min_len": 10, "max_len": 12, "num_train": 20,
                                  "num_dev": 10, "num_test": 5, "probe_docs": 5},
       "optim": {"steps": 2, "groups": {"all": {"params": ["W_Q", "W_K", "W_V"], "lr": 0.1}}}, "checkpoint": {"schedule": "none"}}
DL = {"task": "decision_list", "data": {"L": 4, "M": 2, "n": 2}, "optim": {"steps": 2, "groups": {"W": {"params": ["W", "V"], "lr": 0.1}}},
      "checkpoint": {"schedule": "none"}}
BASES = {"ss.json": json.dumps(SS), "lda.json": json.dumps(LDA), "dl.json": json.dumps(DL)}


def run(base: str, *sets: str, extra: tuple[str, ...] = ()) -> list[str]:
    """``tdyn run {d}/BASE.json --out {out} --set S ...``"""
    return ["run", "{d}/" + base + ".json", "--out", "{out}", "--quiet", *extra, *(a for s in sets for a in ("--set", s))]


def ss(*sets: str) -> list[str]:
    return run("ss", *sets)


def lda(*sets: str) -> list[str]:
    return run("lda", *sets)


def dl(*sets: str) -> list[str]:
    return run("dl", *sets)


def spec(axes: dict | None = None, **kw) -> str:
    """A sweep spec over ``ss.json`` (JSON text)."""
    return json.dumps({"base": "ss.json", "seeds": [0]} | ({"axes": axes} if axes is not None else {}) | kw)


SWEEP = ["sweep", "{d}/spec.json", "--out", "{out}", "--workers", "1", "--quiet"]
GOOD_SPEC = {"spec.json": spec({"grid": {"optim.groups.Y.lr": [1.0, 2.0]}})}
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
LONG = "n" * 300
#: a 1 MB string aliased 10⁴ times: 10⁴ values (under the value limit), 10 GB of text once copied
STRING_BOMB = "s: &s " + "x" * 1_000_000 + "\nt: [" + ", ".join(["*s"] * 10_000) + "]\n"
DIR = object()    # a file entry: make this a directory
PLAIN = """import os, torch
from torch import nn
from tdyn import PlainTask, register_task
from tdyn.schema import Strict
class D(Strict):
    pass
class T(PlainTask):
    def __init__(self, cfg, members):
        self.facts = {}
        super().__init__(cfg, members)
    def make_model(self):
        if MODE == "raise_model":
            raise ValueError("my model is broken")
        return None if MODE == "none" else nn.Linear(3, 1)
    def sample(self, gen):
        return torch.randn(4, 3, generator=gen)
    def probe_batch(self, gen):
        return self.sample(gen)
    def member_loss(self, model, x):
        if MODE == "raise_loss":
            raise KeyError("oops")
        return model(x).squeeze(-1) if MODE == "vector" else (model(x) ** 2).mean()
register_task("bad_plain", D, D)(T)
"""
PT = json.dumps({"task": "bad_plain", "seeds": [0, 1], "checkpoint": {"schedule": "none"},
                 "optim": {"steps": 2, "groups": {"all": {"params": ["weight", "bias"], "lr": 0.1}}}})


def plain(mode: str) -> dict:
    """A PlainTask plugin (``pt_MODE.py``) that breaks its contract or raises as ``mode`` says, and its config."""
    return {f"pt_{mode}.py": f"MODE = {mode!r}\n" + PLAIN, "pt.json": PT}


def plain_run(mode: str) -> list[str]:
    return ["--import", f"{{d}}/pt_{mode}.py", "run", "{d}/pt.json", "--out", "{out}", "--quiet"]



# (case, argv, files {name below {d}: text, bytes or DIR}, what the stderr line names — one string or a tuple of alternatives)
CASES = [
    # ---- non-finite floats, every numeric field
    ("lr inf", ss("optim.groups.Y.lr=inf"), {}, "optim.groups.Y.lr"),
    ("lr nan", ss("optim.groups.Y.lr=nan"), {}, "optim.groups.Y.lr"),
    ("lr -inf", ss("optim.groups.Z.lr=-inf"), {}, "optim.groups.Z.lr"),
    ("lr YAML .inf", ss("optim.groups.Y.lr=.inf"), {}, "optim.groups.Y.lr"),
    ("lr YAML .nan", ss("optim.groups.Y.lr=.NaN"), {}, "optim.groups.Y.lr"),
    ("lr Infinity in JSON", ["run", "{d}/c.json", "--out", "{out}"],
     {"c.json": json.dumps(SS).replace('"lr": 1.0', '"lr": Infinity', 1)}, "optim.groups.Y.lr"),
    ("lr NaN in JSON", ["run", "{d}/c.json", "--out", "{out}"],
     {"c.json": json.dumps(SS).replace('"lr": 1.0', '"lr": NaN', 1)}, "optim.groups.Y.lr"),
    ("lr .inf in YAML file", ["run", "{d}/c.yaml", "--out", "{out}"],
     {"c.yaml": json.dumps(SS).replace('"lr": 1.0', '"lr": .inf', 1)}, "optim.groups.Y.lr"),
    ("weight decay inf", ss("optim.groups.Y.weight_decay=inf"), {}, "optim.groups.Y.weight_decay"),
    ("weight decay nan", ss("optim.groups.Z.weight_decay=nan"), {}, "optim.groups.Z.weight_decay"),
    ("momentum nan", ss("optim.groups.Y.momentum=nan"), {}, "optim.groups.Y.momentum"),
    ("eps inf", ss("optim.groups.Y.eps=inf"), {}, "optim.groups.Y.eps"),
    ("beta inf", ss("optim.groups.Y.optimizer=adam", "optim.groups.Y.betas=0.9,inf"), {}, "optim.groups.Y.betas"),
    ("beta nan", ss("optim.groups.Y.optimizer=adam", "optim.groups.Y.betas=nan,0.9"), {}, "optim.groups.Y.betas"),
    ("grad clip inf", ss("optim.grad_clip=inf"), {}, "optim.grad_clip"),
    ("grad clip nan", ss("optim.grad_clip=nan"), {}, "optim.grad_clip"),
    ("init scale inf", ss("ensemble.init_scales=inf"), {}, "ensemble.init_scales"),
    ("init scale nan among many", ss("ensemble.init_scales=1.0,nan"), {}, "ensemble.init_scales"),
    ("ensemble lr inf", ss("ensemble.lrs=[{Y: .inf}]"), {}, "ensemble.lrs"),
    ("ensemble lr nan", ss("ensemble.lrs=[{Y: 1.0}, {Y: .nan}]"), {}, "ensemble.lrs"),
    ("scan_snap common prob inf", ss("data.common_unnormalized_prob=inf"), {}, "data.common_unnormalized_prob"),
    ("scan_snap unique min nan", ss("data.unique_unnormalized_min=nan"), {}, "data.unique_unnormalized_min"),
    ("scan_snap unique max inf", ss("data.unique_unnormalized_max=inf"), {}, "data.unique_unnormalized_max"),
    ("lda alpha inf", lda("data.alpha=inf"), {}, "data.alpha"),
    ("lda mask prob nan", lda("data.mask_prob=nan"), {}, "data.mask_prob"),
    ("lda mask random prob inf", lda("data.mask_random_prob=inf"), {}, "data.mask_random_prob"),
    ("topic init eps inf", lda("model.init_eps=inf"), {}, "model.init_eps"),
    ("topic l2 nan", lda("model.l2=nan"), {}, "model.l2"),
    ("decision list zipf inf", dl("data.zipf=inf"), {}, "data.zipf"),
    ("decision list init std nan", dl("model.init_std=nan"), {}, "model.init_std"),
    ("decision list c inf", dl("model.c=-inf"), {}, "model.c"),
    ("decision list V noise inf", dl("model.V_noise=inf"), {}, "model.V_noise"),
    ("sweep grid value inf", SWEEP, {"spec.json": spec({"grid": {"optim.groups.Y.lr": [1.0, float("inf")]}})}, "optim.groups.Y.lr"),
    ("sweep grid value nan", SWEEP, {"spec.json": spec({"grid": {"optim.groups.Y.lr": [float("nan")]}})}, "optim.groups.Y.lr"),
    ("sweep zip value inf", SWEEP, {"spec.json": spec({"zip": {"optim.groups.Y.lr": [1.0, 2.0], "optim.groups.Z.lr": [1.0, float("-inf")]}})}, "optim.groups.Z.lr"),
    ("sweep random low nan", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "uniform", "low": float("nan"), "high": 1}}}})}, "low"),
    ("sweep random high inf", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "loguniform", "low": 0.1, "high": float("inf")}}}})}, "high"),
    ("sweep choice value nan", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "choice", "values": [1.0, float("nan")]}}}})}, "values"),
    ("sweep slurm mem inf", SWEEP + ["--slurm-mem-gb", "inf"], GOOD_SPEC, "mem_gb"),
    ("sweep set lr inf", SWEEP, {"spec.json": spec(set=["optim.groups.Y.lr=inf"])}, "optim.groups.Y.lr"),
    ("reproduce option inf", ["reproduce", "scan-snap/fig6", "--out", "{out}", "--quick", "--etas-z", "0.1,inf"], {}, "etas_z"),
    ("reproduce --set momentum nan", ["reproduce", "scan-snap/fig4", "--out", "{out}", "--quick", "--set", "optim.groups.Y.momentum=nan"], {}, "optim.groups.Y.momentum"),
    ("config --set weight decay inf", ["config", "scan-snap/fig4", "--set", "optim.groups.Z.weight_decay=inf"], {}, "optim.groups.Z.weight_decay"),
    # ---- learning rates positive, Adam betas in [0, 1)
    ("lr zero", ss("optim.groups.Y.lr=0"), {}, "optim.groups.Y.lr"),
    ("lr negative", ss("optim.groups.Y.lr=-0.5"), {}, "optim.groups.Y.lr"),
    ("lr a word", ss("optim.groups.Y.lr=fast"), {}, "optim.groups.Y.lr"),
    ("lr missing", ["run", "{d}/c.json", "--out", "{out}"], {"c.json": json.dumps(SS).replace('"lr": 1.0', '"momentum": 0.5', 1)}, "optim.groups.Y.lr"),
    ("ensemble lr zero", ss("ensemble.lrs=[{Y: 0}]"), {}, "ensemble.lrs"),
    ("ensemble lr negative", ss("ensemble.lrs=[{Y: 1.0}, {Y: -2}]"), {}, "ensemble.lrs"),
    ("ensemble lr unknown group", ss("ensemble.lrs=[{Q: 1.0}]"), {}, "ensemble.lrs"),
    ("beta one", ss("optim.groups.Y.optimizer=adam", "optim.groups.Y.betas=1.0,0.999"), {}, "optim.groups.Y.betas"),
    ("beta2 one", ss("optim.groups.Y.optimizer=adamw", "optim.groups.Y.betas=0.9,1"), {}, "optim.groups.Y.betas"),
    ("beta negative", ss("optim.groups.Y.optimizer=adam", "optim.groups.Y.betas=-0.1,0.9"), {}, "optim.groups.Y.betas"),
    ("beta above one", ss("optim.groups.Y.betas=0.9,1.5"), {}, "optim.groups.Y.betas"),
    ("one beta", ss("optim.groups.Y.betas=0.9"), {}, "optim.groups.Y.betas"),
    ("momentum one", ss("optim.groups.Y.momentum=1"), {}, "optim.groups.Y.momentum"),
    ("weight decay negative", ss("optim.groups.Y.weight_decay=-1e-4"), {}, "optim.groups.Y.weight_decay"),
    ("eps zero", ss("optim.groups.Y.eps=0"), {}, "optim.groups.Y.eps"),
    ("grad clip zero", ss("optim.grad_clip=0"), {}, "optim.grad_clip"),
    ("init scale zero", ss("ensemble.init_scales=0"), {}, "ensemble.init_scales"),
    # ---- ordered ranges
    ("scan_snap unique min > max", ss("data.unique_unnormalized_min=2", "data.unique_unnormalized_max=1"), {}, "data.unique_unnormalized_max"),
    ("lda min_len > max_len", lda("data.min_len=20", "data.max_len=10"), {}, "data.max_len"),
    ("lda mask probabilities over 1", lda("data.mask_correct_prob=0.6", "data.mask_random_prob=0.5"), {}, "data.mask_correct_prob"),
    ("lda mask prob above 1", lda("data.mask_prob=1.5"), {}, "data.mask_prob"),
    ("sweep uniform low > high", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "uniform", "low": 2, "high": 1}}}})}, "optim.groups.Y.lr"),
    ("sweep loguniform low > high", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "loguniform", "low": 1, "high": 0.1}}}})}, "optim.groups.Y.lr"),
    ("sweep loguniform low 0", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "loguniform", "low": 0, "high": 1}}}})}, "optim.groups.Y.lr"),
    ("sweep uniform without high", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "uniform", "low": 0.1}}}})}, "optim.groups.Y.lr"),
    # ---- --workers / --threads
    ("threads zero", ["--threads", "0", *ss()], {}, "--threads"),
    ("threads negative", ["--threads", "-2", *ss()], {}, "--threads"),
    ("threads a word", ["--threads", "many", *ss()], {}, "--threads"),
    ("threads over the limit", ["--threads", "100000", *ss()], {}, "--threads 100000"),
    ("threads just over the limit", ["--threads", "1025", *ss()], {}, "--threads 1025"),
    ("TDYN_THREADS over the limit", ss(), {}, "TDYN_THREADS='20000'"),
    ("--import a file calling sys.exit(0)", ["--import", "{d}/ex.py", *ss()], {"ex.py": "import sys; sys.exit(0)\n"}, ("ex.py", "sys.exit(0)")),
    ("--import a file raising SystemExit(3)", ["--import", "{d}/ex.py", "list"], {"ex.py": "raise SystemExit(3)\n"}, ("ex.py", "sys.exit(3)")),
    ("sweep key on grid and zip", SWEEP, {"spec.json": spec({"grid": {"optim.groups.Y.lr": [1.0, 2.0]}, "zip": {"optim.groups.Y.lr": [3.0, 4.0]}})}, "'optim.groups.Y.lr' is varied by two axes, axes.grid and axes.zip"),
    ("sweep key on zip and random", SWEEP, {"spec.json": spec({"zip": {"optim.groups.Y.lr": [3.0, 4.0]}, "random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "uniform", "low": 0.1, "high": 1}}}})}, "axes.zip and axes.random"),
    ("workers zero", ["sweep", "{d}/spec.json", "--out", "{out}", "--workers", "0"], GOOD_SPEC, "--workers"),
    ("workers negative", ["sweep", "{d}/spec.json", "--out", "{out}", "--workers", "-1"], GOOD_SPEC, "--workers"),
    ("workers a fraction", ["sweep", "{d}/spec.json", "--out", "{out}", "--workers", "1.5"], GOOD_SPEC, "--workers"),
    # ---- sizes a config or spec implies are limited before anything is allocated (issue 36)
    ("checkpoint.num a billion", ss("checkpoint.schedule=log", "checkpoint.num=1000000000"), {}, "checkpoint.num"),
    ("optim.steps beyond int64", ss("optim.steps=100000000000000000000"), {}, "optim.steps"),
    ("sweep of a million runs", SWEEP, {"spec.json": spec({"grid": {"optim.groups.Y.lr": [float(i + 1) for i in range(1000)]}},
                                                          seeds=list(range(1000)))}, "1,000,000 runs"),
    ("sweep random n 1e8", SWEEP, {"spec.json": spec({"random": {"n": 10**8, "params": {"optim.groups.Y.lr": {"kind": "uniform", "low": 0.1, "high": 1}}}})}, "axes.random.n"),
    # ---- a sweep writes only into a new, empty or its own directory (issue 36)
    ("sweep into a user's directory", SWEEP, GOOD_SPEC | {"out/summary.csv": "mine"}, "holds no sweep"),
    ("sweep into a run directory", SWEEP, GOOD_SPEC | {"out/config.json": "{}", "out/meta.json": "{}"}, "holds no sweep"),
    ("sweep into a reproduction", SWEEP, GOOD_SPEC | {"out/results.json": '{"experiment": "scan-snap/fig4"}'}, "holds no sweep"),
    ("sweep --out a file", SWEEP, GOOD_SPEC | {"out": "a file"}, "is a file"),
    # ---- sweep specs: empty axes and other shapes
    ("sweep grid axis empty", SWEEP, {"spec.json": spec({"grid": {"optim.groups.Y.lr": []}})}, "optim.groups.Y.lr"),
    ("sweep zip axis empty", SWEEP, {"spec.json": spec({"zip": {"optim.groups.Y.lr": []}})}, "optim.groups.Y.lr"),
    ("sweep choice empty", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"optim.groups.Y.lr": {"kind": "choice", "values": []}}}})}, "optim.groups.Y.lr"),
    ("sweep random no params", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {}}})}, "axes.random.params"),
    ("sweep random n zero", SWEEP, {"spec.json": spec({"random": {"n": 0, "params": {"optim.groups.Y.lr": {"kind": "choice", "values": [1]}}}})}, "axes.random.n"),
    ("sweep zip lengths differ", SWEEP, {"spec.json": spec({"zip": {"optim.groups.Y.lr": [1, 2], "optim.groups.Z.lr": [1]}})}, "axes.zip"),
    ("sweep no seeds", SWEEP, {"spec.json": spec(seeds=[])}, "seeds"),
    ("sweep axes not a mapping", SWEEP, {"spec.json": spec(axes=[1, 2])}, "axes"),
    ("sweep unknown axis kind", SWEEP, {"spec.json": spec({"cube": {"a": [1]}})}, "cube"),
    ("sweep unknown key in cell", SWEEP, {"spec.json": spec({"grid": {"optim.nope": [1, 2]}})}, "optim.nope"),
    ("sweep axis value bad type", SWEEP, {"spec.json": spec({"grid": {"optim.steps": ["many"]}})}, "optim.steps"),
    ("sweep base and config", SWEEP, {"spec.json": json.dumps({"base": "ss.json", "config": SS})}, "base"),
    ("sweep base missing", SWEEP, {"spec.json": json.dumps({"base": "nope.json"})}, "nope.json"),
    ("sweep base unknown name", SWEEP, {"spec.json": json.dumps({"base": "no-such/experiment"})}, "no-such/experiment"),
    ("sweep slurm time zero", SWEEP + ["--slurm-time", "0"], GOOD_SPEC, "time_min"),
    ("sweep slurm extra without =", SWEEP + ["--slurm-extra", "qos"], GOOD_SPEC, "--slurm-extra"),
    ("sweep --executor slurm without Slurm", SWEEP + ["--executor", "slurm"], GOOD_SPEC, ("--executor slurm", "--executor local")),
    ("sweep job_members zero", SWEEP, {"spec.json": spec(job_members=0)}, "job_members"),
    # ---- other config values
    ("steps negative", ss("optim.steps=-1"), {}, "optim.steps"),
    ("steps a fraction", ss("optim.steps=1.5"), {}, "optim.steps"),
    ("no seeds", ss("seeds="), {}, "seeds"),
    ("seed a word", ["run", "{d}/ss.json", "--out", "{out}", "--seed", "zero"], {}, "--seed"),
    ("checkpoint num zero", ss("checkpoint.num=0"), {}, "checkpoint.num"),
    ("checkpoint every zero", ss("checkpoint.every=0"), {}, "checkpoint.every"),
    ("probes every negative", ss("probes.every=-1"), {}, "probes.every"),
    ("probe step negative", ss("probes.steps=3,-5"), {}, "probes.steps"),
    ("checkpoint step negative", ss("checkpoint.steps=-5"), {}, "checkpoint.steps"),
    ("freeze until negative", ss("optim.freeze.Y.until=-1"), {}, "optim.freeze.Y.until"),
    ("probe unknown", ss("probes.names=no.such"), {}, "no.such"),
    ("probe option inf", ss("probes.names=scan_snap.attention", "probes.options={scan_snap.attention: {threshold: .inf}}"), {}, "probes.options.scan_snap.attention.threshold"),
    ("unknown key", ss("optim.speed=1"), {}, "optim.speed"),
    ("unknown data key", ss("data.vocab=5"), {}, "data.vocab"),
    ("unknown task", ss("task=nope"), {}, "nope"),
    ("dtype float16", ss("dtype=float16"), {}, "dtype"),
    ("device tpu", ss("device=tpu"), {}, "device"),
    ("optimizer unknown", ss("optim.groups.Y.optimizer=lbfgs"), {}, "optim.groups.Y.optimizer"),
    ("batch size zero", ss("data.batch_size=0"), {}, "data.batch_size"),
    ("seq_len one", ss("data.seq_len=1"), {}, "data.seq_len"),
    ("group without params", ss("optim.groups.Y.params="), {}, "optim.groups.Y.params"),
    ("freeze unknown parameter", ss("optim.freeze.Q.always=true"), {}, "optim.freeze"),
    ("group names unknown parameter", ss("optim.groups.Y.params=Q"), {}, ("optim.groups", "Q")),
    ("override without =", ["run", "{d}/ss.json", "--out", "{out}", "--set", "optim.steps"], {}, "optim.steps"),
    ("override empty segment", ss("optim..steps=3"), {}, "optim..steps"),
    ("override through a value", ss("optim.steps.x=3"), {}, "optim.steps"),
    # ---- resources, checked before allocation
    ("checkpoint every step of 10^12", ss("optim.steps=1000000000000", "checkpoint.every=1"), {}, "checkpoint"),
    ("scan_snap vocabulary too large", ss("data.num_unique_per_next=100000000"), {}, "parameters"),
    ("scan_snap embedding too wide", ss("model.parameterization=embedding", "model.d=100000000"), {}, "parameters"),
    ("topic vocabulary too large", lda("data.num_topics=1000000", "data.words_per_topic=100"), {}, "parameters"),
    ("decision list too long", dl("data.L=10000000"), {}, "parameters"),
    ("sweep job too large", SWEEP, {"spec.json": spec({"grid": {"data.num_unique_per_next": [10, 100000000]}})}, "parameters"),
    ("ensemble too large", ss("data.num_unique_per_next=20000", "seeds=" + ",".join(map(str, range(4000)))), {}, "parameters"),
    ("batch past any address space", ss("data.seq_len=10000000000000000"), {}, "out of memory"),   # past any address space: refused even with overcommit
    # ---- config files
    ("config missing", ["run", "{d}/nope.yaml", "--out", "{out}"], {}, "nope.yaml"),
    ("config is a directory", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": DIR}, "c.yaml"),
    ("config not UTF-8", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": b"task: scan_snap\n# \xff\xfe\n"}, "c.yaml"),
    ("config invalid YAML", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "task: [scan_snap\n"}, "c.yaml"),
    ("config invalid JSON", ["run", "{d}/c.json", "--out", "{out}"], {"c.json": '{"task": "scan_snap",}'}, "c.json"),
    ("config a list", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "- 1\n- 2\n"}, "c.yaml"),
    ("config empty", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": ""}, "c.yaml"),
    ("config YAML alias bomb", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": BOMB}, "c.yaml"),
    ("config YAML key twice", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "task: scan_snap\ntask: lda_mlm\n"}, "'task' twice"),
    ("config JSON key twice", ["run", "{d}/c.json", "--out", "{out}"], {"c.json": '{"task": "scan_snap", "seeds": [0], "seeds": [1]}'}, "'seeds' twice"),
    ("sweep spec key twice", ["sweep", "{d}/spec.yaml", "--out", "{out}"], {"spec.yaml": "base: ss.json\nseeds: [0]\nseeds: [1]\n"}, "'seeds' twice"),
    ("config YAML date value", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "task: scan_snap\noptim: {steps: 3, groups: {Y: {params: [Y], lr: 2001-12-14}}}\n"}, "timestamp value"),
    ("config YAML binary value", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "task: scan_snap\nx: !!binary aGVsbG8=\n"}, "binary value"),
    ("optim.steps a boolean", ss("optim.steps=true"), {}, "optim.steps = true"),
    ("seeds a boolean list", ss("seeds=[true]"), {}, "seeds = [true]"),
    ("lr a boolean in a file", ["run", "{d}/c.json", "--out", "{out}"], {"c.json": json.dumps(SS | {"optim": {"steps": 2, "groups": {"Y": {"params": ["Y"], "lr": True}}}})}, "lr = true"),
    ("sweep seeds a boolean", SWEEP, {"spec.json": spec(seeds=[True])}, "seeds = [true]"),
    ("config YAML one long string aliased", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": STRING_BOMB}, "characters of text"),
    ("config YAML recursive alias", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "a: &a [*a]\n"}, "c.yaml"),
    ("config JSON nested too deep", ["run", "{d}/c.json", "--out", "{out}"], {"c.json": "[" * 100000 + "]" * 100000}, "c.json"),
    ("config without task", ["run", "{d}/c.yaml", "--out", "{out}"], {"c.yaml": "seeds: [0]\n"}, "task"),
    ("config name too long", ["run", "{d}/" + LONG + ".yaml", "--out", "{out}"], {}, LONG[:50]),
    ("unknown experiment name", ["run", "no-such/experiment", "--out", "{out}"], {}, "no-such/experiment"),
    # ---- output and input directories
    ("--out is a file", ["run", "{d}/ss.json", "--out", "{d}/f.txt"], {"f.txt": "mine"}, "f.txt"),
    ("--out below a file", ["run", "{d}/ss.json", "--out", "{d}/f.txt/sub"], {"f.txt": "mine"}, "f.txt"),
    ("--out name too long", ["run", "{d}/ss.json", "--out", "{d}/" + LONG], {}, LONG[:50]),
    ("--out unwritable", ["run", "{d}/ss.json", "--out", "/proc/tdyn-out"], {}, "/proc/tdyn-out"),
    ("--out not permitted", ["run", "{d}/ss.json", "--out", "/sys/tdyn-out"], {}, "/sys/tdyn-out"),
    ("--out below a special file", ["run", "{d}/ss.json", "--out", "/proc/version/x"], {}, "/proc/version/x"),
    ("--out holds user files", ["run", "{d}/ss.json", "--out", "{d}/mine", "--force"], {"mine/notes.txt": "keep"}, "mine"),
    ("--resume missing", ["run", "--resume", "{d}/nope"], {}, "nope"),
    ("--resume a file", ["run", "--resume", "{d}/f.txt"], {"f.txt": "mine"}, "f.txt"),
    ("--resume not a run", ["run", "--resume", "{d}/empty"], {"empty": DIR}, "empty"),
    ("--resume with --set", ["run", "--resume", "{out}", "--set", "optim.steps=3"], {}, "--resume"),
    ("reproduce --resume another's directory", ["reproduce", "scan-snap/fig8", "--quick", "--out", "{out}", "--resume"],
     {"out/results.json": '{"experiment": "scan-snap/fig9", "claims": []}'}, "scan-snap/fig9's reproduction, not scan-snap/fig8's"),
    ("reproduce --resume another's unfinished one", ["reproduce", "scan-snap/fig8", "--quick", "--out", "{out}", "--resume"],
     {"out/.reproducing.json": '{"experiment": "scan-snap/fig9"}'}, "scan-snap/fig9's reproduction"),
    ("report missing", ["report", "{d}/nope"], {}, "nope"),
    ("report a file", ["report", "{d}/f.txt"], {"f.txt": "mine"}, "f.txt"),
    ("report an empty directory", ["report", "{d}/empty"], {"empty": DIR}, "empty"),
    ("sweep spec missing", ["sweep", "{d}/nope.yaml", "--out", "{out}"], {}, "nope.yaml"),
    ("sweep spec a directory", ["sweep", "{d}/spec.yaml", "--out", "{out}"], {"spec.yaml": DIR}, "spec.yaml"),
    ("sweep spec not UTF-8", ["sweep", "{d}/spec.yaml", "--out", "{out}"], {"spec.yaml": b"base: \xff\n"}, "spec.yaml"),
    ("sweep spec alias bomb", ["sweep", "{d}/spec.yaml", "--out", "{out}"], {"spec.yaml": BOMB}, "spec.yaml"),
    ("sweep --out below a file", ["sweep", "{d}/spec.json", "--out", "{d}/f.txt/sub", "--workers", "1"], GOOD_SPEC | {"f.txt": "mine"}, "f.txt"),
    ("sweep --out is a file", ["sweep", "{d}/spec.json", "--out", "{d}/f.txt", "--workers", "1"], GOOD_SPEC | {"f.txt": "mine"}, "f.txt"),
    ("sweep --summarize missing", ["sweep", "--summarize", "{d}/nope"], {}, "nope"),
    ("sweep without --out", ["sweep", "{d}/spec.json"], GOOD_SPEC, "--out"),
    ("reproduce --out below a file", ["reproduce", "scan-snap/fig4", "--quick", "--out", "{d}/f.txt/sub"], {"f.txt": "mine"}, "f.txt"),
    ("reproduce unknown", ["reproduce", "no-such/experiment", "--out", "{out}"], {}, "no-such/experiment"),
    ("--import missing file", ["--import", "{d}/nope.py", "list"], {}, "nope.py"),
    ("--import missing module", ["--import", "no_such_module_xyz", "list"], {}, "no_such_module_xyz"),
    ("--import file does not parse", ["--import", "{d}/bad.py", "list"], {"bad.py": "def (:\n"}, "bad.py"),
    ("--import file not UTF-8", ["--import", "{d}/bad.py", "list"], {"bad.py": b"x = '\xff'\n"}, "bad.py"),
    ("bench --out an existing file", ["bench", "--quick", "--only", "startup", "--out", "{d}/b.json"], {"b.json": "mine"}, "exists"),
    ("bench --out a directory", ["bench", "--quick", "--only", "startup", "--out", "{d}/bd", "--force"], {"bd": DIR}, "is a directory"),
    # ---- failing plugins and the user's own code: one line saying whose error it is (issue 36)
    ("--import a file that raises", ["--import", "{d}/boom.py", "list"], {"boom.py": "import nope_xyz_missing\n"}, ("boom.py", "nope_xyz_missing")),
    ("--import a relative name", ["--import", "..x", "list"], {}, "not a module name"),
    ("--import a name with a dash", ["--import", "my-tasks", "list"], {}, "not a module name"),
    ("--import a file raising at import", ["--import", "{d}/boom.py", "list"], {"boom.py": "1 / 0\n"}, "ZeroDivisionError"),
    ("plugin re-registers scan_snap", ["--import", "{d}/p.py", *ss()], {"p.py": "import tdyn\nfrom tdyn.schema import Strict\nclass D(Strict):\n    pass\ntdyn.register_task('scan_snap', D, D)(lambda c, m: None)\n"}, "'scan_snap' registered twice"),
    ("plugin re-registers a built-in probe", ["--import", "{d}/p.py", *ss()], {"p.py": "import tdyn\n@tdyn.probe('scan_snap.attention')\ndef f(ctx):\n    return {}\n"}, "'scan_snap.attention' registered twice"),
    ("PlainTask make_model returns None", plain_run("none"), plain("none"), "make_model"),
    ("PlainTask loss not a scalar", plain_run("vector"), plain("vector"), "not a scalar"),
    ("PlainTask make_model raises", plain_run("raise_model"), plain("raise_model"), ("my model is broken", "pt_raise_model.py")),
    ("PlainTask member_loss raises", plain_run("raise_loss"), plain("raise_loss"), ("KeyError", "pt_raise_loss.py")),
    # ---- non-UTF-8 files tdyn reads
    ("report a summary.csv not UTF-8", ["report", "{d}/sw"], {"sw/sweep.json": DIR, "sw/summary.csv": b"lr,loss\n\xff\xfe,1\n"}, ("summary.csv", "sweep.json")),
    ("run config JSON not UTF-8", ["run", "{d}/c.json", "--out", "{out}"], {"c.json": b'{"task": "\xff"}'}, "c.json"),
    ("sweep base config not UTF-8", SWEEP, {"spec.json": json.dumps({"base": "b.yaml"}), "b.yaml": b"task: \xfe\n"}, "b.yaml"),
    # ---- conflicting flags, empty paths (issue 36)
    ("--resume with --force", ["run", "--resume", "{d}/r", "--force"], {"r": DIR}, "--force"),
    ("--resume with another --out", ["run", "--resume", "{d}/r", "--out", "{out}"], {"r": DIR}, "--out"),
    ("--resume with --seed", ["run", "--resume", "{d}/r", "--seed", "3"], {"r": DIR}, "--seed"),
    ("--seed with --set seeds", ss("seeds=1,2") + ["--seed", "3"], {}, "--seed"),
    ("--seed with --set seeds spaced", ss(" seeds =4") + ["--seed", "3"], {}, "--seed"),
    ("reproduce --resume with --force", ["reproduce", "scan-snap/fig4", "--quick", "--out", "{out}", "--resume", "--force"], {}, "--force"),
    ("run --out empty", ["run", "{d}/ss.json", "--out", ""], {}, "--out"),
    ("run source empty", ["run", "", "--out", "{out}"], {}, "empty path"),
    ("run --resume empty", ["run", "--resume", ""], {}, "--resume"),
    ("sweep --out empty", ["sweep", "{d}/spec.json", "--out", ""], GOOD_SPEC, "--out"),
    ("reproduce --out empty", ["reproduce", "scan-snap/fig4", "--quick", "--out", ""], {}, "--out"),
    ("report dir empty", ["report", ""], {}, "empty path"),
    ("bench --out empty", ["bench", "--quick", "--only", "startup", "--out", ""], {}, "--out"),
    ("bench --force over a user's JSON", ["bench", "--quick", "--only", "startup", "--out", "{d}/mine.json", "--force"],
     {"mine.json": '{"my": "notes"}'}, ("mine.json", "did not write")),
    ("bench --force over a user's text", ["bench", "--quick", "--only", "startup", "--out", "{d}/notes.txt", "--force"],
     {"notes.txt": "my notes\n"}, ("notes.txt", "not a bench result")),
    ("bench --force over a directory", ["bench", "--quick", "--only", "startup", "--out", "{d}/res", "--force"],
     {"res": DIR}, ("res", "directory")),
    ("--import empty", ["--import", "", "list"], {}, "--import"),
    # ---- a sweep axis over a key the sweep sets itself (issue 36)
    ("sweep axis over seeds", SWEEP, {"spec.json": spec({"grid": {"seeds": [[0], [1]]}})}, "'seeds'"),
    ("sweep zip over ensemble.init_scales", SWEEP, {"spec.json": spec({"zip": {"ensemble.init_scales": [[1.0], [2.0]]}})}, "'ensemble.init_scales'"),
    ("sweep random over ensemble.lrs", SWEEP, {"spec.json": spec({"random": {"n": 2, "params": {"ensemble.lrs": {"kind": "choice", "values": [1]}}}})}, "'ensemble.lrs'"),
    ("sweep set: seeds", SWEEP, {"spec.json": spec(set=["seeds=3"])}, "seeds=3"),
    # ---- a key overridden twice: which value was meant is ambiguous (issue 36)
    ("--set a key twice", ss("optim.steps=3", "optim.steps=5"), {}, "'optim.steps' is given twice"),
    ("--set a key twice, one value", ss("optim.steps=3", " optim.steps = 3"), {}, "'optim.steps' is given twice"),
    ("--set a key and its section", ss("optim.groups.Y.lr=2", "optim.groups={}"), {}, "'optim.groups' holds"),
    ("reproduce --set a key twice", ["reproduce", "scan-snap/fig4", "--quick", "--out", "{out}", "--set", "seeds=1",
                                     "--set", "seeds=2"], {}, "'seeds' is given twice"),
    ("config --set a key twice", ["config", "scan-snap/fig4", "--set", "optim.steps=2", "--set", "optim.steps=3"], {},
     "'optim.steps' is given twice"),
    ("sweep set: a key twice", SWEEP, {"spec.json": spec(set=["optim.steps=3", "optim.steps=4"])}, "'optim.steps' is given twice"),
    # ---- the command line itself
    ("unknown command", ["frobnicate"], {}, "frobnicate"),
    ("unknown option", ["run", "{d}/ss.json", "--speed", "3"], {}, "--speed"),
    ("run without a source", ["run", "--out", "{out}"], {}, "tdyn run"),
    ("reproduce without --out", ["reproduce", "scan-snap/fig4"], {}, "--out"),
    ("reproduce a name and --all", ["reproduce", "scan-snap/fig4", "--all", "--out", "{out}"], {}, "--all"),
    ("device choice", ["reproduce", "scan-snap/fig4", "--out", "{out}", "--device", "tpu"], {}, "--device"),
    ("TDYN_THREADS zero", ss(), {}, "TDYN_THREADS"),
]
#: cases run with extra environment variables
ENV = {"TDYN_THREADS zero": {"TDYN_THREADS": "0"}, "TDYN_THREADS over the limit": {"TDYN_THREADS": "20000"},
       "sweep --executor slurm without Slurm": {"PATH": "/nonexistent-tdyn-test"}}   # no sbatch/srun, wherever it runs


def _write(d, files: dict) -> None:
    for name, content in (BASES | files).items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            p.mkdir(exist_ok=True)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


@pytest.mark.parametrize("case,argv,files,names", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused(preloaded_cli, tmp_path, case, argv, files, names):
    d = tmp_path / "case"
    _write(d, files)
    (d / "cwd").mkdir()
    out = d / "out"
    args = [a.replace("{out}", str(out)).replace("{d}", str(d)) for a in argv]
    before = tree_state(tmp_path, exclude=(out,))
    r = preloaded_cli(*args, cwd=d / "cwd", env=ENV.get(case))
    assert_rejected(r, names, before, tree_state(tmp_path, exclude=(out,)), case=case)


def test_table_is_large_enough():
    assert len(CASES) >= 100
    assert len({c[0] for c in CASES}) == len(CASES)
    assert set(ENV) <= {c[0] for c in CASES}


@pytest.mark.parametrize("argv", [["list"], ["--help"], ["list", "--help"]])
def test_a_closed_stdout_ends_quietly(tmp_path, argv):
    """Output piped into a reader that has gone (``tdyn list | head -1``): no traceback, nothing on stderr,
    exit 1 (0 for --help, printed by argparse, which ignores the error) — never a BrokenPipeError."""
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)                       # the reader is gone before tdyn writes a byte: deterministic EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "tdyn", *argv], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=120, cwd=tmp_path)
    finally:
        os.close(w)
    assert p.stderr == "", p.stderr
    assert p.returncode in ((0,) if "--help" in argv else (1,)), p.returncode


def test_a_key_overridden_twice_is_refused_by_the_api():
    """``tdyn.load_config(source, overrides)`` refuses a key given twice as the CLI does (one UserError naming it);
    distinct keys, siblings included, are applied."""
    import tdyn
    from tdyn.errors import UserError

    with pytest.raises(UserError, match="'optim.steps' is given twice"):
        tdyn.load_config(SS, ["optim.steps=3", "optim.steps=3"])
    cfg = tdyn.load_config(SS, ["optim.groups.Y.lr=2", "optim.groups.Z.lr=3", "optim.steps=5"])
    assert (cfg.optim.groups["Y"].lr, cfg.optim.groups["Z"].lr, cfg.optim.steps) == (2.0, 3.0, 5)
