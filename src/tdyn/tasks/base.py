"""The contract between an experiment and the trainer.

A *task* wires one distribution and one model (a model never imports a distribution; a task module
in ``tdyn.tasks`` does the wiring). It is built from a resolved :class:`tdyn.config.RunConfig` and the list of ensemble
members, and exposes:

* ``model``: an ``nn.Module`` whose parameters all carry a leading ensemble axis of size S;
* ``sample(gen)``: one data stream's batch drawn with ``gen`` (members that share a seed share a
  stream), or ``None`` when the loss is an exact population loss;
* ``sample_streams(gens)``: the batches of several streams stacked on a leading axis (default: each
  ``sample(g)``, stacked by :func:`stack_batches`; a task overrides it to draw them in one pass);
* ``loss(batch)``: the per-member training loss, shape [S], where ``batch`` is the per-stream batches
  stacked on a leading axis of size S (``None`` for population losses);
* ``probe_batch(gen)``: a fixed batch the probes evaluate on (default: one ``sample``);
* ``facts``: the distribution's facts the probes need (e.g. P(l|n), the distinct-token sets);
* ``member_generators()``: any further random streams (e.g. dropout), one generator per member,
  which the trainer checkpoints and restores so that resume is exact;
* ``draws_on_device``: whether ``sample_streams`` draws on its generators' device when given generators
  there (config ``draw_on_device``; default False: batches are drawn on the host and copied);
* ``grad_rows``: optionally, per parameter, the rows (its axis 1, after the ensemble axis) outside which
  its gradient is always zero (Scan and Snap's Z: the query tokens' rows; Y: the context tokens'). The optimizer then updates
  only those rows where that is exact (no weight decay: a zero gradient with zero optimizer state
  leaves a row unchanged), the same arithmetic per element as updating every row.

**Plain modules.** A model written the usual way, for one member (no ensemble axis, any ``nn.Module``:
``nn.Linear``, ``nn.LayerNorm``, dropout, buffers), trains as an ensemble through :class:`PlainTask`: the
task implements ``make_model()`` (one member's module), ``sample(gen)`` and ``member_loss(model, batch)``
(one member's scalar loss on its own batch, no leading S), and the base builds ``self.model`` as a
:class:`tdyn.models.stacked.Stacked` of the S members and gives ``loss(batch)`` -> [S] by running
``member_loss`` per member under ``torch.func.vmap`` (or member by member when the forward draws random
numbers; see ``Stacked``). Parameter names are the plain module's with ``.`` replaced by ``__``
(``lin.weight`` -> ``lin__weight``): ``optim.groups``, ``optim.freeze``, checkpoints and metrics use them.
Member i then equals the plain module trained alone: built after ``torch.manual_seed(derive_seed(seed,
"init"))`` (every parameter times the member's init scale), its forward drawing from torch's global RNG
seeded with ``derive_seed(seed, "forward")`` (the checkpointed member generator ``"forward"``).
The hand-written ensemble axis (a ``Task`` whose model carries S itself) stays the way of the shipped
models where it is faster (``tdyn bench``: ``*_handwritten`` vs ``*_vmap``).

Tasks are registered by name with the pydantic classes of their ``data`` and ``model`` config
sections, so that configs are validated before anything runs. The built-in tasks are listed in the
table of ``tdyn.tasks`` (name -> module), imported only when looked up.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from pydantic import BaseModel
from torch import nn

from tdyn import plugins
from tdyn.errors import UserCodeError, UserError, check_arg
from tdyn.models.stacked import Randomness, Stacked
from tdyn.registry import Registry, origin_of
from tdyn.seeding import generator, global_rng


@dataclasses.dataclass(frozen=True)
class Member:
    """One ensemble member: a seed, its learning rates per parameter group, and an init scale; ``name``: its
    run directory's name in an ensemble (:func:`tdyn.runs.run_name`, ``optim.groups.Y.lr=0.001__seed=0``)."""

    seed: int
    lrs: dict[str, float]
    init_scale: float = 1.0
    name: str = ""


class Task:
    """Base class; subclasses set ``self.model`` and implement ``sample`` and ``loss``."""

    model: torch.nn.Module
    facts: dict[str, Any] = {}
    grad_rows: dict[str, torch.Tensor] = {}
    draws_on_device: bool = False

    def sample(self, gen: torch.Generator) -> Any:
        raise NotImplementedError

    def sample_streams(self, gens: list[torch.Generator]) -> Any:
        """``sample(g)`` of every generator, stacked on a new leading axis; an override must give the same
        (the trainer calls this once per step with its streams' generators)."""
        return stack_batches([self.sample(g) for g in gens])

    def loss(self, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def probe_batch(self, gen: torch.Generator) -> Any:
        return self.sample(gen)

    def member_generators(self) -> dict[str, list[torch.Generator]]:
        return {}


def stack_batches(batches: list[Any], join: Callable[[list[torch.Tensor]], torch.Tensor] = torch.stack) -> Any:
    """Batches (tensors in dicts, lists and tuples, or ``None``) stacked on a new leading axis (``join=torch.cat``:
    batches that already have one, joined on it)."""
    first = batches[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        return join(batches)
    if isinstance(first, dict):
        return {k: stack_batches([b[k] for b in batches], join) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(stack_batches([b[i] for b in batches], join) for i in range(len(first)))
    raise TypeError(f"cannot stack batch of type {type(first).__name__}")


def tree_map(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """``fn`` applied to every tensor of a batch (nested dicts, lists and tuples); anything else kept."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(tree_map(fn, v) for v in batch)
    return batch


def leaves(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch, in :func:`tree_map`'s order."""
    out: list[torch.Tensor] = []
    tree_map(out.append, batch)
    return out


def _what(value: Any) -> str:
    """``None`` or ``a list``: what a user's function returned instead."""
    if value is None:
        return "None"
    return f"the class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"


class PlainTask(Task):
    """A task whose model is written for one member (see the module docstring).

    Subclasses set up their data, then call ``super().__init__(cfg, members)``, which builds member
    i's module with ``make_model()`` under torch's global RNG seeded from member i's ``init`` stream,
    multiplies its parameters by the member's init scale (``scale_init``), and stacks the S modules
    into ``self.model`` (a ``Stacked``). ``randomness`` (class attribute) is ``Stacked``'s: "auto"
    (vmap unless an active dropout layer is present), "vmap" or "loop".
    """

    randomness: Randomness = "auto"
    model: Stacked

    def __init__(self, cfg, members: list[Member]):
        modules = []
        for m in members:
            with global_rng(generator(m.seed, "init")):
                module = self.make_model()
            if not isinstance(module, nn.Module):
                raise UserCodeError(f"{self._where('make_model')} returned {_what(module)}, not a torch.nn.Module "
                                    "(one member's model): an error in your task's code")
            self.scale_init(module, m.init_scale)
            modules.append(module)
        gens = [generator(m.seed, "forward", cfg.device) for m in members]
        self.model = Stacked(modules, gens, self.randomness)

    def make_model(self) -> nn.Module:
        """One member's module, initialised from torch's global RNG (as ``nn.Linear`` does)."""
        raise NotImplementedError

    def member_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """One member's scalar loss: ``model`` is the plain module holding that member's parameters,
        ``batch`` that member's batch (``sample``'s output, no ensemble axis)."""
        raise NotImplementedError

    @staticmethod
    @torch.no_grad()
    def scale_init(model: nn.Module, scale: float) -> None:
        """Multiply every parameter by ``scale`` (override to scale only some)."""
        if scale != 1.0:
            for p in model.parameters():
                p.mul_(scale)

    def loss(self, batch: Any) -> torch.Tensor:
        """[S]: ``member_loss`` of every member on its slice of ``batch`` (leading axis S)."""
        return self.model.map(self._member_loss, batch)

    def _member_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """``member_loss``, held to its contract: one scalar tensor (a member's shape under vmap)."""
        out = self.member_loss(model, batch)
        if not isinstance(out, torch.Tensor) or out.dim() != 0:
            shape = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else _what(out)
            raise UserCodeError(f"{self._where('member_loss')} returned {shape}, not a scalar tensor (one member's "
                                "loss; reduce it, e.g. with .mean()): an error in your task's code")
        return out

    def _where(self, method: str) -> str:
        """``MyTask.method (file, line N)``: the user's method that broke the contract."""
        fn = getattr(type(self), method, None)
        code = getattr(fn, "__code__", None)
        at = f" ({code.co_filename}, line {code.co_firstlineno})" if code is not None else ""
        return f"{type(self).__qualname__}.{method}{at}"

    def member_generators(self) -> dict[str, list[torch.Generator]]:
        return {"forward": self.model.gens}


@dataclasses.dataclass
class TaskSpec:
    name: str
    data_config: type[BaseModel]
    model_config: type[BaseModel]
    build: Callable[..., Task]  # build(cfg: RunConfig, members: list[Member]) -> Task
    description: str = ""
    #: size(cfg) -> the number of values in one member's parameters and buffers, estimated from the
    #: config alone (nothing built), so that a model too large for memory is refused before allocation
    size: Callable[..., int] | None = None


#: Every task, by name; the table of built-in task modules is filled in by ``tdyn.tasks``.
TASKS: Registry[TaskSpec] = Registry("task", label="task", hint=plugins.HINT, papers="tasks")


def register_task(name: str, data_config: type[BaseModel], model_config: type[BaseModel],
                  description: str = "", size: Callable[..., int] | None = None):
    """Decorator: ``@register_task("my_task", DataCfg, ModelCfg, "one line for tdyn list")`` on
    ``build(cfg, members)`` (or on a Task class); ``size``: see :attr:`TaskSpec.size` (without it, no memory
    check before building). Registering the same name again from the same code (a notebook cell run again)
    replaces it with a one-line notice; a name another module registered, or a built-in one, is refused."""

    for arg, cls in (("data_config", data_config), ("model_config", model_config)):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise UserError(f"register_task({name!r}): argument {arg!r} is {_what(cls)}, not a pydantic model class "
                            "(e.g. a subclass of tdyn.schema.Strict)")
    check_arg(f"register_task({name!r})", "description", description, str)
    if size is not None and not callable(size):
        raise UserError(f"register_task({name!r}): argument 'size' is {_what(size)}, not a function of the config")

    def deco(build):
        if not callable(build):
            raise UserError(f"@register_task({name!r}) decorates {_what(build)}, not a function or Task class")
        TASKS.register(name, TaskSpec(name, data_config, model_config, build, description, size),
                       origin=origin_of(build), description=description)
        return build

    return deco
