"""The ``tdyn`` command: ``list | run | reproduce | config | sweep | bench | report`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tdyn import docs
from tdyn.errors import ENVIRONMENT_ERRNOS, RESOURCE_ERRNOS, UserCodeError, UserError, WriteError, user_code_error, user_frame


def _setup(args) -> None:
    """What every command that builds configs or trains needs (not ``list``, ``--help`` or an argument
    error: those import no torch): the thread count and the config name resolver. Then ``gc.freeze()``:
    the objects made by importing torch and tdyn (~170,000, there for the life of the process) move to
    the collector's permanent generation, as in a sweep's workers: no collection traverses them again,
    and the interpreter's teardown at exit, which collects repeatedly while it clears the modules,
    leaves them alone (the savings: benchmarks/README.md#measurements-behind-the-code)."""
    from tdyn.threads import check_threads

    check_threads(args.threads)
    import gc

    import torch

    from tdyn import config

    gc.freeze()
    torch.set_num_threads(args.threads)
    os.environ["TDYN_THREADS"] = str(args.threads)   # sweep workers (local, Ray, Slurm) train with it too
    config.set_name_resolver(_experiment_config)  # `tdyn run NAME`, a sweep's `base: NAME`


#: The run configs and sweep specs shipped in the package (``tdyn.config.packaged``'s folders, listed here
#: without importing ``tdyn.config``, which imports torch: ``tdyn list`` and ``tdyn config NAME`` stay light).
_PACKAGED = Path(__file__).resolve().parent / "configs"


def _packaged(kind: str) -> dict[str, Path]:
    folder = _PACKAGED / "sweeps" if kind == "sweep" else _PACKAGED
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def _leading_comment(path: Path) -> str:
    """A packaged file's description: its leading ``#`` comment lines, on one line."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)


def _short(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[:width - 1].rsplit(" ", 1)[0] + " …"


def _cmd_list(args) -> int:
    """What exists, grouped: the reproductions (from the generated catalog: no experiment module is
    imported), the packaged run configs and sweep specs, the tasks and the probes (the built-in ones'
    descriptions from the generated :data:`tdyn.registry.NAMES`), each with its one-line description;
    then whatever the user's plugins registered (``--import``, ``$TDYN_IMPORT``, entry points)."""
    from tdyn import papers, plugins, registry
    from tdyn.reproduce.registry import EXPERIMENTS, catalog

    rows = {n: (e["kinds"], e["description"]) for n, e in catalog().items()}
    plugins.load()
    extra = [n for p in papers.manifests() for n in p.reproductions if n not in rows]   # an installed paper's
    if extra or any(n not in rows for n in EXPERIMENTS._items):
        for n in extra:
            EXPERIMENTS.get(n)
        for n, e in EXPERIMENTS._items.items():
            if n not in rows:
                rows[n] = ([k for k, ok in (("reproduce", e.reproduce), ("run", e.default_config)) if ok], e.description)
    names = registry.described()
    sections = [
        ("Reproductions: tdyn reproduce NAME --out DIR; tdyn config NAME prints the run configs it trains "
         "([run]: tdyn run NAME trains its one config)",
         {n: f"[{'/'.join(kinds)}]  {d}" for n, (kinds, d) in rows.items()}),
        ("Packaged run configs: tdyn run NAME --out DIR; tdyn config NAME prints it",
         {n: _short(_leading_comment(p)) for n, p in _packaged("run").items()}),
        ("Packaged sweep specs: tdyn sweep NAME --out DIR; tdyn config NAME prints it",
         {n: _short(_leading_comment(p)) for n, p in _packaged("sweep").items()}),
        ("Tasks: `task: NAME` in a run config", _registered("tdyn.tasks.base", "TASKS", "tasks", names)),
        ("Probes: `probes: {names: [NAME, ...]}` in a run config",
         _registered("tdyn.probes", "PROBES", "probes", names)),
    ]
    for i, (title, entries) in enumerate(sections):
        print(("\n" if i else "") + title)
        width = max((len(n) for n in entries), default=0)
        for name, line in entries.items():
            print(f"  {name:<{width}}  {line}")
    return 0


def _registered(module: str, attr: str, kind: str, names: dict[str, dict[str, str]]) -> dict[str, str]:
    """The built-in tasks or probes with their descriptions (the generated catalog), then those of an
    installed paper and those a plugin registered: imported only where there are such (a plugin that
    registered one has imported the registry already, so a plain ``tdyn list`` imports no torch)."""
    from tdyn import papers

    out = {n: _short(d) for n, d in names[kind].items()}
    declared = [n for p in papers.manifests() for n in getattr(p, kind) if n not in out]
    if not declared and module not in sys.modules:
        return out
    import importlib

    reg = getattr(importlib.import_module(module), attr)
    for n in declared:
        out[n] = _short(reg.description(n))
    for n in sorted(set(reg._items) - set(out)):
        out[n] = _short(reg._descriptions.get(n, ""))
    return out


def _cmd_run(args) -> int:
    _setup(args)
    from tdyn.config import load_config
    from tdyn.train import trainer

    if args.resume:
        if args.source or args.set or args.seed is not None:
            raise UserError("--resume DIR takes no config source, --set or --seed (the run's config.json is used)")
        if args.force:
            raise UserError("--resume DIR continues the run in DIR and --force starts it again from step 0: give one")
        if args.out is not None and Path(args.out).resolve() != Path(args.resume).resolve():
            raise UserError(f"--resume {args.resume!r} continues the run in that directory; --out {args.out!r} names "
                            "another (a resumed run stays where it is): give --resume alone")
        dirs = trainer.resume(args.resume, progress=not args.quiet)
    else:
        if not args.source:
            raise UserError("tdyn run needs a config file, a packaged config name or an experiment name (see `tdyn list`), "
                            "or --resume DIR")
        overrides = list(args.set or [])
        if args.seed is not None:
            _no_seeds_set(overrides)
            overrides.append(f"seeds={args.seed}")
        cfg = load_config(args.source, overrides)
        out = Path(args.out or Path("runs") / Path(args.source).stem.replace("/", "_"))
        t0 = time.time()
        dirs = trainer.train(cfg, out, force=args.force, progress=not args.quiet)
        print(f"trained {len(dirs)} member(s) in {time.time() - t0:.1f}s")
    from tdyn import runs

    for d in dirs:
        run = runs.Run(d)
        meta = run.meta
        last = (run.metrics or [{}])[-1]
        loss = last.get("loss")
        print(f"{d}: {meta['status']}" + (f" (final loss {loss:.4g})" if isinstance(loss, float) else "")
              + (f" — {meta['message']}" if meta.get("message") else ""))
    return 0 if all(runs.Run(d).status == "finished" for d in dirs) else 1


def _no_seeds_set(overrides: list[str]) -> None:
    """``--seed N`` is ``--set seeds=N``: both at once would leave one silently unused."""
    for o in overrides:
        if o.split("=", 1)[0].strip() == "seeds":
            raise UserError(f"--seed and --set {o!r} both set the seeds: give one")


def _path(text: str) -> str:
    """An argument naming a file or directory: an empty one names none (it is not the current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file or directory")
    return text


def _cmd_reproduce(args) -> int:
    from tdyn.reproduce.registry import ReproduceContext, get

    if args.all == bool(args.name):
        raise UserError("tdyn reproduce takes an experiment name or --all (not both)")
    if not args.all and args.jobs != 1:
        raise UserError("--jobs goes with --all (how many reproductions run at once)")
    if not args.all and (args.evidence is not None or args.full_under is not None):
        raise UserError(f"{'--evidence' if args.evidence is not None else '--full-under'} goes with --all "
                        "(the page of every reproduction); for one reproduction see `tdyn report DIR --evidence DIR`")
    if args.force and args.resume:
        raise UserError("--resume continues the reproduction in OUT and --force starts it again: give one")
    if args.judge_only and (args.all or args.resume or args.quick or args.set):
        bad = next(f for f, on in (("--all", args.all), ("--resume", args.resume), ("--quick", args.quick),
                                   ("--set", args.set)) if on)
        raise UserError(f"--judge-only judges the tables already in OUT as they were made: it takes no {bad}")
    if args.all:
        _setup(args)
        from tdyn.reproduce import runner

        page, failed = runner.reproduce_all(args.out, seed=args.seed, quick=args.quick, overrides=list(args.set or []),
                                            device=args.device, progress=not args.quiet, force=args.force,
                                            resume=args.resume, evidence=args.evidence, full_under=args.full_under,
                                            jobs=args.jobs)
        _print_answer(Path(args.out), args.evidence)
        if failed:
            print(f"{len(failed)} reproduction(s) failed: {', '.join(failed)}", file=sys.stderr)
        print(f"report: {page.resolve()}")
        return 1 if failed else 0
    exp = get(args.name)             # an unknown name fails here, before torch is imported
    _setup(args)
    from tdyn import runs
    from tdyn.reproduce import runner

    out = Path(args.out)
    ctx = ReproduceContext(out=out, seed=args.seed, quick=args.quick, overrides=list(args.set or []),
                           device=args.device, progress=not args.quiet,
                           options=exp.make_options(_option_values(args, exp)), resume=args.resume,
                           judge_only=args.judge_only)
    runner.check_overrides(exp, ctx)  # before the directory is made
    if args.judge_only:
        if exp.phases is None:
            raise UserError(f"--judge-only: {exp.name} does not keep the tables its claims are judged from")
        if runs.reproduction_of(out) != exp.name:
            raise UserError(f"--judge-only: {str(out)!r} holds no results of {exp.name} (judge-only reads the tables "
                            "a run of it wrote there)")
    if args.resume and runs.reproduction_of(out) not in (None, exp.name):
        raise UserError(f"--resume: {str(out)!r} holds {runs.reproduction_of(out)}'s reproduction, not {exp.name}'s "
                        f"(a directory belongs to one reproduction); choose another --out")
    with runs.Locks() as locks:       # one writer: a second reproduce into DIR is refused naming this one
        other = args.force and runs.reproduction_of(out) not in (None, exp.name)   # another reproduction's: cleared
        runner.prepare_dir(out, args.force or args.resume or args.judge_only, clear=other, locks=locks,
                           flag="--force" if args.force else "--resume" if args.resume else "--judge-only")
        results = runner.run_reproduction(exp, ctx)
    _print_claims(results)
    print(f"wrote {out / runs.RESULTS} ({results['wall_seconds']:.1f}s)")
    return 0


def _option_values(args, exp) -> dict:
    if exp.options is None:
        return {}
    return {f: getattr(args, f"opt_{f}") for f in exp.options.model_fields if getattr(args, f"opt_{f}", None) is not None}


def _cmd_config(args) -> int:
    """Print, as YAML that ``tdyn run`` (or ``tdyn sweep``) takes back unchanged, what NAME names: a packaged
    run config or a config file (validated, after ``--set`` / ``--seed``), a packaged sweep spec (its base
    inlined as ``config:``, ``--set`` added to its ``set:``), or a reproduction's run configs (after its
    ``--set``, ``--seed``, ``--quick`` and options): one config bare; several as one YAML document each,
    headed by the ``NAME:CONFIG`` that prints it alone (and that ``tdyn run`` trains)."""
    import yaml

    from tdyn.reproduce.registry import EXPERIMENTS

    from tdyn import plugins

    name, _, part = args.name.partition(":")
    file = Path(args.name).suffix in (".yaml", ".yml", ".json") or Path(args.name).exists()   # config.is_file_source
    known = file or args.name in _packaged("run") or args.name in _packaged("sweep")
    if not known and name not in EXPERIMENTS.table and name not in EXPERIMENTS._items:
        plugins.load()   # an entry point's reproduction
    if not known and (name in EXPERIMENTS.table or name in EXPERIMENTS._items):
        return _print_reproduction_configs(args, name, part or None)
    if args.quick or any(getattr(args, k) is not None for k in vars(args) if k.startswith("opt_")):
        raise UserError(f"--quick and a reproduction's options go with a reproduction; {args.name!r} is none")
    if args.name in _packaged("sweep") or (file and _is_sweep_file(args.name)):
        return _print_sweep_spec(args)
    if known:
        _setup(args)
        from tdyn.config import load_config

        overrides = list(args.set or [])
        if args.seed is not None:
            _no_seeds_set(overrides)
            overrides.append(f"seeds={args.seed}")
        _dump(yaml, load_config(args.name, overrides).model_dump(mode="json"))
        return 0
    raise UserError(f"config: {args.name!r} is neither a config file, a packaged run config "
                    f"({', '.join(_packaged('run'))}), a packaged sweep spec ({', '.join(_packaged('sweep'))}) "
                    f"nor a reproduction (see `tdyn list`)")


def _dump(yaml, data: dict, head: str = "") -> None:
    print(head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")


def _is_sweep_file(path: str) -> bool:
    """Whether a config file holds a sweep spec (``base:``, ``config:`` or ``axes:``, and no ``task:``)."""
    from tdyn.config import read_config_file

    raw = read_config_file(path)
    return isinstance(raw, dict) and "task" not in raw and bool({"base", "config", "axes"} & set(raw))


def _print_sweep_spec(args) -> int:
    """A sweep spec as ``tdyn sweep`` takes it back: self-contained (its base config inlined as ``config:``,
    so that the printed file does not depend on where it is saved), ``--set`` appended to its ``set:``."""
    import yaml

    if args.seed is not None:
        raise UserError("--seed goes with a run config; a sweep spec lists its seeds (--set is added to its set:)")
    _setup(args)
    from tdyn.sweep.spec import SweepSpec, base_config, load_spec, plan, with_overrides

    spec = with_overrides(load_spec(args.name), list(args.set or []))   # as `tdyn sweep NAME --set` applies them
    spec = SweepSpec.model_validate(spec.model_dump() | {"base": None, "config": base_config(spec)})
    plan(spec)   # the overrides and the spec's cells validated as `tdyn sweep` validates them
    data = spec.model_dump(mode="json", exclude_defaults=True)
    _dump(yaml, {"config": data.pop("config"), **data})
    return 0


def _print_reproduction_configs(args, name: str, part: str | None) -> int:
    import yaml

    from tdyn.reproduce.registry import ReproduceContext, catalog, get

    cat = catalog().get(name)
    plain = not args.set and not args.seed and not any(getattr(args, k) is not None for k in vars(args)
                                                       if k.startswith("opt_"))
    if cat is not None and plain:   # the generated catalog holds them: no torch import
        cfgs = cat["configs"]["quick" if args.quick else "full"] if cat.get("configs") else {}
    else:
        exp = get(name)
        _setup(args)
        from tdyn.reproduce import runner

        ctx = ReproduceContext(out=Path("."), seed=args.seed or 0, quick=args.quick, overrides=list(args.set or []),
                               options=exp.make_options(_option_values(args, exp)))
        runner.check_overrides(exp, ctx, claims=False)   # configs for `tdyn run`: nothing is judged
        cfgs = {n: c.model_dump(mode="json") for n, c in runner.resolved_configs(exp, ctx).items()} \
            if exp.configs is not None or exp.default_config is not None else {}
    if part is not None:
        if part not in cfgs:
            raise UserError(f"config: {name} trains no config {part!r}; its configs: {', '.join(cfgs) or 'none'}")
        cfgs = {part: cfgs[part]}
    if not cfgs:
        raise UserError(f"config: {name} trains no run config (`tdyn reproduce {name}` computes it without training)")
    if len(cfgs) == 1:
        _dump(yaml, next(iter(cfgs.values())))
    else:
        print(f"# {name} trains {len(cfgs)} run configs, one YAML document each; `tdyn run` takes one: "
              f"`tdyn config {name}:CONFIG > f.yaml` prints it alone")
        for i, (n, c) in enumerate(cfgs.items()):
            _dump(yaml, c, ("---\n" if i else "") + f"# {name}:{n}\n")
    return 0


def _add_options(p: argparse.ArgumentParser, argv: list[str], command: str) -> None:
    """Add the typed options of the experiment named after ``command`` in ``argv`` (if any) to ``p``:
    a built-in one's from the generated catalog (no import), a plugin's from its registration."""
    if command not in argv:
        return
    rest = argv[argv.index(command) + 1:]
    name = next((a for a in rest if not a.startswith("-")), None)
    if name is None:
        return
    from tdyn.reproduce.registry import EXPERIMENTS, _option_entry, catalog

    cat = catalog()
    if (name in cat or name in EXPERIMENTS._items) and docs.ref(name):
        p.epilog = f"{name} is documented in {docs.ref(name)} (setting, definitions, claims, departures)."
    if name in cat:
        options = cat[name]["options"]
    elif name in EXPERIMENTS._items and EXPERIMENTS._items[name].options is not None:
        options = {f: _option_entry(i) for f, i in EXPERIMENTS._items[name].options.model_fields.items()}
    else:
        return
    if not options:
        return
    g = p.add_argument_group(f"options of {name}")
    for f, o in options.items():
        default = "the reproduction's own (full or --quick) setting" if o["default"] is None else o["default"]
        g.add_argument(f"--{f.replace('_', '-')}", dest=f"opt_{f}", metavar=f.upper() + (",..." if o["list"] else ""),
                       type=(lambda text: [x for x in text.split(",") if x]) if o["list"] else None,
                       help=f"{o['help']} (default: {default})")


def _print_claims(results: dict) -> None:
    """The claims, the paper's first and those beyond the paper apart, each with its verdict."""
    from tdyn.report.verdicts import SOURCE_LABEL, by_source, count_line
    claims = results.get("claims", [])
    if claims:
        print(count_line(claims) + (" — quick settings (a check that it runs, not a verdict on the paper)"
                                    if results.get("quick") else " — full settings"))
    for src, cs in by_source(claims).items():
        if cs:
            print(f" {SOURCE_LABEL[src]}:")
        for c in cs:
            tag = c["verdict"] + (", quick" if c.get("quick") else "") \
                + (f", under --set {' '.join(map(str, c['overrides']))}" if c.get("overrides") else "")
            why = f" ({c['reason']})" if c.get("verdict") == "inconclusive" and c.get("reason") else ""
            print(f"  [{tag}] {c['claim']}{why}")


def _print_answer(out: Path, evidence) -> None:
    """The summary of a reproduce-all page: per paper, its claims at full settings (made here or shipped),
    and each reproduction's verdicts with whether they are full or quick, made here or shipped."""
    from tdyn import runs
    from tdyn.report import html
    from tdyn.report.verdicts import by_source, counts, full_evidence, setting_of

    manifest = runs.read_manifest(out / runs.REPRODUCE) if (out / runs.REPRODUCE).exists() else {}
    evidence = evidence or manifest.get("evidence")
    ev = full_evidence(Path(evidence)) if evidence and Path(evidence).is_dir() else {}
    here = html.reproductions(out)
    ans = html.answers(here, ev)
    if not ans:
        return
    here_word = "made here" if manifest else f"in {out}"
    print("\nPaper claims at full settings (holds / fails / inconclusive):")
    for prefix, names in html._by_paper(ans).items():
        split = by_source([c for x in names for c in ans[x]["res"].get("claims", [])])
        n, old = counts(split["paper"]), counts(split.get(None, []))
        n_here = sum(ans[x]["origin"] == "here" for x in names)
        print(f"  {html.paper_of(prefix + '/')}: {n['holds']} / {n['fails']} / {n['inconclusive']}"
              + (f" (and without a source, older results: {old['holds']} / {old['fails']} / {old['inconclusive']})"
                 if split.get(None) else "")
              + f"  ({n_here} reproduction(s) {here_word} at full settings, {len(names) - n_here} shipped)")
    print("Per reproduction (paper claims holds / fails / inconclusive):")
    for d, res in here:
        name = res.get("experiment", d.name)
        def line(r):
            split = by_source(r.get("claims", []))
            n = counts(split["paper"])
            old = counts(split.get(None, []))
            return (f"{n['holds']} / {n['fails']} / {n['inconclusive']}"
                    + (f" (and without a source, older: {old['holds']} / {old['fails']} / {old['inconclusive']})"
                       if split.get(None) else ""))
        parts = [f"{setting_of(res)}, {here_word}: " + ("FAILED" if "error" in res else line(res))]
        if ans.get(name, {}).get("origin") == "evidence":
            parts.append(f"full, shipped ({Path(evidence).name}/{ans[name]['dir'].name}): {line(ans[name]['res'])}")
        if setting_of(res) == "quick" and name in ans and "error" not in res:
            shared, diff = html.differences(res.get("claims", []), ans[name]["res"].get("claims", []))
            if diff:
                parts.append(f"{len(diff)} of {shared} quick verdicts differ from the full ones")
        print(f"  {name}: " + "; ".join(parts))


def _cmd_report(args) -> int:
    _setup(args)
    from tdyn import runs
    from tdyn.report import html

    d = Path(args.dir)
    if not d.is_dir():
        raise UserError(f"{str(d)!r} is not a directory")
    if args.evidence is not None:
        from tdyn.report.verdicts import evidence_dir

        evidence_dir(args.evidence)
        if args.readme:
            raise UserError("--evidence is for the page; --readme writes the table of DIR's own results")
    if args.readme:
        from tdyn.reproduce.registry import all_experiments
        from tdyn.report import verdicts

        names = [n for n in all_experiments() if not n.startswith("test/")]
        print(f"wrote the verdict table of {d} into {verdicts.write_readme(d, Path(args.readme), names)}")
        return 0
    found = html.reproductions(d)
    for rd, results in found:
        print(f"{results.get('experiment', rd.name)}:" + (f" FAILED: {results['error']}" if "error" in results else ""))
        _print_claims(results)
    if found:
        from tdyn.reproduce.runner import descriptions

        page = html.build_index(d, descriptions=descriptions(), evidence=args.evidence)
        _print_answer(d, args.evidence)
        print(f"report: {page}")
        return 0
    if args.evidence is not None:
        raise UserError(f"--evidence: {str(d)!r} holds no results.json (the evidence leads a reproductions page)")
    _, run_dirs = html.collect_runs(d)
    if not run_dirs:
        raise UserError(f"{str(d)!r} holds no results.json and no run directory")
    for rd in run_dirs:
        run = runs.Run(rd)
        meta, metrics = run.meta, run.metrics
        last = metrics[-1] if metrics else {}
        print(f"{rd}: {meta['status']}, {len(metrics)} evaluations, last step {last.get('step')}, "
              f"loss {last.get('loss')}")
    print(f"report: {html.build_run_report(d)}")
    return 0


def _cmd_sweep(args) -> int:
    _setup(args)
    from tdyn import sweep

    if args.summarize:
        if args.spec or args.set or args.multirun is not None:
            raise UserError("--summarize DIR takes no sweep spec, --set or -m")
        print(sweep.summarize(args.summarize))
        return 0
    if not args.spec or not args.out:
        raise UserError("tdyn sweep needs a spec file and --out DIR (or --summarize DIR)")
    spec = args.spec
    if args.multirun is not None:   # hydra's spelling: BASE -m key=a,b key2=x,y
        from tdyn.sweep.spec import multirun_spec

        spec = multirun_spec(args.spec, args.multirun)
    t0 = time.time()
    slurm = {k: v for k, v in (("partition", args.slurm_partition), ("time_min", args.slurm_time),
                                ("gpus_per_node", args.slurm_gpus), ("cpus_per_task", args.slurm_cpus),
                                ("mem_gb", args.slurm_mem_gb), ("account", args.slurm_account)) if v is not None}
    for item in args.slurm_extra or []:
        if "=" not in item:
            raise UserError(f"--slurm-extra {item!r}: must look like FLAG=VALUE (e.g. qos=high)")
        slurm.setdefault("extra", {})[item.split("=", 1)[0]] = item.split("=", 1)[1]
    status = sweep.run_sweep(spec, args.out, overrides=list(args.set or []), executor=args.executor,
                             workers=args.workers, address=args.address, gpus_per_job=args.gpus_per_job,
                             progress=not args.quiet, slurm=slurm)
    counts: dict[str, int] = {}
    for s in status.values():
        counts[s] = counts.get(s, 0) + 1
    print(f"sweep {args.out}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
          + f" in {time.time() - t0:.1f}s; summary: {Path(args.out) / 'summary.csv'}")
    failed = sweep.failure_line(args.out, status)   # one line: what did not finish, its first error, how to go on
    if failed is None:   # a diverged run is a result
        return 0
    print(f"tdyn: {failed}", file=sys.stderr)
    return 1


def _cmd_bench(args) -> int:
    out = Path(args.out)
    if out.is_dir() or (out.exists() and not args.force):
        raise UserError(f"--out {args.out!r} " + ("is a directory" if out.is_dir() else "exists") +
                        "; the bench writes a new JSON file" + ("" if out.is_dir() else " (--force replaces it)"))
    _setup(args)
    from tdyn import bench

    bench.run(args.out, quick=args.quick, only=args.only, device=args.device)
    print(f"wrote {args.out}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line errors of every other bad input (no usage block): exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _Parser(prog="tdyn", description="Training dynamics of one-layer transformers: "
                "the papers' data, models, theory checks and figures.")
    from tdyn.threads import cli_threads

    p.add_argument("--threads", type=int, default=cli_threads(),
                   help="torch intra-op threads (default: $TDYN_THREADS or 1; see tdyn.threads)")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log what tdyn does (-v: runs, jobs, resumes; -vv: also flushes and checkpoints)")
    p.add_argument("-q", "--quiet-all", dest="quiet_all", action="store_true",
                   help="errors only, and no progress bars")
    p.add_argument("--import", dest="imports", type=_path, action="append", default=[], metavar="MODULE",
                   help="import MODULE (dotted name, or a .py file) first: your tasks, probes and reproductions "
                        "registered with tdyn's decorators (repeatable; sweep workers import it too; also "
                        "$TDYN_IMPORT and the `tdyn.tasks` entry-point group)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="list registered experiments", description="List registered experiments.")
    s.set_defaults(fn=_cmd_list)

    s = sub.add_parser("run", help="train one run (or ensemble) from a config file or an experiment name",
                       description="Train from a YAML/JSON config, a config shipped in the package (by name: "
                       "syn_small) or a registered experiment's default config, "
                       "or continue an interrupted run with --resume DIR.")
    s.add_argument("source", nargs="?", type=_path, help="config file (.yaml/.json), packaged config name (syn_small) or "
                   "experiment name")
    s.add_argument("--out", type=_path, help="run directory (default: runs/<name>)")
    s.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")
    s.add_argument("--seed", type=int, help="shorthand for --set seeds=N")
    s.add_argument("--resume", type=_path, metavar="DIR", help="continue DIR from its last checkpoint")
    s.add_argument("--force", action="store_true", help="overwrite an existing run directory")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=_cmd_run)

    s = sub.add_parser("reproduce", help="reproduce a paper figure/table into DIR",
                       description="Run what a figure/table needs and write results.json, CSV tables and PNG figures.")
    s.add_argument("name", nargs="?", help="experiment name (see `tdyn list`)")
    s.add_argument("--all", action="store_true",
                   help="every registered reproduction into OUT/<name>/ (going on past failures), then OUT/index.html")
    s.add_argument("--out", type=_path, required=True, help="output directory")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quick", action="store_true", help="small settings (minutes on 2 CPU cores)")
    s.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")
    s.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    s.add_argument("--force", action="store_true", help="overwrite a non-empty output directory")
    s.add_argument("--resume", action="store_true",
                   help="continue an interrupted reproduction in OUT: runs already trained with the same config are "
                        "kept, interrupted ones resume from their last checkpoint, then the analysis runs again "
                        "(with --all: the reproductions finished before are kept, the others continue)")
    s.add_argument("--judge-only", dest="judge_only", action="store_true",
                   help="judge the claims and draw the figures again from the tables in OUT (a directory this "
                        "reproduction wrote, e.g. its committed evidence), training nothing")
    s.add_argument("--evidence", type=_path, metavar="DIR",
                   help="with --all: the full-setting results the page leads with (the shipped docs/results): per "
                        "paper, which claims hold at full settings, with their provenance")
    s.add_argument("--full-under", dest="full_under", type=float, metavar="SECONDS",
                   help="with --all --quick --evidence DIR: run at full settings every reproduction whose full run "
                        "in DIR took at most SECONDS (its verdicts re-derived here); the rest quick")
    s.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="with --all: run N reproductions at once, one per worker process (each with --threads "
                        "torch threads), the longest first by --evidence's run times; default 1 (a reproduction's "
                        "own --workers, where it has one, sizes its sweeps' pools)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=_cmd_reproduce)
    _add_options(s, argv, "reproduce")

    s = sub.add_parser("config", help="print a run config, sweep spec or a reproduction's run configs as YAML "
                       "that `tdyn run` / `tdyn sweep` take back",
                       description="Print, as YAML that `tdyn run` (or `tdyn sweep`) takes back unchanged, what NAME "
                       "names after --set (validated; an override NAME would not use exits 2 listing what it accepts): "
                       "a packaged run config or config file; a packaged sweep spec (its base inlined); a "
                       "reproduction's run configs: one bare, several as one YAML document each headed by "
                       "NAME:CONFIG, which prints (and `tdyn run` trains) that one alone.")
    s.add_argument("name", help="packaged config or sweep, config file, reproduction, or REPRODUCTION:CONFIG "
                   "(see `tdyn list`)")
    s.add_argument("--seed", type=int, help="the reproduction's seed (default 0); for a run config: --set seeds=N")
    s.add_argument("--quick", action="store_true", help="the --quick settings")
    s.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")
    s.set_defaults(fn=_cmd_config)
    _add_options(s, argv, "config")

    s = sub.add_parser("sweep", help="run a sweep spec (grid/zip/random axes × seeds) as batched jobs",
                       description="Expand a sweep spec into runs, train runs that differ only in seed / learning "
                       "rates / init scale as one ensemble job, on a local process pool, Ray or Slurm. Re-running "
                       "skips finished runs and resumes unfinished ones.")
    s.add_argument("spec", nargs="?", type=_path, help="sweep spec (YAML/JSON) or packaged spec name (syn_small_lr); "
                   "with -m, the base run config (packaged config name, reproduction config or config file)")
    s.add_argument("-m", "--multirun", nargs="+", metavar="KEY=A,B",
                   help="hydra's multirun: SPEC is a run config and each KEY=A,B an axis of the grid (every "
                        "combination), KEY=V an override, seeds=0,1,2 the seeds: the sweep spec a YAML grid would be")
    s.add_argument("--out", type=_path, help="sweep directory")
    s.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                   help="override a value of the spec's base config (repeatable; replaces the spec's own set: entry "
                        "for that key; a key a sweep axis varies is refused)")
    s.add_argument("--executor", default="local", choices=["local", "inline", "ray", "slurm"],
                   help="local: a process pool (default); inline: the jobs one after another in this process; "
                        "ray; slurm (a job array, requeued and resumed when preempted)")
    s.add_argument("--workers", type=int, help="local pool size / Ray CPUs (default: the cores; locally, divided by --threads)")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray); every node needs --out on a "
                   "shared filesystem and tdyn (plus any --import module) installed")
    s.add_argument("--gpus-per-job", dest="gpus_per_job", type=float, metavar="N",
                   help="with --executor ray: GPUs each job asks Ray for (num_gpus; 0.25: four jobs share a GPU)")
    g = s.add_argument_group("Slurm resources (--executor slurm; override the spec's slurm: section)")
    g.add_argument("--slurm-partition", metavar="NAME")
    g.add_argument("--slurm-time", type=int, metavar="MINUTES", help="time limit per job (default 60)")
    g.add_argument("--slurm-gpus", type=int, metavar="N", help="GPUs per node (default 0)")
    g.add_argument("--slurm-cpus", type=int, metavar="N", help="CPUs per task (default 1)")
    g.add_argument("--slurm-mem-gb", type=float, metavar="GB")
    g.add_argument("--slurm-account", metavar="NAME")
    g.add_argument("--slurm-extra", action="append", metavar="FLAG=VALUE", help="a further sbatch flag (repeatable)")
    s.add_argument("--summarize", type=_path, metavar="DIR", help="(re)write DIR/summary.csv and exit")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=_cmd_sweep)

    s = sub.add_parser("bench", help="measure the speed of each paper's canonical settings",
                       description="Measure steps/s, ensemble vs one-at-a-time, sweep wall time and the other "
                       "registered speed figures in one process; write bench.json and print a table.")
    s.add_argument("--out", type=_path, default="bench.json", help="output JSON (default: bench.json)")
    s.add_argument("--force", action="store_true", help="replace an existing --out")
    s.add_argument("--quick", action="store_true", help="fewer repetitions (extrapolated where marked)")
    s.add_argument("--only", action="append", metavar="NAME", help="run only this entry (repeatable)")
    s.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the training entries train (default cpu); cuda also measures the GPU's matmul")
    s.set_defaults(fn=_cmd_bench)

    s = sub.add_parser("report", help="summarise a run, sweep or reproduction directory; write DIR/index.html",
                       description="Summarise a run, ensemble, sweep, reproduction or `reproduce --all` directory "
                       "and write the static page DIR/index.html (figures in DIR/report_files/).")
    s.add_argument("dir", type=_path)
    s.add_argument("--readme", type=_path, metavar="FILE",
                   help="instead: write the verdict table of every results.json below DIR into FILE's "
                   "<!-- verdicts:begin/end --> block (how the README's table is made)")
    s.add_argument("--evidence", type=_path, metavar="DIR",
                   help="a directory of full-setting results (docs/results) the page leads with: per paper, "
                        "which claims hold at full settings; DIR's own runs follow, compared with them")
    s.set_defaults(fn=_cmd_report)
    return p


def io_error(e: OSError) -> str:
    """One line for an I/O error on a path (a file where a directory is expected, unwritable, too long a
    name, missing): the path, what failed, and the second path of a rename or link."""
    import errno

    why = e.strerror or type(e).__name__
    if e.errno == errno.ENAMETOOLONG:
        why += f" (a name may have at most {os.pathconf('/', 'PC_NAME_MAX')} bytes)"
    where = repr(os.fsdecode(e.filename)) + (f" -> {os.fsdecode(e.filename2)!r}" if e.filename2 else "")
    return f"{where}: {why}"


def out_of_memory(e: BaseException) -> str | None:
    """One line for an allocation the settings made too large (torch's CPU allocator, CUDA, Python), else
    None. The parameters are checked before they are built (``tdyn.train.trainer.check_resources``); this
    catches what no estimate covers, such as a batch of 10¹² tokens."""
    import re

    text = str(e)
    if isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower():
        size = re.search(r"allocate (\d+) bytes", text)
        what = f" (an allocation of {int(size.group(1)) / 2**30:.3g} GiB)" if size else ""
        return (f"out of memory{what}: the settings (model, vocabulary, ensemble, batch or sequence sizes) need "
                f"more memory than this machine has")
    return None


def _experiment_config(name: str, what: str) -> dict:
    """Config sources given by a name that is no packaged config (the CLI sits above both): an
    experiment's default run config (``tdyn run NAME``), or one of its configs by ``NAME:CONFIG`` (what
    ``tdyn config NAME:CONFIG`` prints), at the default seed and full settings."""
    from tdyn.config import packaged
    from tdyn.reproduce.registry import EXPERIMENTS, ReproduceContext, default_run_config, get

    exp_name, _, part = name.partition(":")
    if exp_name not in EXPERIMENTS:
        raise UserError(f"{what}: {name!r} is neither a config file, a packaged config ({', '.join(packaged())}) "
                        "nor an experiment (see `tdyn list`)")
    if part:
        from tdyn.reproduce import runner

        exp = get(exp_name)
        cfgs = runner.resolved_configs(exp, ReproduceContext(out=Path("."), options=exp.make_options({}))) \
            if exp.configs is not None or exp.default_config is not None else {}
        if part not in cfgs:
            raise UserError(f"{what}: {exp_name} trains no config {part!r}; its configs: {', '.join(cfgs) or 'none'}")
        return cfgs[part].model_dump(mode="json")
    if get(exp_name).default_config is None:
        raise UserError(f"{what}: experiment {name!r} has no run config of its own; `tdyn reproduce {name}` runs it, "
                        f"and `tdyn run {name}:CONFIG` trains one of the configs `tdyn config {name}` prints")
    return default_run_config(name, what)


def _continue_hint(args) -> str:
    """How to go on after a write the machine failed (disk full): free space, then continue."""
    how = {"sweep": "re-run the same `tdyn sweep` command", "reproduce": "re-run it with --resume",
           "run": f"`tdyn run --resume {getattr(args, 'resume', None) or getattr(args, 'out', None) or 'DIR'}`"
           }.get(args.command)
    return f"; free space, then {how} to continue" if how else ""


def _user_code(e: BaseException, args) -> int:
    """An exception tdyn did not expect: one line and exit 2 when it arose in the user's own code (a task,
    a model, a probe, a plugin: :func:`tdyn.errors.user_frame`), its traceback with ``-v``; else re-raised
    (a bug of tdyn's, with its traceback)."""
    err = user_code_error(e)
    if err is None:
        raise e
    if args.verbose:
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    print(f"tdyn: error: {err}", file=sys.stderr)
    return 2


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone (``tdyn list | head -1``)."""
    try:
        import select

        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (AttributeError, OSError, ValueError):   # no poll (Windows), no file descriptor
        return False


def main(argv: list[str] | None = None) -> int:
    """The command. Its output's reader closing early (``tdyn list | head -1``) ends it quietly with exit 1
    (the command stopped where it was printing: no traceback, nothing more printed; stdout is pointed at
    ``os.devnull`` so that the interpreter's flush at exit does not raise again). Exit 1, not 0: under
    ``set -o pipefail`` a script sees that the command did not finish; not the shell's 141 (SIGPIPE),
    since Python ignores SIGPIPE and tdyn stopped on its own."""
    try:
        rc = _main(argv)
        sys.stdout.flush()     # a broken pipe surfaces here, inside the handler, not at interpreter exit
        return rc
    except BrokenPipeError:
        if not _stdout_closed():
            raise              # another pipe (a worker's): not the reader of stdout
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1


def _main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser(argv)
    except UserError as e:
        print(f"tdyn: error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    import logging

    level = logging.ERROR if args.quiet_all else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(format="tdyn: %(levelname)s: %(name)s: %(message)s", level=level)
    if args.quiet_all and hasattr(args, "quiet"):
        args.quiet = True
    try:
        if args.imports:
            from tdyn import plugins

            plugins.add(args.imports)
        return args.fn(args)
    except WriteError as e:   # a file written whole or not at all could not be written: it is as it was
        c = e.__context__      # the first write that failed (the failed run's metrics and status fail after it)
        while c is not None:
            e, c = (c if isinstance(c, WriteError) else e), c.__context__
        print(f"tdyn: error: {e}{_continue_hint(args) if e.environment else ''}", file=sys.stderr)
        return 1 if e.environment else 2
    except UserError as e:
        if args.verbose and isinstance(e, UserCodeError) and e.__cause__ is not None:
            import traceback

            traceback.print_exception(e.__cause__, file=sys.stderr)
        print(f"tdyn: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError as e:
        if e.filename is None and _stdout_closed():
            raise              # stdout's reader has gone: main() ends quietly
        return _user_code(e, args)
    except OSError as e:
        if e.filename is None and e.errno in RESOURCE_ERRNOS and user_code_error(e) is None:
            # the machine refused a process, memory or a file descriptor (a fork at the process limit): not a bug
            print(f"tdyn: error: the machine refused a resource tdyn needed ({e.strerror or e}; "
                  f"{type(e).__name__}, errno {e.errno}): nothing was left half-written; retry when it has "
                  f"processes, memory or file descriptors to spare{_continue_hint(args)}", file=sys.stderr)
            return 1
        if e.filename is None:   # not about a path: the user's code's, or a bug with its traceback
            return _user_code(e, args)
        print(f"tdyn: error: {io_error(e)}", file=sys.stderr)
        return 1 if e.errno in ENVIRONMENT_ERRNOS else 2
    except (MemoryError, RuntimeError) as e:
        why = out_of_memory(e)
        if why is None:
            return _user_code(e, args)
        print(f"tdyn: error: {why}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:   # a text file tdyn reads is checked where it is read; this says which byte
        if user_frame(e) is not None:
            return _user_code(e, args)
        print(f"tdyn: error: a file is not UTF-8 text ({e.reason} at byte {e.start}): {e}", file=sys.stderr)
        return 2
    except Exception as e:
        return _user_code(e, args)
    except KeyboardInterrupt:
        how = {"sweep": "re-run the same `tdyn sweep` command (finished runs are kept, the others resume)",
               "reproduce": "re-run it with --resume"}.get(args.command, "resume with `tdyn run --resume DIR`")
        print(f"tdyn: interrupted; {how}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
