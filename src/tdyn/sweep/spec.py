"""Sweep specs and their expansion into runs and batched jobs.

A spec names a base (experiment or config file, or an inline ``config``), base overrides, axes
(``grid``: product; ``zip``: lists taken together; ``random``: ``n`` seeded samples) and ``seeds``.
Every cell × seed is one run with a stable directory name derived from its overrides
(:func:`tdyn.runs.run_name`, which names an ensemble's members too). Runs that
differ only in seed, learning rates (``optim.groups.<g>.lr``) or init scale are trained as one
ensemble job.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from tdyn.config import (_parse_scalar, apply_overrides, check_unique_overrides, format_validation_error,
                         is_file_source, packaged, read_config_file, read_source, validate_config)
from tdyn.runs import INIT_AXIS, LR_AXIS, run_name
from tdyn.errors import ConfigError, check_arg
from tdyn.schema import Strict, check_finite
from tdyn.train.trainer import check_resources, expand_members

_LR_KEY = re.compile("^" + re.escape(LR_AXIS).replace(re.escape("{}"), "([^.]+)") + "$")   # optim.groups.<g>.lr
INIT_KEY = INIT_AXIS


class RandomAxis(Strict):
    """``kind`` ∈ uniform | loguniform (over [low, high]) | choice (over ``values``)."""

    kind: Literal["uniform", "loguniform", "choice"]
    low: float | None = None
    high: float | None = None
    values: list[Any] = []

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "choice":
            if not self.values:
                raise ValueError("a choice axis needs a non-empty list of values")
            check_finite(self.values, "values")
            return self
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.kind} axis needs low and high")
        if self.low > self.high:
            raise ValueError(f"low = {self.low:g} > high = {self.high:g}: the range must be ordered (low <= high)")
        if self.kind == "loguniform" and self.low <= 0:
            raise ValueError(f"low = {self.low:g}: a loguniform range must be positive")
        return self


#: The most runs a sweep may plan (cells × seeds): each is a run directory, and planning holds them all in memory.
MAX_RUNS = 100_000


class RandomAxes(Strict):
    n: int = Field(ge=1, le=MAX_RUNS)
    seed: int = 0
    params: dict[str, RandomAxis] = Field(min_length=1)


class Axes(Strict):
    grid: dict[str, list[Any]] = {}
    zip: dict[str, list[Any]] = {}
    random: RandomAxes | None = None

    @field_validator("grid", "zip")
    @classmethod
    def _values(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for k, v in axes.items():
            if not v:
                raise ValueError(f"axis {k!r} is empty: give it at least one value (or remove it)")
            check_finite(v, k)
        return axes

    @model_validator(mode="after")
    def _zip_lengths(self):
        lengths = {len(v) for v in self.zip.values()}
        if len(lengths) > 1:
            raise ValueError(f"axes.zip lists must have equal lengths, got {sorted(lengths)}")
        return self

    @model_validator(mode="after")
    def _one_axis_per_key(self):
        """A key varied by two axes: a cell takes one value per key, so one axis would silently replace the
        other's values (``cells`` merges grid | zip | random): refused, naming the key and both axes."""
        seen: dict[str, str] = {}
        kinds = {"grid": self.grid, "zip": self.zip, "random": self.random.params if self.random else {}}
        for kind, keys in kinds.items():
            for k in keys:
                key = k.strip()   # as --set reads it
                if key in seen:
                    raise ValueError(f"{key!r} is varied by two axes, axes.{seen[key]} and axes.{kind}: a run takes "
                                     f"one value per key; give its values in one axis")
                seen[key] = kind
        return self


class SlurmOptions(Strict):
    """What a Slurm job of the sweep asks for (``--executor slurm``; submitit's ``AutoExecutor``).
    Spec section ``slurm:``; the ``--slurm-*`` options of ``tdyn sweep`` override it."""

    partition: str | None = None
    time_min: int = Field(60, ge=1)          # submitit's own default (5 min) would kill real jobs
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: int = Field(1, ge=1)
    mem_gb: float | None = Field(None, gt=0)
    account: str | None = None
    extra: dict[str, str] = {}               # further sbatch flags, e.g. {qos: high} → #SBATCH --qos=high

    def submitit_parameters(self) -> dict[str, Any]:
        """The parameters of ``submitit.AutoExecutor.update_parameters``."""
        p = {"timeout_min": self.time_min, "gpus_per_node": self.gpus_per_node, "cpus_per_task": self.cpus_per_task,
             "slurm_partition": self.partition, "mem_gb": self.mem_gb, "slurm_account": self.account,
             "slurm_additional_parameters": dict(self.extra) or None}
        return {k: v for k, v in p.items() if v is not None}


#: The run config keys a sweep sets on every job itself (``plan``), with what to use instead.
SWEEP_SETS = {"seeds": "list the seeds in the spec's own seeds: (every cell runs each of them)",
              "ensemble": f"give learning rates as axes over optim.groups.<group>.lr and init scales as an axis "
                          f"over {INIT_KEY}"}


class SweepSpec(Strict):
    base: str | None = None          # experiment name or config file
    config: dict[str, Any] | None = None
    set: list[str] = []
    axes: Axes = Axes()
    seeds: list[int] = Field([0], min_length=1)
    job_members: int | None = Field(None, ge=1, description=(
        "most members per ensemble job; a larger job is split by seeds (default: an eighth of the sweep's "
        "runs, at least 16, so that no single job is the makespan of a multi-worker sweep; on CUDA no cap)"))
    slurm: SlurmOptions = SlurmOptions()

    @model_validator(mode="after")
    def _one_base(self):
        if (self.base is None) == (self.config is None):
            raise ValueError("give exactly one of base (experiment name or config file) and config (inline)")
        return self

    @model_validator(mode="after")
    def _owned_keys(self):
        """An axis or ``set:`` override of a key the sweep sets on every job itself would be silently
        replaced (two identically trained runs under different names): refused, naming the key."""
        keys = [*self.axes.grid, *self.axes.zip, *(self.axes.random.params if self.axes.random else {})]
        named = [(f"axis {k!r}", k) for k in keys] + [(f"set: {o!r}", o.split("=", 1)[0].strip()) for o in self.set]
        for where, k in named:
            top = k.split(".", 1)[0]
            if top in SWEEP_SETS:
                raise ValueError(f"{where}: the sweep sets {top!r} of every job itself — {SWEEP_SETS[top]}")
        return self

    @model_validator(mode="after")
    def _set_not_swept(self):
        """A ``set:`` override of a key an axis varies (or of a section holding it, or inside it) would be
        replaced by every cell's value, silently: refused, naming both."""
        for o in self.set:
            hit = swept_by(self.axes, o.split("=", 1)[0])
            if hit:
                raise ValueError(f"set: {o!r} sets {hit[1]!r}, which axes.{hit[0]} varies: every run takes the axis' "
                                 f"value; drop the override or the axis")
        return self

    @model_validator(mode="after")
    def _size(self):
        """The number of runs, from the axes' lengths (nothing expanded), against :data:`MAX_RUNS`."""
        n = len(self.seeds) * (self.axes.random.n if self.axes.random else 1)
        n *= len(next(iter(self.axes.zip.values()))) if self.axes.zip else 1
        for values in self.axes.grid.values():
            n *= len(values)
        if n > MAX_RUNS:
            raise ValueError(f"the sweep has {n:,} runs (grid × zip × random × seeds); at most {MAX_RUNS:,}")
        return self


def _segments(key: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in key.strip().split("."))


def swept_by(axes: Axes, key: str) -> tuple[str, str] | None:
    """(axis kind, axis key) of the axis that varies ``key``, a section holding it or a key inside it; None."""
    path = _segments(key)
    kinds = {"grid": axes.grid, "zip": axes.zip, "random": axes.random.params if axes.random else {}}
    for kind, keys in kinds.items():
        for k in keys:
            other = _segments(k)
            if other[:len(path)] == path or path[:len(other)] == other:
                return kind, k.strip()
    return None


def with_overrides(spec: SweepSpec, overrides: list[str]) -> SweepSpec:
    """``spec`` with ``overrides`` (``tdyn sweep SPEC --set K=V``, ``tdyn.sweep(..., overrides=[...])``) applied
    to its base config: each replaces the spec's own ``set:`` entry for the same key, and is added to ``set:``
    (so sweep.json records it, and a re-run with the same overrides continues the sweep). An override of a key
    a sweep axis varies, or of ``seeds`` / ``ensemble`` (the sweep sets them on every job), is a one-line
    ConfigError naming it, as is a key given twice or a key inside a section also given."""
    for o in overrides:
        if not isinstance(o, str) or "=" not in o:
            raise ConfigError(f"--set {o!r}: must look like key.path=value")
        key = o.split("=", 1)[0].strip()
        hit = swept_by(spec.axes, key)
        if hit:
            raise ConfigError(f"--set {o}: {hit[1]!r} is an axis of the sweep (axes.{hit[0]}): every run takes the "
                              f"axis' value, so the override would be shadowed; drop it, or change the axis")
        top = key.split(".", 1)[0]
        if top in SWEEP_SETS:
            raise ConfigError(f"--set {o}: the sweep sets {top!r} of every job itself — {SWEEP_SETS[top]}")
    check_unique_overrides(list(overrides))
    mine = {_segments(o.split("=", 1)[0]) for o in overrides}
    kept = [o for o in spec.set if _segments(o.split("=", 1)[0]) not in mine]
    try:
        return SweepSpec.model_validate(spec.model_dump() | {"set": [*kept, *overrides]})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, SweepSpec).replace("config error", "sweep spec error")) from None


def load_spec(source: str | Path | dict) -> SweepSpec:
    """A sweep spec from a dict, a YAML/JSON file or a packaged spec's name (``syn_small_lr``). A file's
    ``base:`` naming a config file is resolved relative to the spec file (so a spec and its base travel
    together), stored as an absolute path."""
    check_arg("tdyn.sweep", "spec", source, str, Path, dict, SweepSpec,
              what="a sweep spec (a dict, a SweepSpec, or a YAML/JSON file or packaged spec name)")
    if not isinstance(source, dict) and not is_file_source(source):
        shipped = packaged("sweep")
        if str(source) not in shipped:
            raise ConfigError(f"sweep spec {str(source)!r} is neither a spec file nor a packaged sweep spec "
                              f"({', '.join(shipped)})")
        source = shipped[str(source)]
    raw = source if isinstance(source, dict) else read_config_file(source)
    if not isinstance(source, dict) and isinstance(raw, dict) and isinstance(raw.get("base"), str):
        near = Path(source).resolve().parent / raw["base"]
        if near.is_file():
            raw = dict(raw, base=str(near.resolve()))
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, SweepSpec).replace("config error", "sweep spec error")) from None


def _split_top(text: str) -> list[str]:
    """``text`` cut at the commas outside brackets, braces and quotes (``[1,2],[3,4]`` → two values)."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur]


def is_spec_source(source: str | Path) -> bool:
    """Whether ``source`` names a sweep spec (a packaged one, or a file with ``base``/``config``/``axes`` and no
    ``task``) rather than a run config."""
    if not is_file_source(source):
        return str(source) in packaged("sweep")
    raw = read_config_file(source)
    return isinstance(raw, dict) and "task" not in raw and bool({"base", "config", "axes"} & set(raw))


def multirun_spec(base: str | Path, items: list[str]) -> SweepSpec:
    """Hydra's multirun from the command line (``tdyn sweep BASE -m key=a,b key2=x,y``) as the sweep spec a
    YAML grid would be: ``key=a,b`` (values cut at the commas outside brackets, each read as YAML, as ``--set``
    reads a value) is an axis of ``axes.grid`` (every combination), ``key=v`` (one value) an override in
    ``set:``, and ``seeds=0,1,2`` the spec's ``seeds``. ``BASE``: a packaged config name, a reproduction's
    config (``NAME`` or ``NAME:CONFIG``) or a config file (stored as an absolute path, as a spec file's
    ``base:`` is); a sweep spec is refused (its axes belong in its ``axes.grid``)."""
    if is_spec_source(base):
        raise ConfigError(f"-m: {str(base)!r} is a sweep spec; -m builds a sweep from a run config (BASE: a "
                          f"packaged config, a reproduction's config or a config file): add the axes to the spec's "
                          f"axes.grid, or give its base")
    check_unique_overrides(list(items))
    grid: dict[str, list[Any]] = {}
    sets: list[str] = []
    seeds: list[Any] | None = None
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"-m {item!r}: must look like key.path=a,b (an axis) or key.path=value (an override)")
        key, text = (x.strip() for x in item.split("=", 1))
        values = [_parse_scalar(v.strip()) for v in _split_top(text)] if text else [""]
        if key == "seeds":
            seeds = [v for x in values for v in (x if isinstance(x, list) else [x])]
        elif len(values) > 1:
            grid[key] = values
        else:
            sets.append(f"{key}={text}")
    raw: dict[str, Any] = {"base": str(Path(base).resolve()) if is_file_source(base) else str(base), "set": sets,
                           "axes": {"grid": grid}}
    if seeds is not None:
        raw["seeds"] = seeds
    return load_spec(raw)


def base_config(spec: SweepSpec) -> dict:
    return read_source(spec.config if spec.config is not None else spec.base, what="base")


def cells(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every cell's axis values (grid × zip × random), in a stable order."""
    grid = [dict(zip(spec.axes.grid, vals)) for vals in itertools.product(*spec.axes.grid.values())]
    n_zip = len(next(iter(spec.axes.zip.values()))) if spec.axes.zip else 1
    zipped = [{k: v[i] for k, v in spec.axes.zip.items()} for i in range(n_zip)]
    rand = [{}]
    if spec.axes.random:
        r = spec.axes.random
        rng = np.random.default_rng(r.seed)
        rand = []
        for _ in range(r.n):
            sample = {}
            for k, a in r.params.items():
                if a.kind == "choice":
                    sample[k] = a.values[int(rng.integers(len(a.values)))]
                elif a.kind == "uniform":
                    sample[k] = float(rng.uniform(a.low, a.high))
                else:
                    sample[k] = float(math.exp(rng.uniform(math.log(a.low), math.log(a.high))))
            rand.append(sample)
    return [g | z | r for g in grid for z in zipped for r in rand]


@dataclasses.dataclass
class Run:
    name: str
    axes: dict[str, Any]
    seed: int


@dataclasses.dataclass
class JobPlan:
    """One ensemble job: a validated config whose members are exactly ``runs`` (in member order)."""

    id: str
    config: dict
    runs: list[Run]


def _override(k: str, v: Any) -> str:
    return f"{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}"


_MIN_AUTO_JOB = 16   # the automatic cap never cuts jobs below this many members (ensembles amortise)


def _auto_cap(device: str, runs: int) -> int:
    """The default job size: an eighth of the sweep's runs (at least 16), so that the workers share the largest
    jobs; on CUDA no cap (one worker, whose GPU trains a job of these sizes at about one member's cost per step:
    tdyn bench's scan_snap_member_steps and fig6_sweep)."""
    return runs if device == "cuda" else max(_MIN_AUTO_JOB, math.ceil(runs / 8))


def seed_chunks(spec: SweepSpec, cells: int, runs: int, device: str = "cpu") -> list[list[int]]:
    """The seeds of one group of ``cells`` cells, cut into as few consecutive chunks of near-equal size as
    keep every job at most ``spec.job_members`` members (cells × seeds; ``runs``: the sweep's). Members are independent, so a
    split changes no result, only which process trains which run (tests/test_sweep.py checks that it is
    bit for bit); the default cap is an eighth of the sweep's runs (at least 16), so the largest job of a sweep (Fig 6:
    four jobs of 160) becomes several that the workers share; on CUDA (``device``: the jobs' config) no cap."""
    seeds = list(spec.seeds)
    cap = spec.job_members or _auto_cap(device, runs)
    k = min(len(seeds), max(1, math.ceil(cells * len(seeds) / cap)))
    q, r = divmod(len(seeds), k)
    out, i = [], 0
    for j in range(k):
        n = q + (j < r)
        out.append(seeds[i:i + n])
        i += n
    return out


def plan(spec: SweepSpec) -> list[JobPlan]:
    """Group the spec's runs into ensemble jobs (seeds × lr sets × init scales on the leading axis)."""
    base = apply_overrides(base_config(spec), spec.set)
    groups: dict[str, list[dict]] = {}
    all_cells = cells(spec)
    names = sorted(run_name(c, seed) for c in all_cells for seed in spec.seeds)
    same = [a for a, b in zip(names, names[1:]) if a == b]
    if same:   # e.g. a rate given twice (1e-3 and 0.001): never one run trained for two, or two in one directory
        raise ConfigError(f"sweep: two runs are named {same[0]!r} (the same overrides); axes must not repeat values")
    for cell in all_cells:
        fixed = {k: v for k, v in cell.items() if not _LR_KEY.match(k) and k != INIT_KEY}
        groups.setdefault(json.dumps(fixed, sort_keys=True, default=str), []).append(cell)
    jobs = []
    for key, group in groups.items():
        fixed = json.loads(key)
        raw = apply_overrides(base, [_override(k, v) for k, v in fixed.items()])
        cfg0 = validate_config(raw)
        lr_sets = [tuple(sorted((_LR_KEY.match(k).group(1), float(v)) for k, v in c.items() if _LR_KEY.match(k)))
                   for c in group]
        scales = [float(c.get(INIT_KEY, 1.0)) for c in group]
        uniq_lr, uniq_sc = sorted(set(lr_sets)), sorted(set(scales))
        full_product = len(group) == len(uniq_lr) * len(uniq_sc) and len(set(zip(lr_sets, scales))) == len(group)
        subgroups = [group] if full_product else [[c for c, s in zip(group, scales) if s == sc] for sc in uniq_sc]
        for sub in subgroups:
            sub_lr = sorted({lr for c, lr in zip(group, lr_sets) if c in sub})
            sub_sc = sorted({s for c, s in zip(group, scales) if c in sub})
            by_member = {}
            for c in sub:
                lr = dict(lr_sets[group.index(c)])
                sc = float(c.get(INIT_KEY, 1.0))
                for seed in spec.seeds:
                    by_member[(seed, tuple(sorted(lr.items())), sc)] = Run(run_name(c, seed), c, seed)
            for seeds in seed_chunks(spec, len(sub), len(all_cells) * len(spec.seeds), cfg0.device):
                d = cfg0.model_dump(mode="json")
                d["seeds"] = seeds
                d["ensemble"] = {"lrs": [dict(lr) for lr in sub_lr] if any(sub_lr) else [],
                                 "init_scales": sub_sc if INIT_KEY in sub[0] else []}
                job_cfg = validate_config(d)
                members = expand_members(job_cfg)
                check_resources(job_cfg, members)   # a job too large for memory: refused before the sweep starts
                runs_ = [by_member[(m.seed, tuple(sorted({g: m.lrs[g] for g in dict(lr_sets[0])}.items())),
                                    m.init_scale)] for m in members]
                jobs.append(JobPlan(f"job{len(jobs):04d}", d, runs_))
    return jobs
