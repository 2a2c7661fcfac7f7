"""Real text: the real-data checks of Scan and Snap (attention sparsity, entropy vs learning rate on
offline text) and of the topic-structure paper (pretrained MiniLM embeddings and attention).

The package: ``data`` (the distribution), ``model`` (the equations), ``task`` (data wired to the model),
``probes``, ``analysis`` (what the reproductions share), one module per reproduction (``topic_embeddings``,
``attention_maps``, ``entropy_vs_lr``), ``bench``, and this manifest (read without importing any of them)."""

from tdyn.manifest import Paper, Reproduction

MANIFEST = Paper(
    name="real_text", prefix="real", label="Real text (both)",
    title="Real-text checks of Tian et al. 2023 and Li, Li, Risteski 2023",
    docs="real-text.md",
    requires=('topic',),
    tasks={
        "corpus_lm": "tdyn.papers.real_text.task",
    },
    probes={
        "corpus_lm.attention": "tdyn.papers.real_text.probes",
    },
    benches={
        "real_lm_tokens_per_s": "tdyn.papers.real_text.bench",
    },
    reproductions={
        "real/topic-embeddings": Reproduction("tdyn.papers.real_text.topic_embeddings",
            "Li et al. real-data check: same-topic vs different-topic similarity of pretrained embeddings and attention, on two MiniLMs",
            "Li et al. 2023's real-data figure (data.png of their project page) on two MiniLMs"),
        "real/attention-maps": Reproduction("tdyn.papers.real_text.attention_maps",
            "Tian et al. Fig 7 analogue: attention of a 1- and 3-layer LM sparsifies on real text",
            "an analogue of Fig 7 of Tian et al. 2023 on offline text",
            fixed={"data.corpus": "its claims and departure note are about the offline `wiki` corpus",
                   "data.bptt": "its departure note and the entropy ceiling name bptt = 35",
                   "data.probe_windows": "its departure note names 20 validation windows"}),
        "real/entropy-vs-lr": Reproduction("tdyn.papers.real_text.entropy_vs_lr",
            "Tian et al. Fig 10 analogue: final attention entropy falls with the learning rate",
            "an analogue of Fig 10 of Tian et al. 2023 on offline text",
            fixed={"data.bptt": "its departure note names bptt = 35 (and the tokens it trains on)",
                   "data.probe_windows": "its departure note names 20 validation windows"},
            gpu_scale="its four jobs train 5,000 steps of a 20k-vocabulary LM at S = 25 members: 6.3 s a step on this "
                      "2-core CPU, the decoder's matmuls alone at their float32 ceiling (≈ 30 h), against 412 s on one "
                      "H200 (benchmarks/README.md)"),
    },
    exports={
        "models": {"CausalLM": "tdyn.papers.real_text.model", "LMConfig": "tdyn.papers.real_text.model"},
        "data": {"VocabSettings": "tdyn.papers.real_text.data", "TokenData": "tdyn.papers.real_text.data", "load_tokens": "tdyn.papers.real_text.data"},
    },
    aliases={
        "tdyn.data.corpora": "tdyn.papers.real_text.data",
        "tdyn.data.real_topics": "tdyn.papers.real_text.topics",
        "tdyn.models.lm": "tdyn.papers.real_text.model",
        "tdyn.models.minilm": "tdyn.papers.real_text.minilm",
        "tdyn.tasks.corpus_lm": "tdyn.papers.real_text.task",
        "tdyn.probes.corpus_lm": "tdyn.papers.real_text.probes",
    },
)
