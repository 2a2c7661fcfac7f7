"""Ensemble-aware optimizers: SGD (momentum, weight decay), Adam, AdamW.

Every parameter carries a leading ensemble axis S; learning rates are per member (shape [S]), so
members that differ only in learning rate train in one tensor program. The update rules follow
``torch.optim`` exactly (Adam: bias-corrected moments, eps added after the square root; AdamW:
decoupled decay ``p *= 1 - lr*wd``), so a member with S = 1 matches its torch counterpart.
State is a flat ``dict[str, Tensor]`` (momentum buffers, moments, step counts) so that checkpoints
are plain safetensors.
"""

from __future__ import annotations

import fnmatch

import torch

from tdyn.config import GroupConfig
from tdyn.train import schedules
from tdyn.errors import ConfigError


def _pattern(entry: str) -> bool:
    return any(c in entry for c in "*?[")


def assign_groups(names: list[str], groups: dict[str, GroupConfig]) -> dict[str, str]:
    """Each parameter's group: ``params`` entries are names or glob patterns (``fnmatch``: ``lin__*``,
    ``*bias``). A name given exactly belongs to its group; a pattern takes the parameters no group names
    exactly; ``"*"`` alone is the default group, taking what no other entry takes. A parameter named by two
    groups, or matched by the patterns of two (``"*"`` aside), is a ConfigError; so is an entry that matches
    nothing. Parameters no group takes are left out (the trainer names the first)."""
    out: dict[str, str] = {}
    for g, gc in groups.items():
        for p in gc.params:
            if _pattern(p):
                continue
            if p not in names:
                raise ConfigError(f"optim.groups.{g}.params: unknown parameter {p!r}; allowed: {', '.join(names)}")
            if p in out:
                raise ConfigError(f"optim.groups.{g}.params: parameter {p!r} is already in group {out[p]!r}")
            out[p] = g
    default = [g for g, gc in groups.items() if "*" in gc.params]
    if len(default) > 1:
        raise ConfigError(f"optim.groups: {default[0]!r} and {default[1]!r} both list '*' (the default group): "
                          f"keep one")
    for star in (False, True):     # the patterns, then the default group
        for g, gc in groups.items():
            for pat in gc.params:
                if not _pattern(pat) or (pat == "*") != star:
                    continue
                hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
                if not hits:
                    raise ConfigError(f"optim.groups.{g}.params: pattern {pat!r} matches no parameter; "
                                      f"parameters: {', '.join(names)}")
                for n in hits:
                    owner = out.get(n)
                    if owner is None:
                        out[n] = g
                    elif owner != g and not star and n not in {p for p in groups[owner].params if not _pattern(p)}:
                        raise ConfigError(f"optim.groups.{g}.params: pattern {pat!r} matches {n!r}, which a pattern "
                                          f"of group {owner!r} matches too: name it in one group")
    return {n: out[n] for n in names if n in out}


class EnsembleOptimizer:
    def __init__(self, params: dict[str, torch.nn.Parameter], groups: dict[str, GroupConfig],
                 lrs: dict[str, torch.Tensor], grad_rows: dict[str, torch.Tensor] | None = None, steps: int = 0):
        """``groups`` maps a group name to its config; ``lrs[group]`` holds one lr per member;
        ``grad_rows[name]`` (optional) the rows of a parameter (axis 1) outside which its gradient is
        always zero (``Task.grad_rows``): where the group has no weight decay, only those rows are
        updated (a row with zero gradient and zero state would not move; the arithmetic per element
        is the same, so the result is bit-identical to updating every row). Rows that form one
        contiguous range are updated in place through a view; other row sets are gathered and written
        back, where they are at most half the rows (else updating every row is cheaper). A group with a
        ``schedule`` updates at lr · f(t) (:mod:`tdyn.train.schedules`; ``steps``: the run's, the default
        horizon), t set by :meth:`set_step` before each step."""
        self.params = params
        self.groups = groups
        self.group_of = assign_groups(list(params), groups)
        self.lrs = lrs
        self._lr_as: dict[tuple, tuple[torch.Tensor, int, torch.Tensor]] = {}
        # scheduled groups: the factor of the current step, and the rates lr · factor per (group, dtype, device),
        # updated in place by set_step (a CUDA graph of the update reads them from the same memory)
        self.steps = steps
        self.factors = {g: schedules.factor(gc.schedule, 0, steps) for g, gc in groups.items() if gc.schedule}
        self._scheduled: dict[tuple, torch.Tensor] = {}
        self.rows: dict[str, torch.Tensor | slice] = {}
        for name, rows in (grad_rows or {}).items():
            p = params.get(name)
            gc = groups[self.group_of[name]] if name in self.group_of else None
            if p is None or gc is None or p.dim() < 2 or gc.weight_decay or len(rows) == 0:
                continue
            rows = torch.unique(rows.to(torch.long).cpu())
            if int(rows[0]) < 0 or int(rows[-1]) >= p.shape[1]:
                raise ValueError(f"grad_rows[{name!r}]: rows must lie in [0, {p.shape[1]}), "
                                 f"got {int(rows[0])}..{int(rows[-1])}")
            if int(rows[-1]) - int(rows[0]) + 1 == len(rows):       # one range: a view, no copies
                if len(rows) < p.shape[1]:
                    self.rows[name] = slice(int(rows[0]), int(rows[-1]) + 1)
            elif 2 * len(rows) <= p.shape[1]:
                self.rows[name] = rows.to(p.device)
        self.state: dict[str, torch.Tensor] = {}
        self.scratch: dict[str, torch.Tensor] = {}
        for name, gname in self.group_of.items():
            p = params[name]
            gc = groups[gname]
            if gc.optimizer == "sgd":
                if gc.momentum > 0:
                    self.state[f"momentum/{name}"] = torch.zeros_like(p)
            else:
                self.state[f"exp_avg/{name}"] = torch.zeros_like(p)
                self.state[f"exp_avg_sq/{name}"] = torch.zeros_like(p)
                self.state[f"step/{name}"] = torch.zeros(p.shape[0], dtype=torch.float64)

    def _scratch(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """One preallocated buffer per parameter for the update's temporaries (``out=`` and in-place
        ops): a step allocates nothing of a parameter's size. Not optimizer state (never saved)."""
        tmp = self.scratch.get(name)
        if tmp is None or tmp.shape != p.shape or tmp.dtype != p.dtype or tmp.device != p.device:
            tmp = self.scratch[name] = torch.empty_like(p)
        return tmp

    def set_step(self, step: int) -> None:
        """The step the next update is: scheduled groups' rates become lr · f(step) (in place)."""
        for g in self.factors:
            f = schedules.factor(self.groups[g].schedule, step, self.steps)
            if f != self.factors[g]:
                self.factors[g] = f
                for (gname, _, _), t in self._scheduled.items():
                    if gname == g:
                        t.copy_(self.lrs[g] * f)

    def rates(self) -> dict[str, torch.Tensor]:
        """Each scheduled group's per-member rates at the current step (float64, [S]): logged as ``lr/<group>``."""
        return {g: self.lrs[g] * f for g, f in self.factors.items()}

    def _lr(self, gname: str, p: torch.Tensor) -> torch.Tensor:
        """Group ``gname``'s per-member lrs in ``p``'s dtype and device, converted once while ``lrs[gname]``
        stays the same tensor, unchanged: on a GPU each conversion is a host-to-device copy that waits for
        the device (one per parameter and step before). The same values, so the same bits."""
        key = (gname, p.dtype, p.device)
        if gname in self.factors:
            t = self._scheduled.get(key)
            if t is None:
                t = self._scheduled[key] = (self.lrs[gname] * self.factors[gname]).to(p)
            return t
        src = self.lrs[gname]
        hit = self._lr_as.get(key)
        if hit is None or hit[0] is not src or hit[1] != src._version:
            hit = self._lr_as[key] = (src, src._version, src.to(p))
        return hit[2]

    @staticmethod
    def _update(gc: GroupConfig, p: torch.Tensor, g: torch.Tensor, state: dict[str, torch.Tensor],
                lr: torch.Tensor, tmp: torch.Tensor) -> None:
        """One group's update of ``p`` in place from gradient ``g``, ``state`` (``momentum``, or
        ``exp_avg``, ``exp_avg_sq``, ``step``) in place, temporaries in ``tmp`` (``p``'s shape)."""
        shape = lr.shape
        if gc.optimizer == "sgd":
            if gc.weight_decay:
                g = torch.add(g, p, alpha=gc.weight_decay, out=tmp)
            if gc.momentum > 0:
                g = state["momentum"].mul_(gc.momentum).add_(g)
            p.sub_(torch.mul(lr, g, out=tmp))
            return
        b1, b2 = gc.betas
        if gc.optimizer == "adamw":
            p.mul_(1 - lr * gc.weight_decay)
        elif gc.weight_decay:
            g = torch.add(g, p, alpha=gc.weight_decay, out=tmp)
        step = state["step"].add_(1)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        t = step.view(shape)
        bc1 = (1 - b1 ** t).to(p)
        bc2_sqrt = (1 - b2 ** t).sqrt().to(p)
        denom = torch.sqrt(v, out=tmp).div_(bc2_sqrt).add_(gc.eps)     # (sqrt(v) / bc2_sqrt) + eps
        p.sub_(torch.div(m, denom, out=tmp).mul_(lr / bc1))           # (m / denom) * (lr / bc1)

    @torch.no_grad()
    def step(self, frozen: set[str], active: torch.Tensor) -> None:
        """One update of every non-frozen parameter that has a gradient; ``active`` [S] masks
        members (diverged members keep their parameters and state)."""
        all_active = bool(active.all())
        for name, gname in self.group_of.items():
            p = self.params[name]
            if name in frozen or p.grad is None:
                continue
            gc = self.groups[gname]
            shape = (-1,) + (1,) * (p.dim() - 1)
            lr = self._lr(gname, p).view(shape)
            g = p.grad
            keys = [k for k in (f"momentum/{name}", f"exp_avg/{name}", f"exp_avg_sq/{name}", f"step/{name}")
                    if k in self.state]
            old = None if all_active else {k: self.state[k].clone() for k in keys} | {"p": p.detach().clone()}
            state = {k.split("/")[0]: self.state[k] for k in keys}
            rows = self.rows.get(name)
            if rows is None:
                self._update(gc, p.detach(), g, state, lr, self._scratch(name, p))
            elif isinstance(rows, slice):   # one range of rows, updated in place through views
                sub = {k: v[:, rows] if v.dim() > 1 else v for k, v in state.items()}
                p_rows = p.detach()[:, rows]
                self._update(gc, p_rows, g[:, rows], sub, lr, self._scratch(name, p_rows))
            else:      # only the rows that can have a gradient, updated as one block and written back
                sub = {k: v.index_select(1, rows) if v.dim() > 1 else v for k, v in state.items()}
                p_rows = p.detach().index_select(1, rows)
                self._update(gc, p_rows, g.index_select(1, rows), sub, lr, self._scratch(name, p_rows))
                p.detach().index_copy_(1, rows, p_rows)
                for k, v in state.items():
                    if v.dim() > 1:
                        v.index_copy_(1, rows, sub[k])
            if old is not None:
                keep = ~active.to(p.device)
                p.copy_(torch.where(keep.view(shape), old["p"], p))
                for k in keys:
                    s = self.state[k]
                    s.copy_(torch.where(keep.view((-1,) + (1,) * (s.dim() - 1)).to(s.device), old[k], s))
