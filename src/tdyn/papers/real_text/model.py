"""The PyTorch-tutorial causal LM used by Scan and Snap on WikiText
(docs/reproductions/real-text.md#tutorial-language-model), as an ensemble.

Every parameter has a leading ensemble axis S. Per member (the tutorial's ``TransformerModel``):

    X   = Emb[x]·√d + PE + dropout                      (sinusoidal PE, Vaswani et al. 2017)
    per layer (post-LN, ``nn.TransformerEncoderLayer``):
      A   = softmax(Q Kᵀ/√d_h + causal mask)            (Q, K, V = X W_inᵀ + b_in, split; heads of d/H)
      X   = LN1(X + dropout((A V) W_outᵀ + b_out))
      X   = LN2(X + dropout(W_2 dropout(ReLU(W_1 X + b_1)) + b_2))
    logits = X Decᵀ + b_dec                              (untied decoder)

``forward`` returns the logits and the head-averaged attention of every layer, [S, B, T, T] each
(``need_weights=True``, before attention dropout). Member i's dropout masks come from
``self.dropout_gens[i]`` alone, so a member trains as it would on its own. The intermediate tensors are named
in ``CausalLM.ACTIVATIONS`` (:mod:`tdyn.models.activations`, docs/activations.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field

from tdyn.models import activations
from tdyn.schema import Strict


class LMConfig(Strict):
    """The ``model`` section of a ``corpus_lm`` run config, and the model's own config. ``V`` and
    ``max_len`` come from the data (the task sets them); they are excluded from dumps."""

    V: int | None = Field(None, ge=2, exclude=True)         # vocabulary size
    d: int = Field(200, ge=1)                               # emsize
    d_hid: int = Field(200, ge=1)                           # FFN width
    n_layers: int = Field(1, ge=1)
    n_heads: int = Field(1, ge=1)
    dropout: float = Field(0.2, ge=0, lt=1)
    max_len: int = Field(512, ge=1, exclude=True)


def positional_encoding(T: int, d: int) -> torch.Tensor:
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    pe = torch.zeros(T, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


def _bmm_linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-member linear map: x [S, ..., in], W [S, out, in], b [S, out]."""
    S = x.shape[0]
    y = torch.bmm(x.reshape(S, -1, x.shape[-1]), W.transpose(1, 2)) + b[:, None]
    return y.reshape(*x.shape[:-1], W.shape[1])


def _layer_norm(x, g, b):
    return F.layer_norm(x, x.shape[-1:]) * g[:, None, None] + b[:, None, None]


def member_size(cfg: LMConfig, V: int) -> int:
    """Values in one member's parameters for vocabulary size ``V``, from the config alone."""
    d, h = cfg.d, cfg.d_hid
    return 2 * V * d + V + cfg.n_layers * (4 * d * d + 8 * d + 2 * h * d + h + d)


class CausalLM(nn.Module):
    #: the named activations (:mod:`tdyn.models.activations`; docs/activations.md), each [S, ...], one ``layer<l>.``
    #: set per layer (``activation_names()``); in training mode the tensors are the ones the dropout masks were
    #: applied to, as noted
    ACTIVATIONS = {
        "embed": "X = Emb[x] sqrt(d) + PE, the first layer's input (after its dropout), [S, B, T, d]",
        "layer{l}.scores": "Q K^T/sqrt(d_h) per head, before the causal mask, [S, B, heads, T, T]",
        "layer{l}.attention": "A = softmax(Q K^T/sqrt(d_h) + causal mask) per head (before attention dropout; the "
                              "forward returns its mean over heads), [S, B, heads, T, T]",
        "layer{l}.attended": "A V, the heads' outputs concatenated (A after attention dropout), [S, B, T, d]",
        "layer{l}.attn_out": "(A V) W_out^T + b_out, the attention block's output (before its dropout), [S, B, T, d]",
        "layer{l}.mid": "LN1(X + attn_out), the residual stream between attention and FFN, [S, B, T, d]",
        "layer{l}.mlp_out": "W_2 ReLU(W_1 mid + b_1) + b_2, the FFN's output (before its dropout), [S, B, T, d]",
        "layer{l}.out": "LN2(mid + mlp_out), the layer's output, [S, B, T, d]",
        "logits": "X Dec^T + b_dec, [S, B, T, V] (under bf16 autocast, where loss() fuses decoder and "
                  "cross-entropy, formed only where asked for)",
    }

    def activation_names(self) -> dict[str, str]:
        """This model's named activations: ``ACTIVATIONS`` with ``layer<l>.`` for each layer."""
        return {name.format(l=i): doc for name, doc in self.ACTIVATIONS.items()
                for i in (range(self.cfg.n_layers) if "{l}" in name else (0,))}

    def __init__(self, cfg: LMConfig, S: int):
        super().__init__()
        self.cfg, self.S = cfg, S
        d, h, V, L = cfg.d, cfg.d_hid, cfg.V, cfg.n_layers
        P = lambda *shape: nn.Parameter(torch.zeros(S, *shape))  # noqa: E731
        self.emb = P(V, d)
        self.dec_W, self.dec_b = P(V, d), P(V)
        self.layers = nn.ModuleList()
        for _ in range(L):
            m = nn.Module()
            m.in_W, m.in_b, m.out_W, m.out_b = P(3 * d, d), P(3 * d), P(d, d), P(d)
            m.ln1_g, m.ln1_b, m.ln2_g, m.ln2_b = P(d), P(d), P(d), P(d)
            m.W1, m.b1, m.W2, m.b2 = P(h, d), P(h), P(d, h), P(d)
            self.layers.append(m)
        self.register_buffer("pe", positional_encoding(cfg.max_len, d).float(), persistent=False)
        # one dropout stream per member; a task replaces these with seeded (and checkpointed) ones
        self.dropout_gens = [torch.Generator().manual_seed(i) for i in range(S)]
        self._ce_scratch: dict = {}   # decoder_cross_entropy's zero buffer, reused every step

    @torch.no_grad()
    def reset_parameters(self, gens: list[torch.Generator], scales: list[float] | None = None) -> None:
        """The tutorial's init per member: Emb, Dec ~ U(±0.1), b_dec = 0; xavier W_in; torch-default Linear."""
        scales = scales or [1.0] * self.S
        d = self.cfg.d

        def U(t, i, a, g):
            t[i].copy_((torch.rand(t.shape[1:], generator=g) * 2 - 1) * a)

        for i, g in enumerate(gens):
            U(self.emb, i, 0.1, g)
            U(self.dec_W, i, 0.1, g)
            self.dec_b[i].zero_()
            for m in self.layers:
                U(m.in_W, i, math.sqrt(6 / (d + 3 * d)), g)  # xavier_uniform on [3d, d]
                m.in_b[i].zero_(), m.out_b[i].zero_()
                U(m.out_W, i, 1 / math.sqrt(d), g)
                m.ln1_g[i].fill_(1), m.ln1_b[i].zero_(), m.ln2_g[i].fill_(1), m.ln2_b[i].zero_()
                for W, b in ((m.W1, m.b1), (m.W2, m.b2)):
                    U(W, i, 1 / math.sqrt(W.shape[-1]), g)
                    U(b, i, 1 / math.sqrt(W.shape[-1]), g)
            for p in self.parameters():
                p[i].mul_(scales[i])

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        p = self.cfg.dropout
        if not self.training or p == 0:
            return x
        keep = torch.stack([torch.rand(x.shape[1:], generator=g, device=x.device) for g in self.dropout_gens]) >= p
        return x * keep / (1 - p)

    def hidden(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x [S, B, T] token ids -> (last layer's output X [S, B, T, d], attention per layer [S, B, T, T])."""
        S, B, T = x.shape
        c = self.cfg
        H, dh = c.n_heads, c.d // c.n_heads
        X = torch.gather(self.emb, 1, x.reshape(S, -1, 1).expand(-1, -1, c.d)).reshape(S, B, T, c.d)
        X = self._drop(X * math.sqrt(c.d) + self.pe[:T])
        mask = torch.full((T, T), float("-inf"), device=x.device).triu(1)
        cache = activations.recording(self)                                            # None unless captured
        if cache is not None:
            cache.put("embed", X)
        attns = []
        for i, m in enumerate(self.layers):
            Q, K, Vv = _bmm_linear(X, m.in_W, m.in_b).view(S, B, T, 3, H, dh).permute(3, 0, 1, 4, 2, 5)
            scores = Q @ K.transpose(-1, -2) / math.sqrt(dh)
            A = torch.softmax(scores + mask, dim=-1)                                   # [S, B, H, T, T]
            attns.append(A.mean(2))
            O = (self._drop(A) @ Vv).transpose(2, 3).reshape(S, B, T, c.d)
            P = _bmm_linear(O, m.out_W, m.out_b)
            X_mid = _layer_norm(X + self._drop(P), m.ln1_g, m.ln1_b)
            F_ = _bmm_linear(self._drop(torch.relu(_bmm_linear(X_mid, m.W1, m.b1))), m.W2, m.b2)
            X = _layer_norm(X_mid + self._drop(F_), m.ln2_g, m.ln2_b)
            if cache is not None:
                for name, t in (("scores", scores), ("attention", A), ("attended", O), ("attn_out", P),
                                ("mid", X_mid), ("mlp_out", F_), ("out", X)):
                    cache.put(f"layer{i}.{name}", t)
        return X, attns

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x [S, B, T] token ids -> (logits [S, B, T, V], attention per layer [S, B, T, T])."""
        X, attns = self.hidden(x)
        logits = _bmm_linear(X, self.dec_W, self.dec_b)
        cache = activations.recording(self)
        if cache is not None:
            cache.put("logits", logits)
        return logits, attns

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-member token-mean cross-entropy, shape [S]. Under bf16 (or fp16) autocast the decoder and the
        cross-entropy are fused (:func:`linear_cross_entropy`, equal to the dense path within rounding,
        tested). In full precision the dense logits stay, so float32 runs keep every bit of the results
        committed before the fused path existed (docs/results); the fused path would be about as fast at
        S = 1 and faster for large ensembles (benchmarks/README.md#measurements-behind-the-code). The dense
        path runs as :func:`decoder_cross_entropy` (the same kernels, fewer passes over the [S, N, V]
        logits; bit-equal to ``F.cross_entropy`` on ``_bmm_linear``'s logits, tested), or written out where
        the activations are recorded."""
        X, _ = self.hidden(x)
        S = x.shape[0]
        cache = activations.recording(self)
        if _compute_dtype(X) in (torch.bfloat16, torch.float16):
            if cache is not None:   # the fused path never forms the logits
                cache.put("logits", lambda: _bmm_linear(X, self.dec_W, self.dec_b))
            return linear_cross_entropy(X.reshape(S, -1, self.cfg.d), self.dec_W, self.dec_b, y.reshape(S, -1))
        if cache is not None:
            logits = _bmm_linear(X, self.dec_W, self.dec_b)
            cache.put("logits", logits)
            ce = F.cross_entropy(logits.flatten(0, 2), y.flatten(), reduction="none")
            return ce.view(S, -1).mean(1)
        ce = decoder_cross_entropy(X.reshape(S, -1, self.cfg.d), self.dec_W, self.dec_b, y.reshape(S, -1),
                                   self._ce_scratch)
        return ce.mean(1)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmuls' dtype: autocast's lower precision where autocast is on for x's device and x is float32
    (autocast leaves float64 alone), else x's own."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) and x.dtype == torch.float32 else x.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """Per member s: mean over tokens n of CE(X[s, n] W[s]ᵀ + b[s], y[s, n]), without materialising the
    [S, N, V] logits: vocabulary chunks of C columns, two passes. Pass 1 accumulates each token's
    log-partition (online logsumexp) and its target logit; where a gradient is wanted, pass 2 takes each
    chunk's logits again (in bf16 the matmul's bf16 output kept from pass 1, half the float32 bytes; in full
    precision recomputed by the same kernel, so the same values) and turns them into the logit gradient
    G = (softmax − onehot)/N, which gives dX += G W_c, dW_c = Gᵀ X, db_c = Σ_n G at once; backward scales
    these by the incoming per-member gradient. Against the dense path this saves its [S, N, V] float32
    logits, log-softmax and their backward, ~5 × 56 MB per member-step streamed through memory at
    V = 20k, N = 700 (benchmarks/README.md). Matmuls run in the compute dtype (bf16 under CPU/CUDA
    autocast; inputs, accumulators and the softmax in float32). Hand-written because torch has no fused
    linear + cross-entropy with an ensemble axis on CPU."""

    @staticmethod
    def forward(ctx, X, W, b, y, chunk, group, want):
        S = X.shape[0]
        cd = _compute_dtype(X)
        with torch.autocast(X.device.type, enabled=False):
            X, W, b = X.detach(), W.detach(), b.detach()
            loss = torch.empty(S, dtype=X.dtype, device=X.device)
            grads = (torch.empty_like(X), torch.empty_like(W), torch.empty_like(b)) if want else None
            for s in range(0, S, group):    # members in groups: each block stays a few MB (cache, no mmap)
                m = slice(s, s + group)
                _LinearCrossEntropy._block(X[m], W[m], b[m], y[m], chunk, cd, loss[m],
                                           grads and tuple(t[m] for t in grads))
            if want:
                ctx.save_for_backward(*grads)
        return loss

    @staticmethod
    def _block(X, W, b, y, chunk, cd, loss, grads):
        """For a group of members: writes their losses into ``loss`` and, where ``grads`` (views of dX, dW,
        db) is given, their gradients into it."""
        S, N, d = X.shape
        V = W.shape[1]
        acc = torch.float32 if X.dtype in (torch.bfloat16, torch.float16) else X.dtype   # accumulators, softmax
        Xc, Wc, b_acc = X.to(cd), W.to(cd), b.to(acc)     # one conversion each per step
        lse = torch.full((S, N), float("-inf"), dtype=acc, device=X.device)
        tgt = torch.zeros(S, N, dtype=acc, device=X.device)
        raw = []      # each chunk's X Wᵀ in the compute dtype, kept for pass 2 when it is reduced precision
        targets = []  # each chunk's (whether y falls in it, y's column in it)

        def logits(j, k):
            P = raw[k] if k < len(raw) else torch.bmm(Xc, Wc[:, j:j + chunk].transpose(1, 2))
            if grads and cd != acc and k == len(raw):
                raw.append(P)    # half the bytes of the float32 logits, and one decoder matmul fewer
            return b_acc[:, None, j:j + chunk] + P    # one kernel: P is promoted to the accumulator dtype exactly

        for k, j in enumerate(range(0, V, chunk)):
            L = logits(j, k)
            lse = torch.logaddexp(lse, torch.logsumexp(L, -1))
            targets.append(((y >= j) & (y < j + L.shape[-1]), (y - j).clamp(0, L.shape[-1] - 1)[..., None]))
            inside, col = targets[k]
            tgt = torch.where(inside, L.gather(-1, col)[..., 0], tgt)
        loss.copy_((lse - tgt).mean(1))
        if not grads:
            return
        dX, dW, db = grads
        dX_acc = torch.zeros(S, N, d, dtype=acc, device=X.device)
        for k, j in enumerate(range(0, V, chunk)):
            inside, col = targets[k]
            G = (logits(j, k) - lse[..., None]).exp_()
            G.scatter_add_(-1, col, -inside[..., None].to(G.dtype))
            G.mul_(1.0 / N)
            db[:, j:j + chunk] = G.sum(1)
            Gc = G.to(cd)
            dW[:, j:j + chunk] = torch.bmm(Gc.transpose(1, 2), Xc)
            dX_acc += torch.bmm(Gc, Wc[:, j:j + chunk])
        dX.copy_(dX_acc)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        dX, dW, db = ctx.saved_tensors
        g = g.to(dX.dtype)
        return dX * g[:, None, None], dW * g[:, None, None], db * g[:, None], None, None, None, None


def linear_cross_entropy(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                         chunk: int | None = None, group: int | None = None) -> torch.Tensor:
    """Per-member mean cross-entropy of the logits X Wᵀ + b against y: X [S, N, d], W [S, V, d], b [S, V],
    y [S, N] -> [S] (:class:`_LinearCrossEntropy`). ``chunk``: vocabulary columns per pass (default 2048);
    ``group``: members per block (default: as many as keep the [group, N, chunk] float32 block within 8 MB,
    at least one: larger blocks leave the cache, and above 32 MB glibc maps and unmaps them every step; in
    bf16 a block also keeps its [group, N, V] matmul output between the passes, 28 MB per member at
    V = 20k, N = 700). Chunk and group do not depend on S, so a member computes the same bits in any
    ensemble of the same group size. On a CUDA device, where each kernel launch costs more than the bytes
    of a larger block, the defaults are 8192 columns and every member in one group (3 chunks per pass at
    V = 20k instead of 10 per member): there a member's bits depend on the ensemble's size (equal within
    rounding, as across devices)."""
    S, N, _ = X.shape
    V = W.shape[1]
    if (chunk is not None and chunk < 1) or (group is not None and group < 1):
        raise ValueError(f"linear_cross_entropy: chunk = {chunk}, group = {group}: each must be at least 1")
    if y.numel():
        lo, hi = torch.stack(torch.aminmax(y)).tolist()    # one device sync, not two
        if lo < 0 or hi >= V:
            raise ValueError(f"linear_cross_entropy: targets must lie in [0, {V}); got [{lo}, {hi}]")
    cuda = X.device.type == "cuda"
    chunk = min(chunk or (8192 if cuda else 2048), V)
    group = group or (S if cuda else max(1, (8 << 20) // (4 * N * chunk)))
    want = torch.is_grad_enabled() and (X.requires_grad or W.requires_grad or b.requires_grad)
    return _LinearCrossEntropy.apply(X, W, b, y, chunk, group, want)


class _DecoderCrossEntropy(torch.autograd.Function):
    """Per token n of member s: CE(X[s, n] W[s]ᵀ + b[s], y[s, n]) with the dense logits, by the same
    kernels and in the same order as ``F.cross_entropy(_bmm_linear(X, W, b), y, reduction="none")`` under
    autograd, so the same bits, with three passes over the [S, N, V] float32 logits (56 MB per member at
    V = 20k, N = 700) fewer: the bias is added in place, the log-softmax overwrites the logits, and its
    backward, G = g_nll − exp(log p)·Σ_v g_nll (aten's kernel), overwrites the log-probabilities; its
    input g_nll (zero but −g at each target) is a zero buffer kept in ``scratch`` between steps (the
    targets written, then zeroed again) instead of a fresh zero-filled tensor. dX = G W and dW = (XᵀG)ᵀ as
    bmm's backward forms them (GᵀX in W's layout would save a copy and is bit-equal in float32 here, not in
    float64). Equal to the autograd path bit for bit (tests/test_models_lm.py); measured in
    benchmarks/README.md (issue 35, helper amaps)."""

    @staticmethod
    def forward(ctx, X, W, b, y, scratch):
        L = torch.bmm(X, W.transpose(1, 2))                    # logits [S, N, V]
        L += b[:, None]
        lp = torch._log_softmax(L, -1, False, out=L)           # log p, in the logits' memory
        ctx.save_for_backward(X, W, y, lp)
        ctx.scratch = scratch
        return -lp.gather(-1, y[..., None])[..., 0]            # nll_loss: −log p[y]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        X, W, y, lp = ctx.saved_tensors
        key = (tuple(lp.shape), lp.dtype, lp.device)
        zero = ctx.scratch.get(key)
        if zero is None:
            ctx.scratch.clear()
            zero = ctx.scratch[key] = torch.zeros_like(lp)
        idx = y[..., None]
        try:
            zero.scatter_(-1, idx, -g[..., None].to(lp.dtype))   # nll_loss's backward: −g at the target
            G = torch._log_softmax_backward_data(zero, lp, -1, lp.dtype, out=lp)
        finally:
            zero.scatter_(-1, idx, 0.0)
        dX = torch.bmm(G, W) if ctx.needs_input_grad[0] else None
        dW = torch.bmm(X.transpose(1, 2), G).transpose(1, 2) if ctx.needs_input_grad[1] else None  # as bmm's backward
        db = G.sum(1) if ctx.needs_input_grad[2] else None
        return dX, dW, db, None, None


def decoder_cross_entropy(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                          scratch: dict | None = None) -> torch.Tensor:
    """Per-token cross-entropy of the logits X Wᵀ + b against y: X [S, N, d], W [S, V, d], b [S, V], y [S, N]
    -> [S, N], bit-equal to the dense autograd path (:class:`_DecoderCrossEntropy`). ``scratch``: a dict that
    keeps the backward's zero buffer between calls (a fresh one per call without it)."""
    return _DecoderCrossEntropy.apply(X, W, b, y, {} if scratch is None else scratch)


def attention_entropy(A: torch.Tensor) -> torch.Tensor:
    """Mean over (batch, query) of −Σ_k a_qk ln(a_qk + 1e−8)
    (docs/reproductions/real-text.md#causal-attention-entropy); A [..., B, T, T] -> [...]."""
    return -(A * torch.log(A + 1e-8)).sum(-1).mean((-1, -2))
