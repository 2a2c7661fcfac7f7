"""Any plain ``nn.Module`` as an ensemble: S members' parameters and buffers stacked on a leading axis.

``Stacked(modules, gens)`` takes S modules of one architecture, written the usual way for one member
(no ensemble axis) and already initialised, and holds their parameters and buffers stacked, each
[S, *shape], as its own parameters and buffers. **Names**: the plain module's names with every
``.`` replaced by ``__`` (``net.0.weight`` → ``net__0__weight``; ``nn.Module`` forbids dots in a
parameter's own name). These are the names ``optim.groups.*.params``, ``optim.freeze``, checkpoints
(``param/net__0__weight``, ``buffer/...``) and metrics (``norm/net__0__weight``) use.

``stacked.map(fn, *args)`` evaluates ``fn(module_i, *args_i)`` for every member i — module_i is the
plain module holding member i's parameters and buffers, args_i takes slice i of every tensor in
``args`` (pytrees of tensors with leading axis S; anything else is passed whole) — and returns the
outputs stacked on a leading axis S (a scalar loss per member gives [S]). Gradients flow to the
stacked parameters, so one ``backward`` of ``map(...).sum()`` trains all members. Two ways, the same
numbers to float tolerance:

* ``vmap``: ``torch.func.vmap`` of ``torch.func.functional_call`` over the members, one tensor program;
* ``loop``: member by member (``functional_call`` on slice i), member i inside
  :func:`tdyn.seeding.global_rng` with its own generator ``gens[i]``.

**Randomness** (why two ways). Under vmap a random op (dropout) either draws the same numbers for
every member or one batched draw from the global RNG (``randomness="different"``), where member i's
mask depends on S and on the other members: no member would then equal the same module trained
alone. So a forward that draws random numbers runs the loop: member i's dropout draws from
``gens[i]``, through torch's global RNG, exactly the numbers that the plain module trained alone
draws after ``torch.manual_seed(seed of gens[i])`` — the same with S = 1, and with any S. The
generators are the task's ``member_generators()`` (checkpointed, so resume stays exact).
``randomness="auto"`` runs the loop while an active dropout layer (an ``nn.Dropout*`` or
``nn.MultiheadAttention`` with p > 0, in training mode) is present and vmap otherwise; vmap runs with
``randomness="error"``, so a random op it did not foresee (say ``F.dropout`` called in ``forward``)
stops with an error naming ``randomness="loop"`` instead of silently breaking the equality.

**Buffers** are per member like parameters. In-place updates in ``forward`` (``buf.mul_(..)``, as
``nn.BatchNorm``'s running statistics) land in the stacked buffers under both ways; rebinding a buffer
(``self.buf = ...``) does not (``functional_call`` restores the attributes). Every tensor the module
holds must be a parameter or a buffer: the template that ``map`` calls lives on the meta device.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Literal

import torch
from torch import nn
from torch.utils import _pytree as pytree

from tdyn.errors import UserError
from tdyn.models import activations
from tdyn.seeding import global_rng

Randomness = Literal["auto", "vmap", "loop"]


class _Apply(nn.Module):
    """``forward(fn, *args) = fn(self.m, *args)``: lets ``functional_call`` run any function of the module."""

    def __init__(self, m: nn.Module):
        super().__init__()
        self.m = m

    def forward(self, fn, *args):
        return fn(self.m, *args)


def _is_random(m: nn.Module) -> bool:
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return m.p > 0
    return isinstance(m, nn.MultiheadAttention) and m.dropout > 0


def stacked_name(name: str) -> str:
    """The ensemble parameter / buffer name of the plain module's ``name`` (``a.b`` → ``a__b``)."""
    return name.replace(".", "__")


class Stacked(nn.Module):
    """S plain modules as one ensemble; see the module docstring.

    ``modules``: S modules of one architecture (same names and shapes); ``gens``: one generator per
    member for the randomness of ``forward`` (needed by the loop); ``randomness``: "auto", "vmap" or
    "loop".
    """

    def __init__(self, modules: list[nn.Module], gens: list[torch.Generator] | None = None,
                 randomness: Randomness = "auto"):
        super().__init__()
        if not modules:
            raise ValueError("Stacked needs at least one module")
        if gens is not None and len(gens) != len(modules):
            raise ValueError(f"{len(modules)} modules but {len(gens)} generators")
        if randomness not in ("auto", "vmap", "loop"):
            raise ValueError(f"randomness = {randomness!r}: allowed: auto, vmap, loop")
        self.S = len(modules)
        self.gens = gens
        self.randomness = randomness
        params, buffers = torch.func.stack_module_state(modules)   # [S, ...] each (params: new leaves)
        first = modules[0]
        non_persistent = {f"{n}.{b}" if n else b for n, mod in first.named_modules()
                          for b in mod._non_persistent_buffers_set}
        self._plain: dict[str, str] = {}   # stacked name -> plain name
        for kind, tensors in (("parameter", params), ("buffer", buffers)):
            for name, t in tensors.items():
                sname = stacked_name(name)
                if sname in self._plain:
                    raise ValueError(f"{kind} names {self._plain[sname]!r} and {name!r} both become {sname!r}")
                self._plain[sname] = name
                if kind == "parameter":
                    self.register_parameter(sname, nn.Parameter(t.detach()))
                else:
                    self.register_buffer(sname, t, persistent=name not in non_persistent)
        # not a submodule: its (meta) tensors stay out of parameters(), buffers() and .to()
        object.__setattr__(self, "_apply_template", _Apply(copy.deepcopy(first).to("meta")))
        self.train(first.training)

    # ---- the state a member's module holds

    def _state(self) -> dict[str, torch.Tensor]:
        """{"m." + plain name: stacked tensor [S, ...]} for ``functional_call`` on the template."""
        own = dict(self.named_parameters()) | dict(self.named_buffers())
        return {"m." + plain: own[s] for s, plain in self._plain.items()}

    def train(self, mode: bool = True):
        super().train(mode)
        if "_apply_template" in self.__dict__:
            self._apply_template.train(mode)
        return self

    def uses_loop(self) -> bool:
        """Whether ``map`` runs member by member now (see the module docstring)."""
        if self.randomness != "auto":
            return self.randomness == "loop"
        return self.training and any(_is_random(m) for m in self._apply_template.modules())

    # ---- evaluation

    def map(self, fn: Callable[..., Any], *args) -> Any:
        """``fn(module_i, *args_i)`` for every member i, stacked on a leading axis S (see above). Under
        :func:`tdyn.models.activations.capture` of this ensemble, the plain module's named activations are
        returned by each member's call and stacked [S, ...] into the capture's cache."""
        cache = activations.recording(self)
        if cache is None:
            return self._map(fn, args)
        out, recorded = self._map(activations.member_fn(cache, self._apply_template.m, fn), args)
        cache.update(recorded)
        return out

    def activation_names(self) -> dict[str, str]:
        """The plain module's named activations (its class attribute ``ACTIVATIONS``; docs/activations.md)."""
        return activations.available(self._apply_template.m)

    def _map(self, fn: Callable[..., Any], args: tuple) -> Any:
        state = self._state()
        if self.uses_loop():
            if self.gens is None:
                raise RuntimeError("Stacked: the loop needs one generator per member (gens)")
            outs = []
            for i, g in enumerate(self.gens):
                args_i = pytree.tree_map(lambda t: t[i] if isinstance(t, torch.Tensor) else t, args)
                with global_rng(g):
                    outs.append(torch.func.functional_call(self._apply_template, {k: v[i] for k, v in state.items()},
                                                           (fn, *args_i)))
            return pytree.tree_map(lambda *xs: torch.stack(xs), *outs)
        in_dims = pytree.tree_map(lambda t: 0 if isinstance(t, torch.Tensor) else None, args)

        def one(st, *a):
            return torch.func.functional_call(self._apply_template, st, (fn, *a))

        try:
            return torch.func.vmap(one, in_dims=(0, *in_dims), randomness="error")(state, *args)
        except RuntimeError as e:
            if "randomness" in str(e):
                raise RuntimeError("Stacked: the module draws random numbers in forward that vmap cannot give each "
                                   "member as it would draw alone; use randomness=\"loop\" (a PlainTask: "
                                   f"class attribute randomness = \"loop\"). vmap said: {e}") from None
            if "Batching rule not implemented" in str(e):
                op = str(e).split("Batching rule not implemented for ", 1)[1].split(".", 1)[0].split(";")[0]
                raise UserError(f"the module uses {op}, which torch.func.vmap cannot run for all members at once; "
                                f"train it member by member: randomness=\"loop\" (a PlainTask: class attribute "
                                f"randomness = \"loop\")") from None
            raise

    def forward(self, *args, **kwargs):
        """The plain module's ``forward`` for every member: ``map(lambda m, *a: m(*a), *args)``."""
        return self.map(lambda m, *a: m(*a, **kwargs), *args)

    # ---- one member back as a plain module

    def member(self, i: int) -> nn.Module:
        """A plain module (a new one) holding member ``i``'s parameters and buffers."""
        m = copy.deepcopy(self._apply_template.m)
        state = self._state()
        device = next(iter(state.values())).device if state else torch.device("cpu")
        m.to_empty(device=device)
        with torch.no_grad():
            for k, v in state.items():
                name = k[2:]
                t = m.get_parameter(name) if name in dict(m.named_parameters()) else m.get_buffer(name)
                t.copy_(v[i])
        return m.train(self.training)

    def extra_repr(self) -> str:
        return f"S={self.S}, randomness={self.randomness!r}, module={type(self._apply_template.m).__name__}"
