"""What the Makefile installs (read from the Makefile and pyproject.toml, nothing installed): `make demo`
installs no test extras, and the torch the Makefile pins lies in the library's tested range."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = {"pytest", "ray", "selenium", "submitit", "tensorboard", "wandb"}


def _makefile() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(target -> prerequisites, target -> recipe lines), with the Makefile's ``:=``/``?=`` variables expanded."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    variables: dict[str, str] = {}

    def expand(s: str) -> str:
        while (m := re.search(r"\$\((\w+)\)", s)) and m.group(1) in variables:
            s = s.replace(m.group(0), variables[m.group(1)])
        return s

    deps: dict[str, list[str]] = {}
    recipes: dict[str, list[str]] = {}
    target = None
    for line in text.splitlines():
        if line.startswith("\t"):
            if target is not None:
                recipes[target].append(expand(line.strip()))
        elif m := re.match(r"^(\w+)\s*[:?]?=\s*(.*)$", line):
            variables[m.group(1)] = expand(m.group(2).strip())
        elif m := re.match(r"^([^\s:#=][^:=]*):(?!=)(.*)$", line):
            target = expand(m.group(1).strip())
            deps[target] = expand(m.group(2)).split()
            recipes[target] = []
        elif line.strip() and not line.startswith("#"):
            target = None
    return deps, recipes


def _closure(deps: dict[str, list[str]], target: str) -> set[str]:
    seen, todo = set(), [target]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo += deps.get(t, [])
    return seen


def _installed_names(line: str, extras: dict[str, list[str]]) -> set[str]:
    """The distributions a ``pip install`` recipe line names (``.[x,y]`` expanded through pyproject's extras)."""
    words = line.split("pip install", 1)[1].split()
    names = set()
    for w in words:
        w = w.strip("'\"")
        if w.startswith("-"):
            continue
        if m := re.match(r"^\.\[([\w,-]+)\]$", w):
            names |= {Requirement(r).name for x in m.group(1).split(",") for r in extras[x]}
        elif w != ".":
            names.add(Requirement(w).name)
    return names


def test_make_demo_installs_no_test_extras():
    deps, recipes = _makefile()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo = _closure(deps, "demo")
    assert ".venv/.installed-test" not in demo and ".venv/.installed-core" in demo
    lines = [ln for t in demo for ln in recipes.get(t, []) if "pip install" in ln]
    assert lines, "the demo's targets install nothing?"
    names = set().union(*(_installed_names(ln, extras) for ln in lines))
    assert "torch" in names and not names & TEST_ONLY, sorted(names & TEST_ONLY)
    # and the test target does add them (the parse above sees what it should)
    test_lines = [ln for t in _closure(deps, "test") for ln in recipes.get(t, []) if "pip install" in ln]
    assert TEST_ONLY <= set().union(*(_installed_names(ln, extras) for ln in test_lines))


def test_makefile_torch_pin_lies_in_the_tested_range():
    deps, recipes = _makefile()
    pins = [re.search(r"torch==([\w.+]+)", ln) for ln in recipes[".venv/.installed-core"]]
    pins = [m.group(1) for m in pins if m]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    assert len(pins) == 1 and len(torch) == 1
    assert torch[0].specifier.contains(pins[0]), (pins[0], str(torch[0].specifier))
    assert not any(s.operator == "==" for s in torch[0].specifier), "the library takes a range of torch"
