"""Decision lists (extended abstract): softmax(V X softmax(Xᵀ W X)) on one-hot tokens, gradient flow and
descent on the population loss, the convergence results.

The package: ``data`` (the distribution), ``model`` (the equations), ``task`` (data wired to the model),
``probes``, ``theory``, ``analysis`` (what the reproductions share), the reproductions (``claim1``, ``claim2``,
``uniform_attention``, each as phases), ``bench``, and this manifest (read without importing any of them)."""

from tdyn.manifest import Paper, Reproduction

MANIFEST = Paper(
    name="decision_list", prefix="decision-list", label="Decision lists",
    title="Decision lists — gradient descent on a one-layer transformer (extended abstract)",
    docs="decision-lists.md",
    tasks={
        "decision_list": "tdyn.papers.decision_list.task",
    },
    probes={
        "decision_list.classify": "tdyn.papers.decision_list.probes",
        "decision_list.V": "tdyn.papers.decision_list.probes",
        "decision_list.hessian": "tdyn.papers.decision_list.probes",
    },
    benches={
        "decision_list_popgrad_L32_n4": "tdyn.papers.decision_list.bench",
        "decision_list_popgrad_L16_n5": "tdyn.papers.decision_list.bench",
        "decision_list_hessian_blocks_L40": "tdyn.papers.decision_list.bench",
        "decision_list_claim2_step_L40": "tdyn.papers.decision_list.bench",
        "decision_list_reduced_ode_L10000": "tdyn.papers.decision_list.bench",
        "decision_list_task_and_samples_L10000": "tdyn.papers.decision_list.bench",
        "decision_list_claim1": "tdyn.papers.decision_list.bench",
    },
    reproductions={
        "decision-list/claim1": Reproduction("tdyn.papers.decision_list.claim1",
            "Result (1): W-only gradient flow from W=0, V=cP, c=4n log L/δ perfectly classifies within 4M/(γ log L)",
            "tests Result (1) of the decision-list abstract (no figure in the paper)"),
        "decision-list/claim2": Reproduction("tdyn.papers.decision_list.claim2",
            "Result (2): joint GD from W=0, V0 near cP with η <= 1/λ_max encounters a perfectly classifying iterate",
            "tests Result (2) of the decision-list abstract (no figure in the paper)",
            fixed={"data.sampler": "η = f/λ_max(0), c and δ are computed for sampler B, result (2)'s sampler",
                   "optim.groups.all.optimizer": "result (2) is about gradient descent at η ≤ 1/λ_max",
                   "optim.groups.all.momentum": "result (2) is about gradient descent at η ≤ 1/λ_max"}),
        "decision-list/uniform-attention": Reproduction("tdyn.papers.decision_list.uniform_attention",
            "Claim (c): uniform attention (W = 0) is sufficient to push V in the direction of P",
            "tests claim (c) of the decision-list abstract (no figure in the paper)",
            fixed={"model.init_std": "its rows are labelled by --sigmas, which sets it",
                   **{f"data.{k}": "λ_max(0), and so η = 1/λ_max(0), is computed for the setting's L, n, M and "
                                   "sampler B, which its claims name" for k in ("L", "n", "M", "sampler")},
                   "optim.groups.all.momentum": "its GD runs are plain gradient descent at η = 1/λ_max(0)"}),
    },
    exports={
        "models": {"DecisionListModel": "tdyn.papers.decision_list.model", "DecisionListModelConfig": "tdyn.papers.decision_list.model"},
        "data": {"DecisionListTask": "tdyn.papers.decision_list.data"},
    },
    aliases={
        "tdyn.data.decision_list": "tdyn.papers.decision_list.data",
        "tdyn.models.decision_list": "tdyn.papers.decision_list.model",
        "tdyn.tasks.decision_list": "tdyn.papers.decision_list.task",
        "tdyn.probes.decision_list": "tdyn.papers.decision_list.probes",
        "tdyn.theory.decision_list": "tdyn.papers.decision_list.theory",
    },
)
