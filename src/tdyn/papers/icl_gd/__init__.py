"""von Oswald, Niklasson, Randazzo, Sacramento, Mordvintsev, Zhmoginov, Vladymyrov, "Transformers Learn In-Context
by Gradient Descent" (ICML 2023): linear self-attention trained on in-context linear regression, against the
weight construction that makes one LSA layer one step of gradient descent.

The package: ``data`` (the distribution), ``model`` (the LSA equations), ``task`` (data wired to the model),
``probes``, ``theory`` (the construction, η*, K-step GD and GD++), ``analysis`` (what the reproductions share),
the reproductions (``construction``, ``one_layer``, ``k_layers``, each as phases), ``bench``, and this manifest
(read without importing any of them)."""

from tdyn.manifest import Paper, Reproduction

MANIFEST = Paper(
    name="icl_gd", prefix="icl-gd", label="von Oswald et al. 2023",
    title="von Oswald et al. 2023 — Transformers Learn In-Context by Gradient Descent (ICML 2023)",
    docs="icl-gd.md",
    tasks={
        "icl_gd": "tdyn.papers.icl_gd.task",
    },
    probes={
        "icl_gd.loss": "tdyn.papers.icl_gd.probes",
        "icl_gd.align": "tdyn.papers.icl_gd.probes",
        "icl_gd.weights": "tdyn.papers.icl_gd.probes",
    },
    benches={
        "icl_gd_one_layer_steps": "tdyn.papers.icl_gd.bench",
        "icl_gd_k_layer_steps": "tdyn.papers.icl_gd.bench",
        "icl_gd_data": "tdyn.papers.icl_gd.bench",
        "icl_gd_authors": "tdyn.papers.icl_gd.bench",
    },
    reproductions={
        "icl-gd/construction": Reproduction("tdyn.papers.icl_gd.construction",
            "The GD construction: one LSA layer = one GD step (K layers = K steps) to rounding; η* and its loss in closed form",
            "tests the paper's weight construction (no training; no paper figure)"),
        "icl-gd/one-layer": Reproduction("tdyn.papers.icl_gd.one_layer",
            "One trained LSA layer vs one GD step at η*: loss, prediction and sensitivity alignment, weight match",
            "reproduces the paper's single-layer comparison of a trained LSA layer with one GD step",
            fixed={"model.layers": "one LSA layer against one GD step",
                   "data.d": "its reference η* and one-step loss are computed at d = N = 10",
                   "data.N": "its reference η* and one-step loss are computed at d = N = 10"}),
        "icl-gd/k-layers": Reproduction("tdyn.papers.icl_gd.k_layers",
            "K trained (recurrent) LSA layers vs K steps of GD and of GD++: the trained model beats plain GD",
            "reproduces the paper's multi-layer comparison with K steps of GD and GD++",
            fixed={"model.layers": "each run's depth K is its job's (--Ks sets them)"}),
        "icl-gd/k-layers-untied": Reproduction("tdyn.papers.icl_gd.k_layers",
            "K trained separate (untied) LSA layers vs K steps of GD and of GD++ (the authors' 50,000 Adam steps)",
            "reproduces the paper's multi-layer comparison for untied layers",
            fixed={"model.tied": "separate (untied) layers; icl-gd/k-layers --tied true trains recurrent ones",
                   "model.layers": "each run's depth K is its job's (--Ks sets them)"}),
    },
    exports={
        "models": {"LSA": "tdyn.papers.icl_gd.model", "LSAConfig": "tdyn.papers.icl_gd.model"},
        "data": {"ICLData": "tdyn.papers.icl_gd.data"},
    },
)
