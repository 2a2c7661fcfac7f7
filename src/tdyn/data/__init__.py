"""The papers' distributions, one module per distribution (``scan_snap``, ``lda``, ``decision_list``,
``corpora``, ``real_topics``); the main types by name, lazily:
``from tdyn.data import SequenceClasses, LdaDataset, DecisionListTask``."""

from tdyn.lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "ScanSnapDataConfig": ".scan_snap", "SequenceClasses": ".scan_snap",
    "LdaDataConfig": ".lda", "LdaDataset": ".lda", "MlmBatch": ".lda",
    "DecisionListTask": ".decision_list",
    "VocabSettings": ".corpora", "TokenData": ".corpora", "load_tokens": ".corpora",
})
