"""Topic structure (Li, Li, Risteski, ICML 2023): LDA documents, masked language modelling, a one-layer
transformer whose embeddings and attention learn the topics; the two-stage dynamics.

The package: ``data`` (the distribution), ``model`` (the equations), ``task`` (data wired to the model),
``probes``, ``theory``, the reproductions, and this manifest (read without importing any of them)."""

from tdyn.manifest import Paper, Reproduction

MANIFEST = Paper(
    name="topic", prefix="topic", label="Li, Li, Risteski 2023",
    title="Li, Li, Risteski 2023 — transformers learn topic structure (ICML 2023)",
    docs="topic.md",
    tasks={
        "lda_mlm": "tdyn.papers.topic.task",
    },
    probes={
        "topic.norms": "tdyn.papers.topic.probes",
        "topic.attention": "tdyn.papers.topic.probes",
        "topic.blocks": "tdyn.papers.topic.probes",
        "topic.dev_loss": "tdyn.papers.topic.probes",
        "topic.stages": "tdyn.papers.topic.stages",
    },
    benches={
        "plain_vs_handwritten_topic": "tdyn.papers.topic.bench",
        "topic": "tdyn.papers.topic.two_stage",
        "topic_two_stage_probes": "tdyn.papers.topic.two_stage",
    },
    reproductions={
        "topic/embeddings": Reproduction("tdyn.papers.topic.embeddings",
            "E1: trained embeddings alone learn the topic blocks (uniform attention, W_V = I, d = 32 below the vocabulary size with a trained, untied decoder)",
            "Li et al. 2023's embedding result (theory.png of their project page)",
            fixed={f"model.{k}": "E1 is trained embeddings with uniform attention, W_V = I and a trained, untied "
                                 "decoder" for k in ("attention", "value", "decoder", "emb_init")}),
        "topic/stage1": Reproduction("tdyn.papers.topic.stage1",
            "E2: W_V alone learns the topic blocks (one-hot, attention frozen uniform; presets clean (default) and authors via --preset authors)",
            "Li et al. 2023's stage-1 value-matrix result (theory.png of their project page)",
            fixed={"model.l2": "e2 is unregularised and e2-l2 trains at the convex fit's held-out-tuned λ",
                   **{f"model.{k}": "E2 is one-hot embeddings, attention frozen uniform and W_dec = I"
                      for k in ("embedding", "attention", "decoder")},
                   "model.loss": "its claims compare the cross-entropy with the convex fits' cross-entropy"}),
        "topic/stage2": Reproduction("tdyn.papers.topic.stage2",
            "E3: with W_V frozen to the block matrix, W_K, W_Q learn same-topic attention",
            "Li et al. 2023's stage-2 attention result (theory.png of their project page)",
            fixed={"model.value": "W_V frozen to the block solution is the stage-2 setting its claims name"}),
        "topic/no-unchanged-mask": Reproduction("tdyn.papers.topic.stage2",
            "Ablation p_c = 0: the same-topic attention effect of E3 should vanish (docs/reproductions/topic.md#stage-2-attention)",
            "an ablation of Li et al. 2023's stage-2 attention result (no paper figure)"),
        "topic/two-stage": Reproduction("tdyn.papers.topic.two_stage",
            "E4: from small init, W_V moves first and W_K, W_Q catch up much later (Adam and SGD over init scales and learning rates; the clean model and the authors' parameterisation)",
            "Li et al. 2023's two-stage figure (two_stage.png of their project page)",
            fixed={"model.init_eps": "its cells are labelled ε = init_eps × init scale, and the figure's default "
                                     "cell is Adam lr 0.01 at ε = 1e-3",
                   "seeds": "its figure shows seed --seed among the runs' seeds: use --seed N"}),
        "topic/robustness": Reproduction("tdyn.papers.topic.robustness",
            "E5: do the value blocks (on each architecture's value path), same-topic attention (every layer) and two stages survive other optimizers, learning rates, heads, layers and the full BERT block? (3 seeds per variant at full settings)",
            "tdyn's robustness grid around Li et al. 2023's two stages (no paper figure)",
            fixed={"model.loss": "its variants are the cross-entropy setting's (topic/squared-loss runs the squared "
                                 "loss)"}),
        "topic/squared-loss": Reproduction("tdyn.papers.topic.robustness",
            "E6: E2 and E4 with the squared loss instead of cross-entropy (3 seeds per variant at full settings)",
            "Li et al. 2023's stage-1 and two-stage results under the squared loss (no paper figure)"),
    },
    exports={
        "models": {"TopicTransformer": "tdyn.papers.topic.model", "TopicModelConfig": "tdyn.papers.topic.model"},
        "data": {"LdaDataConfig": "tdyn.papers.topic.data", "LdaDataset": "tdyn.papers.topic.data", "MlmBatch": "tdyn.papers.topic.data"},
    },
    aliases={
        "tdyn.data.lda": "tdyn.papers.topic.data",
        "tdyn.models.topic": "tdyn.papers.topic.model",
        "tdyn.tasks.lda_mlm": "tdyn.papers.topic.task",
        "tdyn.probes.topic": "tdyn.papers.topic.probes",
        "tdyn.probes.topic_stages": "tdyn.papers.topic.stages",
        "tdyn.probes.topic_similarity": "tdyn.papers.topic.similarity",
        "tdyn.probes.topic_value": "tdyn.papers.topic.value",
        "tdyn.theory.topic": "tdyn.papers.topic.theory",
    },
)
