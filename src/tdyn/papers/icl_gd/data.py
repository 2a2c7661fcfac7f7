"""In-context linear regression, the data of von Oswald et al. 2023 (docs/reproductions/icl-gd.md#data).

Per sequence (task) a weight vector w ~ N(0, w_scale² I_d) is drawn, then N context inputs and one query input
x ~ U(−x_max, x_max)^d, labels y_i = wᵀx_i + ε_i (ε ~ N(0, noise²), none by default) and the query's target
y_q = wᵀx_q + ε_q. The tokens are e_i = (x_i, y_i) ∈ R^{d+1} for the context and e_{N+1} = (x_q, 0) for the query
(the authors' ``create_reg_data``: the query's y entry is 0, W₀ = 0).

Sizes as the authors' notebook ``constructed_token_setup.ipynb`` sets them: d = 10 (``input_size``), N = 10
(``dataset_size``), batch 2048 (``bs``), 10,000 evaluation tasks from one fixed key (``eval_rng =
PRNGKey(5)``). The input range: the authors' ``create_reg_data`` draws U(−input_range/2, input_range/2) and the
notebook sets ``input_range = 1``, so their runs draw U(−½, ½), while the function's docstring (and the issue)
say U(−1, 1); tdyn's default is ``x_max = 1`` and the comparison with the authors' code is made at
``x_max = 0.5`` (docs/reproductions/icl-gd.md#data). Every loss scales as x_max² and η* as 1/x_max², so the
verdicts (ratios, cosines) are the same at both (tests/test_icl_gd.py checks the scaling in closed form).
"""

from __future__ import annotations

import torch
from pydantic import Field

from tdyn.schema import Strict


class ICLData(Strict):
    """The run config's ``data`` section of the ``icl_gd`` task."""

    d: int = Field(10, ge=1, le=1024, description="input dimension (the authors' input_size)")
    N: int = Field(10, ge=1, le=4096, description="context points per sequence (the authors' dataset_size)")
    x_max: float = Field(1.0, gt=0, description="x ~ U(-x_max, x_max)^d (the authors' runs: 0.5)")
    w_scale: float = Field(1.0, gt=0, description="w ~ N(0, w_scale^2 I) (the authors' weight_scale)")
    noise: float = Field(0.0, ge=0, description="label noise std: y = w^T x + eps, eps ~ N(0, noise^2)")
    batch_size: int = Field(2048, ge=1, le=1 << 20, description="sequences per training step (the authors' bs)")
    probe_size: int = Field(10000, ge=1, le=1 << 20, description="sequences of the fixed probe set")
    probe_seed: int = Field(5, description="seed of the probe set, the same for every member (the authors' "
                                            "eval set is one fixed key, PRNGKey(5))")


def sample(n: int, d: int, N: int, gen: torch.Generator, *, x_max: float = 1.0, w_scale: float = 1.0,
           noise: float = 0.0, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences: tokens E (n, N+1, d+1) — rows e_i = (x_i, y_i), the last row (x_q, 0) — and the
    query targets y_q (n,). Drawn in one pass from ``gen``: x (n, N+1, d) uniform, then w (n, d), then the noise
    (only when ``noise`` > 0)."""
    dtype = dtype or torch.get_default_dtype()
    x = torch.empty(n, N + 1, d, dtype=dtype).uniform_(-x_max, x_max, generator=gen)
    w = torch.randn(n, d, 1, generator=gen, dtype=dtype)
    if w_scale != 1.0:
        w = w * w_scale
    y = x @ w                                                    # (n, N+1, 1): y = wᵀx
    if noise:
        y = y + noise * torch.randn(n, N + 1, 1, generator=gen, dtype=dtype)
    E = torch.cat([x, y], dim=-1)
    E[:, -1, -1] = 0.0            # the query token (x_q, 0)
    return E, y[:, -1, 0].clone()


def split(E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens (..., N+1, d+1) → context inputs x (..., N, d), context labels y (..., N), query x_q (..., d)."""
    return E[..., :-1, :-1], E[..., :-1, -1], E[..., -1, :-1]


def tokens(x: torch.Tensor, y: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`split`: context (x, y) and query x_q as tokens (..., N+1, d+1), query label 0."""
    ctx = torch.cat([x, y.unsqueeze(-1)], dim=-1)
    q = torch.cat([x_q, torch.zeros_like(x_q[..., :1])], dim=-1).unsqueeze(-2)
    return torch.cat([ctx, q], dim=-2)
