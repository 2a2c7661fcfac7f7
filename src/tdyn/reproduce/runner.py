"""Running reproductions: one (``tdyn reproduce NAME``) or every registered one
(``tdyn reproduce --all``) into ``DIR/<slug(name)>/`` followed by the report page ``DIR/index.html``."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from concurrent.futures.process import BrokenProcessPool
import json
import math
import platform
import shlex
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any

import tdyn
from tdyn import docs, papers, runs
from tdyn.errors import UserError
from tdyn.config import _parse_scalar, override_key
from tdyn.errors import ConfigError
from tdyn.reproduce.common import configure, write_results
from tdyn.probes import PROBES
from tdyn.registry import NAMES
from tdyn.tasks import TASKS
from tdyn.reproduce.registry import CATALOG, EXPERIMENTS, Experiment, Overrides, ReproduceContext, _option_entry, all_experiments, get
from tdyn.report.html import build_index, metadata, slug
from tdyn.report import verdicts
from tdyn.report.verdicts import count_line
from tdyn.sweep.executors import process_pool, terminate
from tdyn.runs import REPRODUCE as MANIFEST, prepare_dir  # noqa: F401  (prepare_dir: used by the CLI)


def descriptions() -> dict[str, str]:
    """Every reproduction's one-line description (for the report pages), from the papers' manifests and
    the registrations made so far: no reproduction module is imported to say what it is."""
    out = {n: r.description for p in papers.manifests() for n, r in p.reproductions.items()}
    return out | {n: e.description for n, e in EXPERIMENTS._items.items() if n not in out}


def accepts(exp: Experiment) -> str:
    """What ``exp`` accepts, for error messages."""
    opts = ", ".join(f"--{f.replace('_', '-')}" for f in exp.options.model_fields) if exp.options else ""
    if exp.takes_set is False:
        what = "no --set (it trains no run config)"
    elif exp.configs is not None:
        what = f"--set on the keys of its run configs (`tdyn config {exp.name}` prints them)"
    else:
        what = "--set on its run configs"
    return f"{exp.name} accepts {what}" + (f"; options: {opts}" if opts else "; no options")


def resolved_configs(exp: Experiment, ctx: ReproduceContext) -> dict[str, Any]:
    """Every run config ``exp`` trains, after ``ctx.overrides``, validated (RunConfig by name); a bad or
    shadowed override is a ConfigError naming the config."""
    if exp.configs is None:
        if exp.default_config is None:
            raise UserError(f"{exp.name} declares no run config; {accepts(exp)}")
        raws = {exp.name: exp.default_config()}
    else:
        raws = exp.configs(ctx)
    out = {}
    for name, raw in raws.items():
        overrides = Overrides(ctx.overrides)     # a copy (not marked consumed) that keeps --device
        overrides.device = ctx.device
        try:
            out[name] = configure(raw, overrides)
        except ConfigError as e:
            raise ConfigError(f"{exp.name} [{name}]: {e}; {accepts(exp)}") from None
    return out


def check_overrides(exp: Experiment, ctx: ReproduceContext, *, claims: bool = True) -> None:
    """Before anything runs: an override ``exp`` cannot use exits 2 with what it accepts; with ``claims`` (a
    reproduction that will judge), so does one that would change what its claims are about (a key one of its
    options writes, a key its runs differ in, a key its manifest declares ``fixed``). ``tdyn config`` exports
    configs for ``tdyn run`` and judges nothing: it checks without ``claims``."""
    if not ctx.overrides:
        return
    fields = exp.options.model_fields if exp.options else {}
    for o in ctx.overrides:
        k = override_key(o)
        if k in fields:
            flag, value = f"--{k.replace('_', '-')}", o.split("=", 1)[-1].strip()
            try:                 # the value only where the option takes it (topic's --seeds is a count, not a list)
                parsed = _parse_scalar(value)
                exp.make_options({k: parsed})
                use = f"use {flag} {','.join(map(str, parsed)) if isinstance(parsed, list) else value}"
            except (UserError, ConfigError, ValueError, TypeError):
                use = f"use {flag} (`tdyn reproduce {exp.name} --help` says what it takes)"
            raise UserError(f"--set {o}: {k!r} is an option of {exp.name}, not a config key; {use}")
    if exp.takes_set is False:
        raise UserError(f"--set {ctx.overrides[0]}: {accepts(exp)}")
    if not claims:
        if exp.configs is not None:
            resolved_configs(exp, ctx)
        return
    declared = papers.of(exp.name)
    declared = declared.reproductions.get(exp.name) if declared else None
    for o in ctx.overrides if declared else ():
        k = override_key(o)
        for key, why in declared.fixed.items():
            if key == k or key.startswith(k + ".") or k.startswith(key + "."):
                raise UserError(f"--set {o}: {exp.name}'s claims take {key!r} as given ({why})")
    if exp.configs is not None:
        _check_option_keys(exp, ctx, fields)
        _check_compared_keys(exp, ctx)
        resolved_configs(exp, ctx)


def _at(raw: dict, key: str) -> Any:
    """The value at ``key`` (dotted) in a raw config, or ``_MISSING``."""
    node: Any = raw
    for part in (p.strip() for p in key.split(".")):
        node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
    return node


def _check_compared_keys(exp: Experiment, ctx: ReproduceContext) -> None:
    """A ``--set`` key whose value differs between ``exp``'s run configs exits 2: the reproduction compares its
    runs along it (icl-gd's depths ``model.layers``, a corpus, a masking rate, claim 2's ε) or gives each run its
    own value (icl-gd's per-depth clipping), and its claims name those values."""
    bare = dataclasses.replace(ctx, overrides=[])
    if len(exp.configs(bare)) < 2:
        return
    raws = {n: c.model_dump(mode="json") for n, c in resolved_configs(exp, bare).items()}
    for o in ctx.overrides:
        k = override_key(o)
        seen: dict[str, str] = {}
        for name, raw in raws.items():
            v = _at(raw, k)
            seen.setdefault("(none)" if v is _MISSING else json.dumps(v, sort_keys=True, default=str), name)
        if len(seen) > 1:
            shown = ", ".join(f"{n}: {v if len(v) <= 40 else v[:37] + '...'}" for v, n in list(seen.items())[:3])
            more = f" and {len(seen) - 3} more values" if len(seen) > 3 else ""
            raise UserError(f"--set {o}: {exp.name}'s runs differ in {k!r} ({shown}{more}), and its claims name "
                            f"each run's own value; one value for all would judge runs made otherwise (`tdyn run "
                            f"{exp.name}:CONFIG --set ...` trains one of them with it)")


def _check_option_keys(exp: Experiment, ctx: ReproduceContext, fields) -> None:
    """A nested key that one of ``exp``'s options writes (``--set data.x_max=0.5`` where ``--x-max`` sets
    ``data.x_max``) exits 2 naming the option: the option is what the reproduction's judge, theory and
    labels read, so overriding the key alone would change the runs under claim texts that still state the
    option's value. The option writes the key when giving the option the override's value changes the key
    in some run config (the configs built twice, before any override)."""
    nested = [(o, override_key(o)) for o in ctx.overrides if "." in override_key(o)]
    nested = [(o, k) for o, k in nested if k.rsplit(".", 1)[-1].strip() in fields]
    if not nested:
        return
    from pydantic import ValidationError

    options = ctx.options if ctx.options is not None else exp.make_options()

    def key_values(opts, k: str) -> list:
        raws = exp.configs(dataclasses.replace(ctx, options=opts, overrides=[]))
        out = []
        for raw in raws.values():
            node = _at(raw, k)
            out.append(None if node is _MISSING else json.dumps(node, sort_keys=True, default=str))
        return out

    for o, k in nested:
        leaf = k.rsplit(".", 1)[-1].strip()
        try:
            moved = options.model_validate(options.model_dump() | {leaf: _parse_scalar(o.split("=", 1)[-1])})
        except (ValidationError, ValueError, TypeError):
            continue                  # not a value of the option: the key is the config's alone
        try:
            changes = key_values(moved, k) != key_values(options, k)
        except (UserError, ConfigError, ValueError, TypeError):
            continue                  # the reproduction cannot plan at that value: the key is not the option's
        if changes:
            flag = f"--{leaf.replace('_', '-')}"
            raise UserError(f"--set {o}: {k!r} is written by {exp.name}'s option {flag} (the reproduction reads "
                            f"the option, not the key); use {flag} {o.split('=', 1)[-1].strip()}")


_MISSING = object()


def command(exp: Experiment, ctx: ReproduceContext) -> str:
    """The one command that makes ``ctx.out``'s results again: ``tdyn reproduce NAME --out OUT --force`` with the
    setting, seed, device, overrides and options (those not at their defaults) of ``ctx``."""
    parts = ["tdyn", "reproduce", exp.name, "--out", str(ctx.out), "--judge-only" if ctx.judge_only else "--force"]
    if ctx.quick and not ctx.judge_only:
        parts.append("--quick")
    if ctx.seed:
        parts += ["--seed", str(ctx.seed)]
    if ctx.device != "cpu":
        parts += ["--device", ctx.device]
    for o in [] if ctx.judge_only else ctx.overrides:    # --judge-only takes the tables' own overrides
        parts += ["--set", o]
    if ctx.options is not None and exp.options is not None:
        default = exp.make_options().model_dump(mode="json")
        for k, v in ctx.options.model_dump(mode="json").items():
            if v != default.get(k) and v is not None:
                parts += [f"--{k.replace('_', '-')}", ",".join(map(str, v)) if isinstance(v, list) else str(v)]
    return shlex.join(parts)


def _dirty() -> bool | None:
    """Whether the checkout's tracked source differs from its commit (None outside a checkout)."""
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/src"],
                           cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10)
        return bool(r.stdout.strip()) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def made(exp: Experiment, ctx: ReproduceContext) -> dict[str, Any]:
    """Where a results.json comes from (its ``made`` block): tdyn version, git commit (and whether the
    source had uncommitted changes), date, machine, the setting and the one command that regenerates it."""
    import torch

    info = runs.machine_info()
    machine = (f"{platform.node()}: {info['processor']}, {info['cpu_count']} CPU cores, torch {info['torch']} "
               f"({info['torch_threads']} threads)")
    if ctx.device == "cuda" and torch.cuda.is_available():
        machine += f", {torch.cuda.get_device_name(0)}"
    commit = runs.git_commit()
    return {"tdyn": tdyn.__version__, "git_commit": commit, "uncommitted_changes": _dirty() if commit else None,
            "date": runs.now(), "machine": machine, "native": info["native"], "device": ctx.device,
            "resumed": bool(ctx.resume),
            "setting": "quick" if ctx.quick else "full", "command": command(exp, ctx)}


def run_reproduction(exp: Experiment, ctx: ReproduceContext) -> dict[str, Any]:
    """Run one reproduction into ``ctx.out`` and write its ``results.json`` (with run time and options).

    ``--set`` overrides are checked first (:func:`check_overrides`); overrides that no run config
    consumed (a reproduction that does not declare its configs) are an error after the run."""
    if ctx.options is None and exp.options is not None:
        ctx.options = exp.make_options()
    check_overrides(exp, ctx)
    previous = _tables_made(exp, ctx) if ctx.judge_only else None
    t0 = time.time()
    # until its results.json: what makes OUT a reproduction's (tdyn's) for --resume and --force, whatever
    # the reproduction has written so far
    runs.write_json(ctx.out / runs.REPRODUCING, {"experiment": exp.name, "started": runs.now()})
    results = exp.reproduce(ctx)
    if ctx.overrides and not ctx.overrides.consumed and not ctx.judge_only:   # judged again: consumed when trained
        raise UserError(f"{exp.name} used none of --set {' '.join(ctx.overrides)}; {accepts(exp)}")
    if ctx.overrides:
        results.setdefault("overrides", list(ctx.overrides))
    if ctx.options is not None and ctx.options != exp.make_options():  # recorded when not the defaults
        results.setdefault("options", ctx.options.model_dump(mode="json"))
    results.setdefault("experiment", exp.name)
    if docs.ref(exp.name):
        results.setdefault("docs", docs.ref(exp.name))   # the reproduction's section in docs/reproductions/
    results["quick"] = ctx.quick
    results["made"] = made(exp, ctx)   # provenance: commit, date, machine, the command that regenerates it
    for c in results.get("claims", []):  # every verdict carries its setting: quick ones are labelled as such
        c["quick"] = ctx.quick
    results["wall_seconds"] = round(time.time() - t0, 2)
    if previous is not None:   # judged again: the tables' provenance and cost stay; the judgement says when and how
        results["judged"] = {"date": runs.now(), "git_commit": runs.git_commit(), "command": command(exp, ctx),
                             "seconds": results["wall_seconds"]}
        for k in ("made", "wall_seconds", "overrides", "options"):
            if k in previous:
                results[k] = previous[k]
    for c in results.get("claims", []) if results.get("overrides") else ():   # judged off the reproduction's setting
        c["overrides"] = list(results["overrides"])
    write_results(ctx.out, results)
    return results


def _tables_made(exp: Experiment, ctx: ReproduceContext) -> dict[str, Any]:
    """``--judge-only``: the results.json whose tables are judged again; the context takes its setting
    (quick or full) and options, so that the judgement is made as it was."""
    previous = runs.read_json(ctx.out / runs.RESULTS)
    ctx.quick = bool(previous.get("quick"))
    # an older directory (``--from-tables``) recorded them as ``tables_trained_with_overrides``
    made_with = list(previous.get("overrides") or previous.get("tables_trained_with_overrides") or [])
    if ctx.overrides and list(ctx.overrides) != made_with:
        raise UserError(f"--judge-only judges {ctx.out}'s tables as they were made ("
                        + (f"--set {' '.join(made_with)}" if made_with else "without --set")
                        + f"): drop --set {' '.join(ctx.overrides)}")
    if made_with:               # the judge rebuilds the configs the tables were trained with
        ctx.overrides = Overrides(made_with)
        ctx.overrides.device = ctx.device
    if exp.options is not None and previous.get("options"):   # options given now win over the recorded ones
        default = exp.make_options().model_dump(mode="json")
        given = {k: v for k, v in ctx.options.model_dump(mode="json").items() if v != default.get(k)}
        recorded = {k: v for k, v in previous["options"].items() if k in default}
        ctx.options = exp.make_options(recorded | given)
    return previous


def reproduce_all(out: str | Path, *, seed: int = 0, quick: bool = False, overrides: list[str] | None = None,
                  device: str = "cpu", progress: bool = True, force: bool = False, resume: bool = False,
                  names: list[str] | None = None, evidence: str | Path | None = None,
                  full_under: float | None = None, jobs: int = 1) -> tuple[Path, list[str]]:
    """Run every registered reproduction (or ``names``) into ``out/<slug>/``, going on past failures
    (a failed one gets a ``results.json`` with its error and traceback), then write ``out/index.html``.
    ``evidence``: a directory of full-setting results (the shipped ``docs/results``) that the page leads
    with. ``full_under`` (with ``quick`` and ``evidence``): a reproduction whose full-setting evidence took
    at most that many seconds runs at full settings here (its verdicts are re-derived, not shipped); the
    others run quick, as a check that the pipeline runs here.
    ``resume``: continue an interrupted ``out`` made with the same options: reproductions it finished are
    kept, the others continue (their finished runs kept, interrupted ones resumed, as ``reproduce NAME
    --resume``). ``jobs``: how many reproductions run at once, each in a worker process, the longest
    first by ``evidence``'s run times (``tdyn reproduce --all --jobs 2``: both cores busy).

    Returns the page's path and the names of the reproductions that failed.
    """
    out = Path(out)
    if not (isinstance(jobs, int) and jobs >= 1):
        raise UserError(f"--jobs {jobs!r}: must be a whole number >= 1")
    exps = [e for e in all_experiments().values() if names is None or e.name in names]
    for user, source in shares_runs().items():     # a reproduction that reads another's runs comes after it
        if user in [e.name for e in exps] and source in [e.name for e in exps]:
            u = next(e for e in exps if e.name == user)
            exps.remove(u)
            exps.insert(next(i for i, e in enumerate(exps) if e.name == source) + 1, u)
    full_here = plan_full(evidence, full_under, quick, [e.name for e in exps])
    if overrides:
        _check_all_overrides(exps, overrides, seed=seed, device=device,
                             quick_of=_quick_of(exps, quick, full_here, device))
    with runs.Locks() as locks:   # one writer per directory: a second reproduce --all into out is refused
        prepare_dir(out, force or resume, locks=locks, flag="--force" if force else "--resume")
        previous: list[dict] = []
        if resume and (out / MANIFEST).exists():
            old = runs.read_manifest(out / MANIFEST)
            mine = {"seed": seed, "quick": quick, "overrides": list(overrides or []), "device": device,
                    "full_under": full_under}
            if {k: old.get(k) for k in mine} != mine:
                raise UserError(f"--resume: {str(out)!r} was made with other options than these "
                                f"({', '.join(f'{k} {v!r}' for k, v in mine.items())}); run it with its own, or "
                                f"choose another --out")
            previous = old["reproductions"]
        return _reproduce_all(out, exps, seed=seed, quick=quick, overrides=overrides, device=device,
                              progress=progress, locks=locks, resume=resume, previous=previous,
                              evidence=evidence, full_under=full_under, full_here=full_here,
                              workers=jobs)


def plan_full(evidence: str | Path | None, full_under: float | None, quick: bool, names: list[str]) -> set[str]:
    """The reproductions of a ``--quick`` run that run at full settings here: those whose full-setting
    evidence took at most ``full_under`` seconds (its ``wall_seconds``). Bad combinations exit 2."""
    if evidence is not None:
        evidence = verdicts.evidence_dir(evidence)
    if full_under is None:
        return set()
    if not (full_under >= 0 and full_under < float("inf")):
        raise UserError(f"--full-under {full_under}: must be a finite number of seconds >= 0")
    if evidence is None:
        raise UserError("--full-under needs --evidence DIR (it reads the full-setting run times recorded there)")
    if not quick:
        raise UserError("--full-under picks which reproductions of a --quick run go full; without --quick all run full")
    costs = _costs(evidence)
    cheap = {n for n in names if costs.get(n, float("inf")) <= full_under}
    # one that reads another's runs goes full only with it (in --all it reuses them)
    shared = shares_runs()
    return {n for n in cheap if shared.get(n) is None or shared[n] in cheap}


def _quick_of(exps: list[Experiment], quick: bool, full_here: set[str], device: str) -> dict[str, bool]:
    """Which of ``exps`` a ``reproduce --all`` runs quick: all with ``quick`` but those ``full_here``, and on a CPU
    the GPU-scale ones (their full settings need a GPU: quick here, labelled so)."""
    gpu = gpu_scale() if device == "cpu" else {}
    return {e.name: (quick and e.name not in full_here) or e.name in gpu for e in exps}


def _check_all_overrides(exps: list[Experiment], overrides: list[str], *, seed: int, device: str,
                         quick_of: dict[str, bool]) -> None:
    """``reproduce --all --set …``: every reproduction's :func:`check_overrides` before anything runs; one that
    refuses the overrides exits 2 naming them all and the first one's reason (nothing is trained: a refusal used
    to surface as a failed reproduction midway)."""
    refused: dict[str, str] = {}
    for exp in (e for e in exps if e.takes_set is not False):    # one that trains nothing runs without them
        ctx = ReproduceContext(out=Path("."), seed=seed, quick=quick_of[exp.name], overrides=list(overrides),
                               device=device, progress=False, options=exp.make_options())
        try:
            check_overrides(exp, ctx)
        except (UserError, ConfigError) as e:
            refused[exp.name] = str(e)
    if refused:
        first, why = next(iter(refused.items()))
        why = why.split(": ", 1)[-1] if why.startswith("--set ") else why
        raise UserError(f"--set {' '.join(overrides)}: {len(refused)} of {len(exps)} reproductions refuse it, so "
                        f"none ran ({', '.join(refused)}); {first}: {why}")


def cost(name: str, res: dict[str, Any]) -> float | None:
    """The wall time of a full-setting result as a measure of what its full run costs, or None where the
    time does not measure the default full setting: a result judged on runs trained elsewhere (``at_step``),
    resumed, or made with options (another setting, or earlier runs or tables reused: ``--rejudge``,
    ``--from-tables``); ``--sweep-dir`` only places a sweep."""
    t = res.get("wall_seconds")
    made_ = res.get("made") if isinstance(res.get("made"), dict) else {}
    if not isinstance(t, (int, float)) or res.get("at_step") is not None or made_.get("resumed"):
        return None
    options = {k: v for k, v in (res.get("options") or {}).items() if v is not None}
    options.pop("sweep_dir", None)   # where the sweep lives, not what it is
    return None if options else float(t)


def shares_runs() -> dict[str, str]:
    """Reproductions that read another's runs (their manifest's ``reuses``): in a ``--all`` directory they reuse them."""
    return {n: r.reuses for p in papers.manifests() for n, r in p.reproductions.items() if r.reuses}


def _reproduce_all(out: Path, exps: list[Experiment], *, seed, quick, overrides, device, progress, locks, resume,
                   previous: list[dict], evidence=None, full_under=None, full_here: set[str] = frozenset(),
                   workers: int = 1):
    """``previous``: the manifest entries of the run ``--resume`` continues (a finished one is kept; every
    one not reached yet stays listed, so an interrupt loses none of them). ``workers`` > 1: that many
    reproductions at once, each in a worker process (:func:`_in_parallel`)."""
    done = {e.get("name"): e for e in previous
            if e.get("status") == "finished" and (out / e["dir"] / runs.RESULTS).is_file()}
    manifest = {"seed": seed, "quick": quick, "overrides": list(overrides or []), "device": device,
                "full_under": full_under, "evidence": str(Path(evidence).resolve()) if evidence is not None else None,
                "jobs": workers, "started": runs.now(), "ended": None, "wall_seconds": None,
                "metadata": metadata(), "reproductions": []}
    gpu = gpu_scale() if device == "cpu" else {}    # their full settings need a GPU: quick here, labelled so
    quick_of = _quick_of(exps, quick, full_here, device)
    t_all = time.time()

    def save() -> None:
        reached = {e["name"] for e in manifest["reproductions"]}
        runs.write_json(out / MANIFEST, manifest | {"reproductions": manifest["reproductions"] +
                                                    [e for e in previous if e.get("name") not in reached]})

    def start(i: int, exp: Experiment) -> tuple[dict, dict] | None:
        """Lock and clear ``exp``'s directory, list it in the manifest: (its entry, its context's arguments)."""
        sub = out / slug(exp.name)
        if exp.name in done:     # --resume: finished before
            manifest["reproductions"].append(done[exp.name])
            print(f"[{i + 1}/{len(exps)}] {exp.name}: kept (finished before)", flush=True)
            return None
        sub.mkdir(exist_ok=True)
        locks.acquire(sub)    # one writer: a `reproduce NAME --out` into it while this runs is refused
        if not resume:        # (only with force) no stale figures or tables of an earlier run
            runs.clear_own(sub, reproduction=True)
        q = quick_of[exp.name]
        entry = {"name": exp.name, "dir": sub.name, "status": "running", "quick": q}
        manifest["reproductions"].append(entry)
        save()
        print(f"[{i + 1}/{len(exps)}] {exp.name}" + (" (full settings: its full run took "
              f"<= {full_under:g} s)" if exp.name in full_here else "") + (
              f" (quick settings: GPU-scale, {gpu[exp.name]})" if exp.name in gpu and not quick else ""), flush=True)
        # --set applies to the reproductions that train; those that train nothing run without it
        args = {"out": sub, "seed": seed, "quick": q, "device": device, "progress": progress and workers == 1,
                "resume": resume, "overrides": [] if exp.takes_set is False else list(overrides or [])}
        source = shares_runs().get(exp.name)
        if (source and exp.options is not None and "sweep_dir" in exp.options.model_fields
                and any(e.name == source for e in exps) and quick_of.get(source) == q):
            args["options"] = {"sweep_dir": str(out / slug(source) / runs.RUNS)}  # trained once
        return entry, args

    def finish(entry: dict, outcome: dict) -> None:
        entry["status"], entry["wall_seconds"] = outcome["status"], outcome["wall_seconds"]
        print(f"    {entry['name']}: " + (f"FAILED: {outcome['error']}" if outcome["status"] == "failed" else
              f"{outcome['line']} — " + ("quick settings (a pipeline check)" if entry["quick"] else "full settings")
              + f", made here ({outcome['wall_seconds']:.1f}s)"), flush=True)
        save()

    try:
        if workers > 1:
            _in_parallel(exps, workers, start, finish, _costs(evidence))
        else:
            for i, exp in enumerate(exps):
                if (started := start(i, exp)) is not None:
                    finish(started[0], attempt(exp.name, started[1]))
    except KeyboardInterrupt:  # the page still shows what finished
        for e in manifest["reproductions"]:
            if e.get("status") == "running":
                e["status"] = "interrupted"
        save()
        print(f"report so far: {build_index(out, descriptions=descriptions(), evidence=evidence)}", flush=True)
        raise
    order = {e.name: i for i, e in enumerate(exps)}      # the page lists them in the registry's order
    manifest["reproductions"].sort(key=lambda e: order.get(e.get("name"), len(order)))
    manifest["ended"], manifest["wall_seconds"] = runs.now(), round(time.time() - t_all, 2)
    save()
    return (build_index(out, descriptions=descriptions(), evidence=evidence),
            [e["name"] for e in manifest["reproductions"] if e["status"] == "failed"])


def attempt(name: str, args: dict) -> dict[str, Any]:
    """Run reproduction ``name`` with context ``args`` (in this process or a worker's): its outcome. A failure
    is recorded in its ``results.json`` (error and traceback), so that the other reproductions still run."""
    args = dict(args)
    options = args.pop("options", None)
    ctx = ReproduceContext(**args)
    t0 = time.time()
    try:
        exp = get(name)
        if options is not None:
            ctx.options = exp.make_options({k: Path(v) for k, v in options.items()})
        results = run_reproduction(exp, ctx)
        return {"status": "finished", "line": count_line(results.get("claims", [])),
                "wall_seconds": results["wall_seconds"]}
    except Exception as e:
        wall = round(time.time() - t0, 2)
        write_results(ctx.out, {"experiment": name, "claims": [], "quick": ctx.quick, "seed": ctx.seed,
                                "wall_seconds": wall, "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()})
        return {"status": "failed", "error": f"{type(e).__name__}: {e}", "wall_seconds": wall}


def gpu_scale() -> dict[str, str]:
    """The reproductions whose full setting needs a GPU (their manifest's ``gpu_scale``: why)."""
    return {n: r.gpu_scale for p in papers.manifests() for n, r in p.reproductions.items() if r.gpu_scale}


def unshipped() -> dict[str, dict[str, str]]:
    """The tables each reproduction's committed evidence leaves out (their manifest's ``unshipped``: file -> why)."""
    return {n: r.unshipped for p in papers.manifests() for n, r in p.reproductions.items() if r.unshipped}


def export_evidence(src: str | Path, dest: str | Path) -> list[str]:
    """Copy the full-setting results of a ``reproduce --all`` directory ``src`` into the evidence directory
    ``dest`` (the shipped docs/results): for each reproduction it finished at full settings, its
    ``results.json`` and the tables and figures it lists, into ``dest/<slug>/`` (the files tdyn wrote there
    before and no longer writes go). Quick and failed ones are left out. Returns the names copied.
    Where ``src`` ran N > 1 reproductions at once (``--jobs N``), each exported result says so (``made.jobs``):
    its wall time was made beside other reproductions, not alone. A table its manifest declares ``unshipped`` is
    not copied (and goes from ``dest``)."""
    src, dest = Path(src), Path(dest)
    copied = []
    left_out = unshipped()
    manifest = runs.read_manifest(src / MANIFEST)
    jobs = manifest.get("jobs") if isinstance(manifest.get("jobs"), int) else 1
    for e in manifest["reproductions"]:
        res_path = src / e["dir"] / runs.RESULTS
        if e.get("status") != "finished" or e.get("quick") or not res_path.is_file():
            continue
        res = runs.read_json(res_path)
        files = [runs.RESULTS] + [f for f in res.get("files", []) if (src / e["dir"] / f).is_file()
                                  and f not in left_out.get(e["name"], {})]
        if any(Path(f).is_absolute() or ".." in Path(f).parts for f in files):
            raise UserError(f"{str(res_path)!r} lists a file outside its directory: {files}")
        to = dest / e["dir"]
        old = runs.read_json(to / runs.RESULTS) if (to / runs.RESULTS).is_file() else {}
        for f in set(old.get("files", [])) - set(files):    # what the earlier evidence listed and this does not
            if "/" not in f and (to / f).is_file():
                (to / f).unlink()
        to.mkdir(parents=True, exist_ok=True)
        if jobs > 1:
            res["made"] = (res.get("made") if isinstance(res.get("made"), dict) else {}) | {"jobs": jobs}
        runs.atomic_write_many([runs.json_file(to / runs.RESULTS, res) if jobs > 1 else
                                (to / runs.RESULTS, res_path.read_bytes())]
                               + [(to / f, (src / e["dir"] / f).read_bytes()) for f in files[1:]])
        copied.append(e["name"])
    return copied


def _costs(evidence: str | Path | None) -> dict[str, float]:
    """What each reproduction's full run took in ``evidence`` (its ``wall_seconds``): the scheduler's estimate."""
    if evidence is None:
        return {}
    ev = verdicts.full_evidence(verdicts.evidence_dir(evidence))
    return {n: t for n, (_, res) in ev.items() if (t := cost(n, res)) is not None}


def _in_parallel(exps: list[Experiment], workers: int, start, finish, costs: dict[str, float]) -> None:
    """Run ``exps`` on ``workers`` worker processes, largest first (``costs``; unknown ones before the known, in
    the registry's order: one with no full run to go by, such as a GPU-scale one run quick on a CPU, was the
    longest of ``make demo`` and ended alone when it came last), so that the long ones do not end alone; one
    that reuses another's runs (its manifest's ``reuses``) starts only after that one has finished."""
    index = {e.name: i for i, e in enumerate(exps)}
    waiting = sorted(exps, key=lambda e: (-costs.get(e.name, math.inf), index[e.name]))
    after = {n: s for n, s in shares_runs().items() if n in index and s in index}
    running: dict[Any, dict] = {}
    pool = process_pool(workers)
    try:
        while waiting or running:
            ready = [e for e in waiting if after.get(e.name) not in {x.name for x in waiting} | set(
                r["name"] for r in running.values())]
            while ready and len(running) < workers:
                exp = ready.pop(0)
                waiting.remove(exp)
                if (started := start(index[exp.name], exp)) is not None:
                    running[pool.submit(attempt, exp.name, started[1])] = started[0]
            if not running:
                if waiting and not ready:
                    raise ValueError(f"reproductions waiting on each other's runs: {[e.name for e in waiting]}")
                continue
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for f in finished:
                entry = running.pop(f)
                try:
                    outcome = f.result()
                except BrokenProcessPool as e:   # the worker died (killed, out of memory): that one failed
                    outcome = {"status": "failed", "error": f"its worker process died ({e})", "wall_seconds": None}
                    terminate(pool)
                    pool = process_pool(workers)
                finish(entry, outcome)
    except KeyboardInterrupt:
        terminate(pool, grace=10.0)
        raise
    pool.shutdown()


# The catalog (what `tdyn list`, `--help` and `tdyn config NAME` read without importing experiments).

def build_catalog() -> dict[str, dict]:
    """What ``tdyn list``, ``tdyn reproduce NAME --help`` and a plain ``tdyn config NAME [--quick]`` show
    of every built-in reproduction (name, description, kinds, typed options, the resolved run configs at
    the default seed 0 without overrides), from the registrations themselves (imports every module)."""
    out = {}
    for name in EXPERIMENTS.table:
        e = get(name)
        configs = {}
        if e.configs is not None or e.default_config is not None:
            for mode in ("full", "quick"):
                ctx = ReproduceContext(out=Path("."), seed=0, quick=mode == "quick", overrides=[],
                                       options=e.make_options({}))
                configs[mode] = {n: c.model_dump(mode="json") for n, c in resolved_configs(e, ctx).items()}
        out[name] = {"description": e.description,
                     "kinds": [k for k, ok in (("reproduce", e.reproduce), ("run", e.default_config)) if ok],
                     "options": {f: _option_entry(i) for f, i in (e.options.model_fields.items() if e.options else ())},
                     "configs": configs}
    return out


def catalog_text() -> str:
    return json.dumps(build_catalog(), indent=1, ensure_ascii=False) + "\n"


def names_text() -> str:
    """:data:`tdyn.registry.NAMES`: every built-in task's and probe's one-line description (``tdyn list``)."""
    names = {"tasks": {n: TASKS.description(n) for n in sorted(TASKS.table)},
             "probes": {n: PROBES.description(n) for n in sorted(PROBES.table)}}
    return json.dumps(names, indent=1, ensure_ascii=False) + "\n"


def write_catalog() -> Path:
    """Regenerate ``catalog.json`` and :data:`tdyn.registry.NAMES` from the registrations (``make catalog``)."""
    CATALOG.write_text(catalog_text(), encoding="utf-8")
    NAMES.write_text(names_text(), encoding="utf-8")
    return CATALOG
