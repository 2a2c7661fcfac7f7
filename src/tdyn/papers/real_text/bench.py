"""Bench entry of the real-text paper: training tokens/s of the tutorial LM at Fig 10's shapes
(benchmarks/README.md#real-text-bench-entry)."""

from __future__ import annotations

import math

import torch

from tdyn import bench
from tdyn.bench import register_bench
from tdyn.papers.real_text.model import CausalLM, LMConfig
from tdyn.seeding import generator
from tdyn.threads import tune_allocator


@register_bench("real_lm_tokens_per_s")
def _bench_lm(quick: bool) -> dict:
    """Training tokens/s of the tutorial LM at Fig 10's shapes (d = 200, 1 layer, vocab 20k, batch 20 × 35,
    dropout 0.2; quick: vocab 2k) for ensembles of S = 1, 5, 25 members, in float32 (the dense decoder) and
    under bf16 autocast (the fused decoder + cross-entropy): the model's training step alone (forward,
    backward, an in-place SGD update), on fixed random tokens. The two precisions alternate for two rounds
    and the faster round counts. ``tokens_per_s`` counts every member's tokens; ``tokens_per_s_per_member``
    is that over S. The allocator is set as the trainer sets it (``allocator_tuned``). On ``--device cuda``
    everything lives on the GPU, each timing waits for it, and 20 times the steps are timed."""
    V, B, T = (2000 if quick else 20000), 20, 35
    dev = bench.DEVICE
    reps = {S: n * (20 if dev == "cuda" else 1) for S, n in {1: 3, 5: 2, 25: 1}.items()}
    out: dict = {"V": V, "tokens_per_step_per_member": B * T, "timed_steps": reps, "rounds": 2,
                 "threads": torch.get_num_threads(), "allocator_tuned": tune_allocator(), "device": dev}
    for S in (1, 5, 25):
        m = CausalLM(LMConfig(V=V, max_len=T, dropout=0.2), S)
        m.reset_parameters([generator(i, "init") for i in range(S)])
        m.to(dev)
        m.dropout_gens = [torch.Generator(dev).manual_seed(i) for i in range(S)]   # the model's own streams, on dev
        g = generator(0, "bench")
        x, y = (torch.randint(0, V, (S, B, T), generator=g).to(dev) for _ in range(2))
        params = list(m.parameters())

        def step(amp: str | None) -> None:
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp is not None):
                loss = m.loss(x, y)
            for p in params:
                p.grad = None
            loss.sum().backward()
            with torch.no_grad():
                for p in params:
                    p.sub_(p.grad, alpha=1e-3)

        best = {}
        for _ in range(out["rounds"]):
            for amp in (None, "bfloat16"):
                step(amp)   # warm-up
                best[amp] = min(best.get(amp, math.inf), bench.seconds(lambda: step(amp), reps[S]) / reps[S])
        for amp, dt in best.items():
            out[f"S{S}_{amp or 'float32'}"] = {"s_per_step": dt, "tokens_per_s": S * B * T / dt,
                                               "tokens_per_s_per_member": B * T / dt}
        out[f"S{S}_bf16_speedup"] = best[None] / best["bfloat16"]
        out[f"S{S}_decoder_matmul_floor"] = _decoder_floor(S, B * T, LMConfig().d, V, dev)
    return out


def _decoder_floor(S: int, N: int, d: int, V: int, dev: str) -> dict:
    """The decoder's three matmuls of one training step alone (logits X Wᵀ, dX = G W, dW = Gᵀ X: 6·S·N·d·V
    FLOPs), timed in float32 and bf16 on random operands, best of 3: the step can take no less, so
    ``tokens_per_s_max`` bounds every implementation of this step on this machine."""
    g = generator(1, "bench")
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        X, W, G = (torch.randn(S, *shape, generator=g).to(dev, dt) for shape in ((N, d), (V, d), (N, V)))

        def mm():
            torch.bmm(X, W.transpose(1, 2)), torch.bmm(G, W), torch.bmm(G.transpose(1, 2), X)

        mm()
        best = min(bench.seconds(mm) for _ in range(3))
        out[str(dt).removeprefix("torch.")] = {"s_per_step": best, "gflops": 6 * S * N * d * V / best / 1e9,
                                                "tokens_per_s_max": S * N / best}
    return out
