"""The papers' models, plain ``nn.Module``s with a leading ensemble axis (nanoGPT style), and
``Stacked`` (any ``nn.Module`` as an ensemble). Imported by name, lazily:
``from tdyn.models import YZModel, TopicTransformer, DecisionListModel``."""

from tdyn.lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "YZModel": ".yz", "YZConfig": ".yz",
    "TopicTransformer": ".topic", "TopicModelConfig": ".topic",
    "DecisionListModel": ".decision_list", "DecisionListModelConfig": ".decision_list",
    "CausalLM": ".lm", "LMConfig": ".lm",
    "Stacked": ".stacked",
})
