"""Learning-rate schedules (``optim.groups.<g>.schedule``): a factor of the step that multiplies each member's
learning rate of the group, so a schedule composes with per-member rates (``ensemble.lrs``).

The formulas are Hugging Face transformers' (``get_constant_schedule_with_warmup``,
``get_linear_schedule_with_warmup``, ``get_cosine_schedule_with_warmup``, and its ``_with_min_lr`` variant's floor)
and torch's ``StepLR`` (tests/test_schedules.py compares them), written here because tdyn's optimizer carries
an ensemble axis that ``torch.optim.lr_scheduler`` cannot drive. A factor is a pure function of the step, so
resume needs no state and is exact.
"""

from __future__ import annotations

import math
from tdyn.config import ScheduleConfig


def factor(s: ScheduleConfig, step: int, steps: int) -> float:
    """f(step) of schedule ``s`` (:class:`tdyn.config.ScheduleConfig`) in a run of ``steps`` steps (float64)."""
    W = s.warmup
    if step < W:
        return step / W
    if s.kind == "constant":
        return 1.0
    if s.kind == "step":
        return s.gamma ** ((step - W) // s.step_size)
    T = s.horizon or steps
    if T <= W:
        return s.min_factor
    progress = min(1.0, (step - W) / (T - W))
    decay = 1.0 - progress if s.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return s.min_factor + (1.0 - s.min_factor) * decay
