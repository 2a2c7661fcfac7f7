"""Registry of named experiments (`tdyn list`, `tdyn run NAME`, `tdyn reproduce NAME`).

A reproduction module registers its reproductions with :func:`register`; its paper's manifest
(:mod:`tdyn.papers`) names the module of each (``tdyn reproduce NAME`` imports only NAME's module;
``tdyn list`` reads the generated catalog). A test checks the manifests and the registrations agree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from tdyn import papers
from tdyn.errors import ConfigError, UserError
from tdyn.registry import Registry, origin_of
from tdyn.schema import format_validation_error



class Overrides(list):
    """The user's ``--set`` overrides, remembering whether a run config consumed them
    (:func:`tdyn.reproduce.common.configure` marks them). The runner rejects overrides that no
    config of the reproduction consumed (exit 2), so a knob is never silently dropped."""

    consumed: bool = False
    device: str = "cpu"   # the reproduction's --device, which ``configure`` puts into every run config


@dataclasses.dataclass
class ReproduceContext:
    """What a reproduction receives: where to write, the user's ``--set`` overrides (applied to every
    run config it trains, through ``configure``) and its typed ``options`` (``Experiment.options``)."""

    out: Path
    seed: int = 0
    quick: bool = False
    overrides: list[str] = dataclasses.field(default_factory=list)
    device: str = "cpu"
    progress: bool = True
    options: Any = None
    resume: bool = False   # keep / continue the runs of an earlier attempt in ``out`` (same configs)
    judge_only: bool = False   # judge and draw again from ``out``'s tables, training nothing (``--judge-only``)

    def __post_init__(self):
        if not isinstance(self.overrides, Overrides):
            self.overrides = Overrides(self.overrides)
        self.overrides.device = self.device


@dataclasses.dataclass
class Experiment:
    """A registered reproduction.

    * ``default_config()``: a run config so that ``tdyn run NAME`` works;
    * ``configs(ctx)``: every run config (raw dicts, before ``--set``) the reproduction trains, by name.
      Given, ``--set`` is checked against each before anything runs and ``tdyn config NAME`` prints them;
    * ``takes_set``: False for a reproduction that trains nothing (``--set`` is then an error);
      None (not declared) means the runner checks after the run that some config consumed the overrides;
    * ``options``: a pydantic model of the reproduction's own typed options (``tdyn reproduce NAME --help``).
    """

    name: str
    description: str
    reproduce: Callable[[ReproduceContext], dict[str, Any]]
    default_config: Callable[[], dict[str, Any]] | None = None
    configs: Callable[[ReproduceContext], dict[str, dict]] | None = None
    takes_set: bool | None = None
    options: type | None = None
    phases: Any = None       # a reproduction written as phases (tdyn.reproduce.phases.Phases): --judge-only works

    def __post_init__(self):
        if self.configs is not None:
            self.takes_set = True

    def make_options(self, values: dict[str, Any] | None = None):
        """The typed options from ``values`` (defaults for the rest); a bad value is a ConfigError."""
        if self.options is None:
            if values:
                raise UserError(f"{self.name} takes no options (given: {', '.join(values)})")
            return None
        try:
            return self.options.model_validate(values or {})
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, self.options, "option")) from None


EXPERIMENTS: Registry[Experiment] = Registry("experiment", papers="reproductions")
_REGISTRY = EXPERIMENTS._items  # the registered entries (tests add temporary ones with monkeypatch.setitem)


def register(name: str, description: str | None = None, default_config: Callable[[], dict] | None = None, *,
             configs: Callable[[ReproduceContext], dict[str, dict]] | None = None,
             takes_set: bool | None = None, options: type | None = None, origin: tuple[str, str] | None = None):
    """Decorator registering ``reproduce(ctx) -> results`` under ``name`` (see :class:`Experiment`). A
    paper's reproduction takes its description from the paper's manifest; one outside any paper gives it.
    ``origin``: the code that registers it (default: the decorated function's; see
    :meth:`tdyn.registry.Registry.register`: the same code registering it again replaces it)."""
    declared = papers.of(name)
    declared = declared.reproductions.get(name) if declared else None
    if description is None:
        if declared is None:
            raise UserError(f"reproduction {name!r}: give a description (no paper's manifest declares it)")
        description = declared.description

    def deco(fn):
        EXPERIMENTS.register(name, Experiment(name, description, fn, default_config, configs, takes_set, options),
                             origin=origin or origin_of(fn), description=description)
        return fn

    return deco


CATALOG = Path(__file__).with_name("catalog.json")


def _option_entry(field) -> dict:
    import typing

    ann = field.annotation
    return {"help": field.description or "", "default": None if field.default is None else str(field.default),
            "list": any(typing.get_origin(a) in (list, tuple) for a in (ann, *typing.get_args(ann)))}


def catalog() -> dict[str, dict]:
    """The generated catalog of the built-in reproductions (``catalog.json``, rewritten by
    ``make catalog``; a test checks it matches the registrations), read without
    importing any experiment module, so that ``tdyn list`` and ``--help`` import no torch."""
    import json

    return json.loads(CATALOG.read_text(encoding="utf-8"))


def all_experiments() -> dict[str, Experiment]:
    return EXPERIMENTS.items()


def get(name: str) -> Experiment:
    return EXPERIMENTS.get(name)


def default_run_config(name: str, what: str = "config") -> dict:
    """The run config ``tdyn run NAME`` trains: experiment ``name``'s default config (the name resolver
    the CLI installs in :func:`tdyn.config.set_name_resolver`)."""
    exp = get(name)
    if exp.default_config is None:
        raise ConfigError(f"{what}: experiment {name!r} has no run config; use `tdyn reproduce {name}`")
    return exp.default_config()


