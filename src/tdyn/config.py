"""Typed run configs (pydantic): validation on load, ``--set key.path=value`` overrides, and
one-line error messages naming the key, the bad value and what is allowed."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import yaml
from pydantic import BaseModel, Field, NonNegativeInt, PositiveFloat, ValidationError, model_serializer, model_validator

from tdyn.errors import ConfigError
from tdyn.schema import Strict, _resolve, check_finite, format_validation_error
from tdyn.tasks import TASKS, get_task

#: An Adam β: in [0, 1) (β = 1 never forgets; the bias correction divides by 1 − βᵗ = 0).
Beta = Annotated[float, Field(ge=0, lt=1)]


class ScheduleConfig(Strict):
    """A learning-rate schedule (tdyn.train.schedules): the factor f(t) of step t (t = 0 is the first update); the group's rate at t is lr · f(t).

    * ``warmup`` W: f(t) = t / W for t < W (from 0, as transformers' schedules), then the decay;
    * ``kind``: ``constant`` (1), ``linear`` (1 → ``min_factor`` at step ``horizon``), ``cosine`` (half a cosine
      from 1 to ``min_factor`` at ``horizon``), ``step`` (``gamma`` ** (t // ``step_size``), torch's StepLR);
    * ``horizon``: the step at which linear and cosine end (default: ``optim.steps``); f stays at
      ``min_factor`` after it."""

    kind: Literal["constant", "linear", "cosine", "step"] = "constant"
    warmup: int = Field(0, ge=0, description="steps of linear warm-up from 0")
    horizon: int | None = Field(None, ge=1, description="the step where linear / cosine decay ends (default optim.steps)")
    min_factor: float = Field(0.0, ge=0, le=1, description="the floor of linear / cosine decay, as a fraction of lr")
    step_size: int | None = Field(None, ge=1, description="kind step: steps between decays")
    gamma: float = Field(0.1, gt=0, description="kind step: the factor per decay")

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "step" and self.step_size is None:
            raise ConfigError("schedule: kind 'step' needs step_size (the steps between decays)")
        if self.kind != "step" and self.step_size is not None:
            raise ConfigError(f"schedule: step_size is for kind 'step', not {self.kind!r}")
        if self.horizon is not None and self.warmup > self.horizon:
            raise ConfigError(f"schedule: warmup = {self.warmup} is past horizon = {self.horizon}")
        return self


class GroupConfig(Strict):
    """A parameter group with its own optimizer and learning rate (e.g. Scan and Snap's η_Y, η_Z)."""

    params: list[str] = Field(min_length=1)
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    #: the group's learning-rate schedule (None: lr at every step)
    schedule: ScheduleConfig | None = None

    @model_serializer(mode="wrap")
    def _without_no_schedule(self, handler):
        """``schedule`` is left out where there is none: a run's config.json, and so its identity, is the one it
        had before schedules existed."""
        out = handler(self)
        if isinstance(out, dict) and out.get("schedule") is None:
            out.pop("schedule", None)
        return out


class FreezeRule(Strict):
    """Frozen for steps < ``until``, for steps >= ``after``, or ``always``."""

    until: int | None = Field(None, ge=0)
    after: int | None = Field(None, ge=0)
    always: bool = False

    def frozen(self, step: int) -> bool:
        return (self.always or (self.until is not None and step < self.until)
                or (self.after is not None and step >= self.after))


#: The most training steps a config may ask for (a step counter and its schedules stay exact integers).
MAX_STEPS = 10**15


class OptimConfig(Strict):
    steps: int = Field(100, ge=0, le=MAX_STEPS)
    groups: dict[str, GroupConfig] = Field(min_length=1)
    freeze: dict[str, FreezeRule] = {}
    grad_clip: float | None = Field(None, gt=0)


class EnsembleConfig(Strict):
    """Members = seeds × lr sets × init scales; each member trains as if alone. An entry of ``lrs`` is
    {group: rate}, or a bare number: that rate for every group (``--set ensemble.lrs=0.001,0.01``;
    :func:`expand_lrs` writes it out before validation)."""

    lrs: list[dict[str, PositiveFloat]] = []
    init_scales: list[PositiveFloat] = []


class ProbeConfig(Strict):
    """Probes ``names`` run every ``every`` steps (0: never on a grid), at the listed ``steps``, at every
    checkpoint and at the final step; ``options[name]`` is handed to probe ``name`` (``ctx.options``)."""

    names: list[str] = []
    every: int = Field(1, ge=0)
    steps: list[NonNegativeInt] = []
    options: dict[str, dict[str, Any]] = {}

    @model_validator(mode="after")
    def _check(self):
        for k in self.options:
            if k not in self.names:
                raise ConfigError(f"probes.options.{k}: {k!r} is not in probes.names ({', '.join(self.names) or 'none'})")
        try:
            check_finite(self.options, "probes.options")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return self


class CheckpointConfig(Strict):
    """Checkpoint steps: log-spaced (``num`` of them), every ``every`` steps, and/or listed ``steps``;
    the final state is always saved, and step 0 (the initial state) unless ``initial`` is false."""

    schedule: Literal["log", "linear", "none"] = "log"
    num: int = Field(10, ge=1, le=100_000)   # the log/linear schedule's points are computed one by one
    every: int | None = Field(None, ge=1)
    steps: list[NonNegativeInt] = []
    initial: bool = Field(True, description="save step 0, the initial state; false for runs whose only use is "
                          "their result (two files fewer per run; an interrupted run then trains again from "
                          "the start unless a later checkpoint exists); a schedule that includes step 0 "
                          "still saves it")


class LogConfig(Strict):
    """Optional copies of the metric stream (``tdyn.train.sinks``); metrics.jsonl is always written."""

    tensorboard: bool = False
    wandb: bool = False
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    wandb_project: str = "tdyn"


class RunConfig(Strict):
    task: str
    data: dict[str, Any] = {}
    model: dict[str, Any] = {}
    seeds: list[int] = Field([0], min_length=1)
    ensemble: EnsembleConfig = EnsembleConfig()
    optim: OptimConfig
    probes: ProbeConfig = ProbeConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()
    dtype: Literal["float32", "float64"] = "float32"
    #: mixed precision: the training loss's forward (and so its backward) under ``torch.autocast`` in this
    #: dtype, parameters, gradients and optimizer state staying in ``dtype`` (the float32 master copy);
    #: probes measure outside autocast, in full precision. None: everything in ``dtype``.
    autocast: Literal["bfloat16"] | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    #: replay each training step as CUDA graphs (device cuda; tdyn.train.graphs): the same kernels, so the
    #: same bits, without a launch per kernel. How a run executes, not what it computes (not in its identity).
    cuda_graph: bool = False
    #: draw the training batches on ``device`` with generators there (device cuda; a task that can: ``Task.
    #: draws_on_device``): no host work or copy per step, but a CUDA generator's streams, so other batches than
    #: the host's (equally distributed, as repeatable from the seed). What a run computes: part of its identity.
    #: The probe batch stays drawn on the host. False: the host draws, the same batches on every device.
    draw_on_device: bool = False

    @model_serializer(mode="wrap")
    def _without_defaults_added_later(self, handler):
        """``cuda_graph`` and ``draw_on_device`` are written only when true: a run's config.json (and what a
        reproduction records of its configs, and its identity) is the one it was before the keys existed."""
        out = handler(self)
        if isinstance(out, dict):
            for key in ("cuda_graph", "draw_on_device"):
                if out.get(key) is False:
                    out.pop(key)
        return out

    @model_validator(mode="before")
    @classmethod
    def _lrs_short_form(cls, data: Any) -> Any:
        return expand_lrs(data)

    @model_validator(mode="after")
    def _typed_sections(self):
        spec = get_task(self.task)
        # Re-validate data/model with the task's classes; keep the full resolved dicts.
        object.__setattr__(self, "data", _sub(spec.data_config, self.data, "data").model_dump(mode="json"))
        object.__setattr__(self, "model", _sub(spec.model_config, self.model, "model").model_dump(mode="json"))
        if self.cuda_graph and self.device != "cuda":
            raise ConfigError(f"cuda_graph = true needs device = 'cuda'; got {self.device!r}")
        if self.draw_on_device and self.device != "cuda":
            raise ConfigError(f"draw_on_device = true needs device = 'cuda' (on the CPU every batch is drawn there "
                              f"already); got {self.device!r}")
        if self.autocast is not None and self.dtype != "float32":
            raise ConfigError(f"autocast = {self.autocast!r} needs dtype = 'float32' (the master copy); got {self.dtype!r}")
        groups = set(self.optim.groups)
        for lrs in self.ensemble.lrs:
            bad = set(lrs) - groups
            if bad:
                raise ConfigError(f"ensemble.lrs: unknown group {sorted(bad)[0]!r}; allowed: {', '.join(sorted(groups))}")
        return self

    def typed_data(self):
        return get_task(self.task).data_config.model_validate(self.data)

    def typed_model(self):
        return get_task(self.task).model_config.model_validate(self.model)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def expand_lrs(raw: Any) -> Any:
    """The short form of ``ensemble.lrs`` written out: a bare number in the list is one rate for every group
    of ``optim.groups`` (``[0.001, 0.01]`` → ``[{Y: 0.001, Z: 0.001}, {Y: 0.01, Z: 0.01}]``), so the
    validated config, a run's identity and its ``config.json`` are those of the long form. ``raw`` is
    returned as it is where it has no such number (or no groups to expand over: validation names what
    is missing)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("ensemble"), dict):
        return raw
    lrs = raw["ensemble"].get("lrs")
    groups = (raw.get("optim") or {}).get("groups") if isinstance(raw.get("optim"), dict) else None
    if not isinstance(lrs, list) or not any(_number(x) for x in lrs) or not isinstance(groups, dict) or not groups:
        return raw
    lrs = [{g: x for g in groups} if _number(x) else x for x in lrs]
    return raw | {"ensemble": raw["ensemble"] | {"lrs": lrs}}


def _sub(cls: type[BaseModel], value: dict, prefix: str) -> BaseModel:
    try:
        return cls.model_validate(value)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, cls, prefix)) from None


# ---------------------------------------------------------------- loading and overrides


#: The most values (mappings, lists and scalars, each alias counted every time it is used) a config
#: file may hold once loaded: YAML aliases can make a file of a few hundred bytes stand for 10⁹ values
#: ("billion laughs"), which copying or validating the document would then expand.
MAX_CONFIG_VALUES = 1_000_000
#: The most characters of text (strings and keys, each alias counted every time it is used) a config file may
#: hold once loaded: a few aliases of one long string stand for gigabytes under the value limit.
MAX_CONFIG_CHARS = 10_000_000


def document_size(data: Any, limit: int = MAX_CONFIG_VALUES, char_limit: int = MAX_CONFIG_CHARS) -> tuple[int, int]:
    """(values, characters of text) ``data`` holds when its shared (aliased) parts are counted each time they
    are reached; stops counting past either limit (so a recursive alias ends too)."""
    n, chars, stack = 0, 0, [data]
    while stack and n <= limit and chars <= char_limit:
        x = stack.pop()
        n += 1
        if isinstance(x, str):
            chars += len(x)
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return n, chars


class _Loader(yaml.SafeLoader):
    """YAML as a config reads it: a key twice in one mapping is an error (YAML itself keeps the last), and so
    is a value JSON cannot hold (a date, binary, a set), which no config field takes."""

    def construct_mapping(self, node, deep=False):
        seen: list = []
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key != "<<" and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"found the key {key!r} twice", key_node.start_mark)
            seen.append(key)
        return super().construct_mapping(node, deep)


def _not_json(loader: yaml.SafeLoader, node: yaml.Node):
    raise yaml.constructor.ConstructorError(None, None, f"a {node.tag.rsplit(':', 1)[-1]} value is not a config value "
                                            f"(quote it for a string)", node.start_mark)


for _tag in ("timestamp", "binary", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _not_json)


def _json_object(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if dup is not None:
        raise ValueError(f"the key {dup!r} twice in one object")
    return dict(pairs)


def read_config_file(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} is not a file")
    kind = "JSON" if p.suffix == ".json" else "YAML"
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_json_object) if kind == "JSON" else yaml.load(text, Loader=_Loader)
    except (ValueError, yaml.YAMLError, RecursionError) as e:
        raise ConfigError(f"config file {str(p)!r} is not valid {kind}: {str(e).splitlines()[0] if str(e) else 'nested too deeply'}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at top level")
    values, chars = document_size(data)
    if values > MAX_CONFIG_VALUES or chars > MAX_CONFIG_CHARS:
        what = f"{MAX_CONFIG_VALUES:,} values" if values > MAX_CONFIG_VALUES else f"{MAX_CONFIG_CHARS:,} characters of text"
        raise ConfigError(f"config file {str(p)!r} expands to more than {what} "
                          f"(YAML aliases used over and over?); a config is far smaller")
    return data


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _section_class(raw: dict, head: str) -> type[BaseModel] | None:
    if head in ("data", "model") and isinstance(raw.get("task"), str):
        if raw["task"] in TASKS:
            spec = TASKS.get(raw["task"])
            return spec.data_config if head == "data" else spec.model_config
    return None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``key.path=value`` overrides to a raw config dict.

    Values are parsed as YAML scalars and converted by pydantic to the field's type; for list fields,
    ``a,b,c`` becomes a list. A key given twice, or a key and a section holding it (``optim.groups`` and
    ``optim.groups.Y.lr``), is a :class:`ConfigError` naming the key: which value was meant would depend on
    the order (nothing ambiguous is accepted).
    """
    check_unique_overrides(overrides)
    raw = json.loads(json.dumps(raw))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        key, text = item.split("=", 1)
        path = tuple(key.strip().split("."))
        if not all(path):
            raise ConfigError(f"override {item!r}: empty key segment")
        sub_cls = _section_class(raw, path[0])
        ann = _resolve(sub_cls, path[1:]) if sub_cls is not None else _resolve(RunConfig, path)
        if typing.get_origin(ann) in (list, tuple) and not text.strip().startswith("["):
            value: Any = [_parse_scalar(t) for t in text.split(",")] if text.strip() else []
        else:
            value = _parse_scalar(text)
        node = raw
        for p in path[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
            node = nxt
        node[path[-1]] = value
    return raw


def override_key(item: str) -> str:
    return item.split("=", 1)[0].strip()


def check_unique_overrides(overrides: list[str]) -> None:
    """Each key is overridden once: a key given twice (``--set lr=1 --set lr=2``), or a key inside a section
    also given (``--set optim.groups={...} --set optim.groups.Y.lr=2``), is one line naming it, whatever the
    values (the same value twice too: a repeated key is a slip, e.g. a line copied in a script)."""
    seen: dict[tuple[str, ...], str] = {}
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            continue                     # apply_overrides names it
        path = tuple(p.strip() for p in override_key(item).split("."))
        for other, first in seen.items():
            if other == path:
                raise ConfigError(f"override {'.'.join(path)!r} is given twice ({first!r}, then {item!r}): give each "
                                  f"key once")
            if other[:len(path)] == path or path[:len(other)] == other:
                outer, inner = (first, item) if len(other) < len(path) else (item, first)
                raise ConfigError(f"overrides {first!r} and {item!r} overlap ({override_key(outer)!r} holds "
                                  f"{override_key(inner)!r}): which wins would depend on their order; give one")
        seen[path] = item


def check_shadowed(raw: dict, overrides: list[str]) -> None:
    """An override that the config's own settings would shadow is an error, never silently dropped:
    ``optim.groups.G.lr`` while ``ensemble.lrs`` gives every member its own rate for G (and
    ``optim.groups.G.lr`` is then unused). ``raw`` is the config after the overrides."""
    lrs = (expand_lrs(raw).get("ensemble") or {}).get("lrs") or []
    for item in overrides:
        parts = override_key(item).split(".")
        if len(parts) == 4 and parts[0] == "optim" and parts[1] == "groups" and parts[3] == "lr":
            g = parts[2]
            per_member = [m[g] for m in lrs if isinstance(m, dict) and g in m]
            if per_member:
                example = json.dumps([m | {g: "…"} if g in m else m for m in lrs], ensure_ascii=False)
                raise ConfigError(
                    f"override {item!r} is shadowed by ensemble.lrs, which gives each member its own {g} rate "
                    f"({', '.join(f'{v:g}' for v in per_member)}); set the members' rates instead: "
                    f"--set 'ensemble.lrs={example}'".replace('"', ""))


def validate_config(raw: dict) -> RunConfig:
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, RunConfig)) from None


#: How a config source that is neither a dict nor a file is resolved by name (``tdyn run scan-snap/fig4``,
#: a sweep's ``base: scan-snap/fig4``). The experiments layer owns the names, so the layer above both
#: (the CLI) installs it with :func:`set_name_resolver`; config never imports experiments.
_name_resolver: Callable[[str, str], dict] | None = None


def set_name_resolver(fn: Callable[[str, str], dict] | None) -> None:
    """Install ``fn(name, what) -> run config dict`` for sources given by name (None removes it)."""
    global _name_resolver
    _name_resolver = fn


#: The run configs and sweep specs shipped inside the package, so that they work outside a clone:
#: ``tdyn run syn_small`` is ``configs/syn_small.yaml``, ``tdyn sweep syn_small_lr`` is
#: ``configs/sweeps/syn_small_lr.yaml`` (both under ``src/tdyn/``).
PACKAGED = Path(__file__).resolve().parent / "configs"


def packaged(kind: Literal["run", "sweep"] = "run") -> dict[str, Path]:
    """The packaged run configs (``kind="run"``) or sweep specs (``"sweep"``): name -> file."""
    folder = PACKAGED / "sweeps" if kind == "sweep" else PACKAGED
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def is_file_source(source: str | Path) -> bool:
    """Whether a source names a file (a config or spec suffix, or an existing path) rather than a name."""
    return Path(source).suffix in (".yaml", ".yml", ".json") or Path(source).exists()


def read_source(source: str | Path | dict, *, what: str = "config") -> dict:
    """The one config-source resolver (``tdyn run SOURCE``, a sweep's ``base``): a dict as is, a
    YAML/JSON file, a packaged config by name (:func:`packaged`), or a name resolved by the installed
    name resolver (the CLI's: an experiment's default run config)."""
    if isinstance(source, dict):
        return source
    if is_file_source(source):
        return read_config_file(source)
    shipped = packaged()
    if str(source) in shipped:
        return read_config_file(shipped[str(source)])
    if _name_resolver is None:
        raise ConfigError(f"{what}: {str(source)!r} is neither a config file nor a packaged config "
                          f"({', '.join(shipped)})")
    return _name_resolver(str(source), what)


#: tdyn's optional extras: extra → (the module it provides, the PyPI package that installs it). tdyn itself is
#: not on PyPI, so a hint names the package (``pip install tensorboard``), and the extra for a clone.
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "ray": ("ray", "ray"),
          "slurm": ("submitit", "submitit")}


def install_hint(extra: str) -> str:
    """How to install an optional extra: its PyPI package, or the extra from a clone of tdyn."""
    return f"pip install {EXTRAS[extra][1]} (in a clone of tdyn: pip install '.[{extra}]')"


def installed(extra: str) -> bool:
    """Whether an optional extra's module can be imported here (found, not imported: cheap)."""
    import importlib.util

    return importlib.util.find_spec(EXTRAS[extra][0]) is not None


def check_extras(cfg: RunConfig) -> None:
    """The optional packages a config's ``log`` section needs, checked before anything is written or trained
    (by the trainer as it builds a job: ``tdyn run``, ``tdyn.train``, a reproduction's jobs; by a sweep for every
    job before its first starts): a missing one is a
    one-line ConfigError naming the key and the install command. Not part of validation itself, so that a run
    trained with ``log.tensorboard: true`` can be read back where TensorBoard is not installed."""
    for on, extra in ((cfg.log.tensorboard, "tensorboard"), (cfg.log.wandb, "wandb")):
        if on and not installed(extra):
            raise ConfigError(f"log.{extra}: true needs the {EXTRAS[extra][1]} package, which is not installed "
                              f"here: {install_hint(extra)}; or set log.{extra}: false")


def load_config(source: str | Path | dict, overrides: list[str] | None = None) -> RunConfig:
    """Load from a dict, a YAML/JSON file, or a registered experiment's default config."""
    raw = apply_overrides(read_source(source), overrides or [])
    check_shadowed(raw, overrides or [])
    return validate_config(raw)
