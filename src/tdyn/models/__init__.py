"""The papers' models, plain ``nn.Module``s with a leading ensemble axis (nanoGPT style), and
``Stacked`` (any ``nn.Module`` as an ensemble), and ``activations`` (the models' named intermediate tensors:
``run_with_cache``, ``capture``; docs/activations.md). Imported by name, lazily:
``from tdyn.models import YZModel, TopicTransformer, DecisionListModel``; each paper's manifest
(:mod:`tdyn.papers`) names its models' module (``tdyn/papers/<paper>/model.py``)."""

from tdyn import papers
from tdyn.lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {**papers.exports("models"), "Stacked": ".stacked", "activations": ".",
                                                     "run_with_cache": ".activations", "capture": ".activations"})
