"""Bietti, Cabannes, Bouchacourt, Jégou, Bottou, "Birth of a Transformer: A Memory Viewpoint" (NeurIPS 2023): a
simplified two-layer transformer on a bigram language with per-sequence trigger → output bigrams, whose trained
matrices behave as associative memories; the induction head forms from three of them.

The package: ``data`` (the distribution, with tiny Shakespeare's character statistics shipped as
``tinyshakespeare_counts.json``), ``model`` (the equations), ``kernels`` (the fused speed path), ``task``,
``probes`` (memory recall, in-context measures), ``theory`` (associative memories, the induction-head memories),
``analysis`` (what the reproductions share), the reproductions (``memories``, ``induction``, ``heldout_triggers``, each as phases),
``bench``, and this manifest (read without importing any of them)."""

from tdyn.manifest import Paper, Reproduction

MANIFEST = Paper(
    name="birth", prefix="birth", label="Bietti et al. 2023",
    title="Bietti et al. 2023 — Birth of a Transformer: A Memory Viewpoint (NeurIPS 2023)",
    docs="birth.md",
    tasks={
        "birth": "tdyn.papers.birth.task",
    },
    probes={
        "birth.memory": "tdyn.papers.birth.probes",
        "birth.icl": "tdyn.papers.birth.probes",
    },
    benches={
        "birth_steps": "tdyn.papers.birth.bench",
        "birth_data": "tdyn.papers.birth.bench",
        "birth_authors": "tdyn.papers.birth.bench",
    },
    reproductions={
        "birth/memories": Reproduction("tdyn.papers.birth.memories",
            "The memories' formation over training: recall of W_O², W_K², W_K¹ and when each forms; induction accuracy",
            "reproduces the paper's memory recall probes over training (the order in which the memories form)"),
        "birth/induction": Reproduction("tdyn.papers.birth.induction",
            "Global bigrams learnt before the induction head (loss on every token, with W_F); held-out output tokens",
            "reproduces the paper's global-bigrams-first dynamics and the induction head's out-of-distribution accuracy",
            fixed={k: "training outputs come from the first 75 % of the vocabulary and the held-out probe's from the "
                      "last 25 %: the held-out claim reads outputs never seen in training"
                   for k in ("data.outputs", "data.ood_outputs")}),
        "birth/heldout-triggers": Reproduction("tdyn.papers.birth.heldout_triggers",
            "The induction head on trigger tokens never seen as triggers in training (random triggers, held-out pool)",
            "extends the paper's induction-head claim to held-out triggers (is W_K²'s memory trigger-specific?)"),
    },
    exports={
        "models": {"MemoryTransformer": "tdyn.papers.birth.model", "BirthModelConfig": "tdyn.papers.birth.model"},
        "data": {"BirthData": "tdyn.papers.birth.data"},
    },
)
