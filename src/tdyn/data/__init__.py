"""The papers' distributions, by name, lazily: ``from tdyn.data import SequenceClasses, LdaDataset,
DecisionListTask``; each paper's manifest (:mod:`tdyn.papers`) names its distribution's module
(``tdyn/papers/<paper>/data.py``)."""

from tdyn import papers
from tdyn.lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, papers.exports("data"))
