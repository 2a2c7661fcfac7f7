"""A paper's manifest: what one paper package declares, read by every registry and index of the core.

A paper is one package (``tdyn/papers/<paper>/`` for the built-in ones, any importable package for a
user's) whose ``__init__`` defines ``MANIFEST = Paper(...)``: its name, the labels the report and docs
use, and, by name, the modules that register its tasks, probes, reproductions and bench entries. The
manifest imports nothing heavy (no torch), so listing the papers, their reproductions and their docs
pages costs no import of the paper's code; a registry imports a module only when one of its names is
looked up. Registering a manifest (:func:`tdyn.papers.register`) is the one way a paper enters tdyn,
built-in or plugin.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Reproduction:
    """One reproduction: the module that registers it and its one-line description (what ``tdyn list``
    and the report show without importing the module)."""

    module: str
    description: str
    reproduces: str = ""   # what it reproduces: a paper figure by number, or the statement (shown beside its main figure)
    reuses: str = ""       # the reproduction whose runs it reads (option ``sweep_dir``); in ``reproduce --all`` it runs after it
    #: why its full setting needs a GPU (the measurement: its arithmetic on a CPU against its time on one GPU);
    #: ``reproduce --all`` on a CPU then runs it at quick settings, labelled so, and its full evidence is made on a GPU
    gpu_scale: str = ""
    #: tables its committed evidence leaves out (``export_evidence``), each with why: too large to commit and made
    #: again in seconds by the reproduction itself (its figures and results.json are exported; ``--judge-only`` of the
    #: evidence then names the missing table)
    unshipped: dict[str, str] = dataclasses.field(default_factory=dict)
    #: run-config keys its claims take as given, each with why (``--set`` on one, or on a section holding one, exits 2
    #: naming it): keys no other check catches (keys that differ between its runs, and keys an option named like the
    #: key's last part writes, are refused without a declaration; an option named otherwise, such as icl-gd's
    #: ``--Ks`` for ``model.layers``, needs one)
    fixed: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Paper:
    """What a paper package declares (see the module docstring).

    ``prefix`` begins every reproduction name (``<prefix>/fig4``); ``docs`` is its page under
    ``docs/reproductions/`` (the page's headings are its reproductions' names); ``requires`` names the
    papers whose modules this one may import (the layering test checks it); ``exports`` are the public
    names re-exported by ``tdyn.models``, ``tdyn.data`` and ``tdyn.theory`` (section -> name -> module);
    ``aliases`` keep the module paths of earlier tdyn versions importable (old path -> module; read from the
    built-in papers, the only ones whose modules ever had a ``tdyn.*`` path).
    """

    name: str
    prefix: str
    label: str
    title: str
    docs: str
    tasks: dict[str, str] = dataclasses.field(default_factory=dict)
    probes: dict[str, str] = dataclasses.field(default_factory=dict)
    reproductions: dict[str, Reproduction] = dataclasses.field(default_factory=dict)
    benches: dict[str, str] = dataclasses.field(default_factory=dict)
    requires: tuple[str, ...] = ()
    exports: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        bad = [n for n in self.reproductions if not n.startswith(self.prefix + "/")]
        if bad:
            raise ValueError(f"paper {self.name!r}: reproduction names must begin with {self.prefix + '/'!r}: {bad}")
