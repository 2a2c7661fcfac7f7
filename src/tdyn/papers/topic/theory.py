"""The stage-1 reference optimum (docs/reproductions/topic.md#stage-1-reference-optimum).

Under uniform attention with one-hot embeddings and an identity decoder, every query of a document
sees h = the normalised histogram of its visible tokens (non-selected words, START, END), and the
logits are W h + b. The stage-1 model class is therefore multinomial logistic regression on the
visible bag of words: convex in (W, b). This module fits it independently of the model code.
"""

from __future__ import annotations

import torch


def bag_of_words(tokens: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, vocab_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per document: h [n, V] (histogram of the visible keys, normalised) and C [n, V] (counts of
    the labels at the selected positions). tokens, keys, labels: [n, L]."""
    n = tokens.shape[0]
    h = torch.zeros(n, vocab_size, dtype=torch.float64).scatter_add_(1, tokens, keys.to(torch.float64))
    h = h / h.sum(1, keepdim=True).clamp(min=1)
    sel = labels >= 0
    C = torch.zeros(n, vocab_size, dtype=torch.float64).scatter_add_(1, labels.clamp(min=0), sel.to(torch.float64))
    return h, C


def softmax_regression_loss(W: torch.Tensor, b: torch.Tensor, h: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per labelled position: −Σ_d Σ_y C[d,y] log softmax(W h_d + b)_y / Σ C."""
    logp = torch.log_softmax(h @ W.T + b, dim=1)
    return -(C * logp).sum() / C.sum()


def fit_softmax_regression(h: torch.Tensor, C: torch.Tensor, l2: float = 0.0, max_iter: int = 500,
                           tol: float = 1e-10, init: tuple[torch.Tensor, torch.Tensor] | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Minimise ``softmax_regression_loss`` + (l2/2)‖W‖² over W [V, F], b [V] by L-BFGS (float64),
    from zero or from ``init`` = (W, b) (a warm start).

    Unregularised, logits of never-observed labels diverge slowly; the loss still converges.
    Returns (W, b, final training loss without the penalty).
    """
    h, C = h.double(), C.double()
    if init is None:
        W = torch.zeros(C.shape[1], h.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(C.shape[1], dtype=torch.float64, requires_grad=True)
    else:
        W = init[0].detach().double().clone().requires_grad_(True)
        b = init[1].detach().double().clone().requires_grad_(True)
    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=max_iter, tolerance_grad=tol, tolerance_change=tol * 1e-2,
                            history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = softmax_regression_loss(W, b, h, C) + 0.5 * l2 * (W ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return W.detach(), b.detach(), float(softmax_regression_loss(W, b, h, C))


# ---------------------------------------------------------------- held-out references (issue 12 item 4)


def doc_losses(W: torch.Tensor, b: torch.Tensor, h: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Per document, the summed cross-entropy over its labelled positions [n] (float64)."""
    logp = torch.log_softmax(h.double() @ W.double().T + b.double(), dim=1)
    return -(C.double() * logp).sum(1)


def paired_gap(loss_a: torch.Tensor, loss_b: torch.Tensor, counts: torch.Tensor) -> tuple[float, float]:
    """Per-token mean of (a − b) over the same documents, and its standard error under resampling
    documents (ratio estimator): the noise of comparing two predictors on one finite split."""
    d, n = (loss_a - loss_b).double(), counts.double()
    N = float(n.sum())
    gap = float(d.sum()) / N
    k = len(d)
    se = float(((d - gap * n).pow(2).sum() * k / max(k - 1, 1)).sqrt()) / N
    return gap, se


def l2_path(h: torch.Tensor, C: torch.Tensor, h_dev: torch.Tensor, C_dev: torch.Tensor,
            lambdas: list[float], max_iter: int = 500) -> list[dict]:
    """Fits on (h, C) for each ℓ2 strength (largest first, each warm-started from the previous one),
    each scored on (h_dev, C_dev): ``[{"l2", "train_loss", "dev_loss", "W", "b"}]`` in ``lambdas`` order."""
    out, init = {}, None
    for lam in sorted(lambdas, reverse=True):
        W, b, tr = fit_softmax_regression(h, C, l2=lam, max_iter=max_iter, init=init)
        out[lam] = {"l2": lam, "train_loss": tr, "dev_loss": float(softmax_regression_loss(W, b, h_dev, C_dev)),
                    "W": W, "b": b}
        init = (W, b)
    return [out[lam] for lam in lambdas]
