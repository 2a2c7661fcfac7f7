"""Topic probes: vectorised = brute-force loops on small cases (docs/reproductions/topic.md#measured-quantities,
docs/reproductions/topic.md#corrected-attention-classes)."""

import math

import torch

from tdyn.papers.topic.probes import attention_classes, block_contrast, embedding_gram, stage_norms

V_PER_TOPIC, NS = 3, 4


def _topic(i):
    return (i - NS) // V_PER_TOPIC if i >= NS else None


def _brute_attention(A, tokens, keys):
    """Loops over members, documents and ordered pairs (rows scaled by the visible key count)."""
    S, B, L, _ = A.shape
    out = {c: [] for c in ("self", "same_token", "same_topic", "diff_topic")}
    for s in range(S):
        sums = {c: 0.0 for c in out}
        cnts = {c: 0 for c in out}
        for b in range(B):
            n = int(keys[s, b].sum())
            for i in range(L):
                for j in range(L):
                    ti, tj = _topic(int(tokens[s, b, i])), _topic(int(tokens[s, b, j]))
                    if ti is None or tj is None:
                        continue
                    if i == j:
                        c = "self"
                    elif tokens[s, b, i] == tokens[s, b, j]:
                        c = "same_token"
                    elif ti == tj:
                        c = "same_topic"
                    else:
                        c = "diff_topic"
                    sums[c] += float(A[s, b, i, j]) * n
                    cnts[c] += 1
        for c in out:
            out[c].append(sums[c] / cnts[c])
    return {c: torch.tensor(v, dtype=torch.float64) for c, v in out.items()}


def _random_case(S=2, B=3, L=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = NS + 3 * V_PER_TOPIC
    tokens = torch.randint(0, V, (S, B, L), generator=g)
    tokens[tokens == 2] = 1                                         # START only at position 0
    tokens[..., 0] = 2                                              # START
    tokens[..., -2:] = 0                                            # PAD
    keys = tokens != 0
    A = torch.softmax(torch.randn(S, B, L, L, generator=g, dtype=torch.float64).masked_fill(~keys[:, :, None, :], -1e30), -1)
    return A, tokens, keys


def test_attention_classes_equal_brute_force():
    A, tokens, keys = _random_case()
    fast = attention_classes(A, tokens, keys, V_PER_TOPIC, NS)
    slow = _brute_attention(A, tokens, keys)
    for c, v in slow.items():
        torch.testing.assert_close(fast[c], v)
    torch.testing.assert_close(fast["gap"], slow["same_topic"] - slow["diff_topic"])


def test_uniform_attention_reads_one_in_every_class():
    A, tokens, keys = _random_case(seed=3)
    U = keys[:, :, None, :].double().expand_as(A) / keys.sum(-1)[:, :, None, None]
    out = attention_classes(U, tokens, keys, V_PER_TOPIC, NS)
    for c in ("self", "same_token", "same_topic", "diff_topic"):
        torch.testing.assert_close(out[c], torch.ones(2, dtype=torch.float64))
    assert torch.allclose(out["gap"], torch.zeros(2, dtype=torch.float64))
    n, nw = keys.sum(-1).double(), (tokens >= NS).sum(-1).double()
    torch.testing.assert_close(out["start_mass"], (nw / n).sum(1) / nw.sum(1))     # START is one key of n


def _brute_block(M, T):
    S, V, _ = M.shape
    res = {"diag": [], "same": [], "diff": [], "per_topic": []}
    for s in range(S):
        d, same, diff = [], [], []
        pt = []
        for t in range(T):
            st, dt = [], []
            for i in range(NS, V):
                if _topic(i) != t:
                    continue
                for j in range(NS, V):
                    (st if _topic(j) == t and j != i else dt if _topic(j) != t else []).append(float(M[s, i, j]))
            pt.append(sum(st) / len(st) - sum(dt) / len(dt))
            same += st
            diff += dt
        for i in range(NS, V):
            d.append(float(M[s, i, i]))
        res["diag"].append(sum(d) / len(d))
        res["same"].append(sum(same) / len(same))
        res["diff"].append(sum(diff) / len(diff))
        res["per_topic"].append(pt)
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in res.items()}


def test_block_contrast_equals_brute_force():
    T = 4
    V = NS + T * V_PER_TOPIC
    M = torch.randn(2, V, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fast = block_contrast(M, V_PER_TOPIC, NS)
    slow = _brute_block(M, T)
    for k in ("diag", "same", "diff", "per_topic"):
        torch.testing.assert_close(fast[k], slow[k])
    torch.testing.assert_close(fast["contrast"], slow["same"] - slow["diff"])


def test_block_contrast_of_block_matrix():
    from tdyn.papers.topic.model import TopicTransformer

    B = TopicTransformer.block_matrix(NS + 4 * V_PER_TOPIC, V_PER_TOPIC, NS)[None].double()
    out = block_contrast(B, V_PER_TOPIC, NS)
    assert float(out["same"]) == 1 and float(out["diff"]) == 0 and (out["per_topic"] == 1).all()


def test_embedding_gram_dot_and_cosine():
    T = 3
    V = NS + T * V_PER_TOPIC
    E = torch.randn(1, V, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = embedding_gram(E, V_PER_TOPIC, NS)
    slow = _brute_block(E @ E.transpose(1, 2), T)
    torch.testing.assert_close(out["dot_contrast"], slow["same"] - slow["diff"])
    En = E / E.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(out["cos_diag"], torch.ones(1, dtype=torch.float64))
    torch.testing.assert_close(out["cos_per_topic"], _brute_block(En @ En.transpose(1, 2), T)["per_topic"])


def test_stage_norms():
    g = torch.Generator().manual_seed(0)
    W_V, W_V0, W_K, W_Q = (torch.randn(2, 4, 4, generator=g) for _ in range(4))
    out = stage_norms(W_V, W_V0, W_K, W_Q)
    for s in range(2):
        assert math.isclose(float(out["dV"][s]), float(torch.linalg.matrix_norm(W_V[s] - W_V0[s])), rel_tol=1e-5)
        assert math.isclose(float(out["KQ"][s]), float(torch.linalg.matrix_norm(W_K[s].T @ W_Q[s])), rel_tol=1e-5)
    assert set(stage_norms(W_V, W_V0, None, None)) == {"dV"}
