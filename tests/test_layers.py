"""The import layers of docs/architecture.md stay true (a small AST test: nothing is imported).

Each module belongs to a layer; a module imports only modules of its own layer or below. Imports inside
functions are allowed only where listed (optional heavy extras and the few late-bound plug-in points).
No module-level import cycle exists between modules.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

PAPER = "<a paper's module>"   # tdyn.papers.<paper>.<module>: above the core (its manifest, tdyn.papers.<paper>, is base)

#: Bottom to top. The first matching prefix (longest first) names a module's layer.
LAYERS = [
    ["tdyn", "tdyn.errors", "tdyn.lazy", "tdyn.manifest", "tdyn.native", "tdyn.papers", "tdyn.plugins", "tdyn.registry", "tdyn.schema",
     "tdyn.stats", "tdyn.seeding", "tdyn.threads"],
    ["tdyn.data", "tdyn.models"],
    ["tdyn.theory"],
    ["tdyn.tasks"],
    ["tdyn.config", "tdyn.results"],
    ["tdyn.runs", "tdyn.probes"],
    ["tdyn.train"],
    ["tdyn.sweep", "tdyn.bench", "tdyn.api"],
    ["tdyn.report"],
    ["tdyn.reproduce"],
    [PAPER],
    ["tdyn.cli", "tdyn.__main__"],
]

#: Module-level imports that break the layering, each temporary.
EXCEPTIONS: set[tuple[str, str]] = set()

#: Imports of tdyn modules inside functions that are allowed (everything else is imported at module level).
LATE_ALLOWED = {
    # the CLI imports each command's modules when the command runs (fast `tdyn --help`)
    ("tdyn.cli", "*"),
    # `tdyn.train(...)` (the callable package) imports the trainer on the first call: `tdyn.threads`
    # is read by the CLI's argument parser, which must not import torch's training stack
    ("tdyn.train", "tdyn.train.trainer"),
    # the old name ``tdyn.sweep.plot_metric`` (the plot lives in the report layer)
    ("tdyn.sweep", "tdyn.report.plots"),
}

# Models never import a distribution (a task wires them).
FORBIDDEN = [("tdyn.models", "tdyn.data")]


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "tdyn").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _paper(mod: str) -> str | None:
    """The paper of a paper's module (tdyn.papers.<paper>.<module>), else None (a manifest is not one)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["tdyn", "papers"] else None


def _layer(mod: str) -> int:
    if _paper(mod):
        return next(i for i, prefixes in enumerate(LAYERS) if PAPER in prefixes)
    best, layer = -1, None
    for i, prefixes in enumerate(LAYERS):
        for pre in prefixes:
            if (mod == pre or mod.startswith(pre + ".")) and len(pre) > best:
                best, layer = len(pre), i
    assert layer is not None, f"{mod} is in no layer of LAYERS (add it, and to docs/architecture.md)"
    return layer


def _imports(mod: str):
    """(target module, at module level?) for every tdyn import of ``mod``."""
    tree = ast.parse(MODULES[mod].read_text())
    top = {id(n) for n in tree.body}
    pkg = mod if MODULES[mod].name == "__init__.py" else mod.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == "tdyn" or t.startswith("tdyn."):
                yield t, id(node) in top


def test_layers():
    bad = []
    for mod in MODULES:
        for tgt, top in _imports(mod):
            if not top:
                if (mod, "*") not in LATE_ALLOWED and (mod, tgt) not in LATE_ALLOWED:
                    bad.append(f"{mod}: import of {tgt} inside a function (import it at module level)")
                continue
            if _layer(tgt) > _layer(mod) and (mod, tgt) not in EXCEPTIONS:
                bad.append(f"{mod} (layer {_layer(mod)}) imports {tgt} (layer {_layer(tgt)})")
            for a, b in FORBIDDEN:
                if mod.startswith(a) and (tgt == b or tgt.startswith(b + ".")):
                    bad.append(f"{mod} imports {tgt}: {a} must not import {b}")
    assert not bad, "\n".join(bad)


def test_papers_roles():
    """The core never imports a paper's module (it reads the manifests); a paper imports another paper
    only if its manifest ``requires`` it; inside a paper the model never imports the data, and nothing
    imports a reproduction module."""
    from tdyn import papers

    requires = {p.name: set(p.requires) for p in papers.manifests()}
    repro = {r.module for p in papers.manifests() for r in p.reproductions.values()}
    bad = []
    for mod in MODULES:
        for tgt, _ in _imports(mod):
            if _paper(tgt) and not _paper(mod):
                bad.append(f"{mod} (core) imports {tgt} (a paper's module)")
            if _paper(tgt) and _paper(mod) and _paper(tgt) != _paper(mod) and _paper(tgt) not in requires.get(_paper(mod), ()):
                bad.append(f"{mod} imports {tgt}: paper {_paper(mod)!r} does not declare requires={_paper(tgt)!r}")
            if _paper(mod) and mod.endswith(".model") and tgt == mod.rsplit(".", 1)[0] + ".data":
                bad.append(f"{mod} imports {tgt}: a model never imports its distribution")
            if tgt in repro and tgt != mod:
                bad.append(f"{mod} imports {tgt}, a reproduction module (move what they share to the paper's analysis)")
    assert not bad, "\n".join(bad)
    for p in papers.manifests():   # a manifest imports no torch: it is read by `tdyn list`, the report, the docs
        assert "torch" not in MODULES[f"tdyn.papers.{p.name}"].read_text(), p.name


def test_only_the_cli_and_the_papers_import_the_reproduce_core():
    users = {m for m in MODULES for t, _ in _imports(m)
             if t.startswith("tdyn.reproduce") and not m.startswith("tdyn.reproduce") and not _paper(m)}
    assert users <= {"tdyn.cli"}, users
    # nor by name: no module below the CLI names an experiments module (e.g. in an import table)
    named = [m for m, path in MODULES.items() if not m.startswith(("tdyn.reproduce", "tdyn.papers")) and m != "tdyn.cli"
             and "tdyn.reproduce" in path.read_text()]
    assert not named, named


def test_no_module_level_cycle():
    graph = {m: {t for t, top in _imports(m) if top and t in MODULES and t != m} for m in MODULES}
    # a package's __init__ importing its own submodules is not a cycle of the layering
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if t.startswith(m + "."):
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m)
    assert not cycles, cycles


def test_validating_a_config_imports_little():
    """Validating a config imports its task's modules only: no experiments, no report, no matplotlib."""
    import subprocess
    import sys

    code = ("import sys; from tdyn.config import load_config; load_config('syn_small'); "
            "m = [k for k in sys.modules if k.startswith('tdyn')]; "
            "print(len(m), any(k.startswith(('tdyn.reproduce', 'tdyn.report')) for k in m), 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SRC.parent, check=True)
    n, upward, mpl = out.stdout.split()
    assert upward == "False" and mpl == "False" and int(n) <= 26, out.stdout   # 6 of them: tdyn.manifest, tdyn.papers and the 4 manifests


#: Core modules that still name a built-in paper's things, each with what is left to do.
NAMES_PENDING: dict[str, str] = {}


def test_the_core_names_no_paper():
    """No module outside ``papers/`` names a built-in paper's tasks, probes or reproductions (or its
    prefix, or its package): everything the core knows of a paper it reads from the manifests."""
    import re

    from tdyn import papers

    names = set()
    for p in papers.manifests():
        names |= set(p.tasks) | set(p.probes) | set(p.reproductions) | {p.prefix + "/", f"tdyn.papers.{p.name}"}
    found = {}
    for mod, path in MODULES.items():
        if _paper(mod) or mod.startswith("tdyn.papers") or mod in NAMES_PENDING:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for n in names:
                    if (n in node.value if n.endswith("/") else
                            re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", node.value)):
                        found.setdefault(mod, set()).add(f"line {node.lineno}: {n}")
    assert not found, found
