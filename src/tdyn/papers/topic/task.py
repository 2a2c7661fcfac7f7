"""The topic-structure task (Li, Li & Risteski, ICML 2023): masked LM on LDA documents
(``tdyn.papers.topic.data``) with the one-layer topic transformer (``tdyn.papers.topic.model``). Config sections:
``data`` = :class:`LdaDataConfig`, ``model`` = :class:`TopicModelConfig`.
"""

from __future__ import annotations

import functools

from tdyn.papers.topic.data import NUM_SPECIAL, LdaDataConfig, LdaDataset
from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer, member_size
from tdyn.tasks.base import Member, Task, register_task
from tdyn.seeding import generator


@functools.lru_cache(maxsize=2)
def _dataset(data_json: str) -> LdaDataset:
    return LdaDataset(LdaDataConfig.model_validate_json(data_json))


def dataset(cfg: LdaDataConfig) -> LdaDataset:
    """The documents and static masks of ``cfg`` (cached: a reproduction and its runs share them)."""
    return _dataset(cfg.model_dump_json())


def build_model(data_cfg: LdaDataConfig, model_cfg: TopicModelConfig, S: int = 1) -> TopicTransformer:
    return TopicTransformer(model_cfg, data_cfg.vocab_size, data_cfg.words_per_topic, NUM_SPECIAL, S=S)


class LdaMlmTask(Task):
    def __init__(self, cfg, members: list[Member]):
        self.data_cfg = LdaDataConfig.model_validate(cfg.data)
        self.ds = dataset(self.data_cfg)
        self.model = build_model(self.data_cfg, TopicModelConfig.model_validate(cfg.model), len(members))
        self.model.reset_parameters([generator(m.seed, "init") for m in members], [m.init_scale for m in members])
        layer0 = lambda W: (W if self.model.cfg.n_layers == 1 else W[:, 0]).detach().clone()  # noqa: E731
        self.facts = {"W_V0": layer0(self.model.W_V), "words_per_topic": self.data_cfg.words_per_topic,
                      "num_special": NUM_SPECIAL}
        if getattr(self.model, "W_K", None) is not None:      # the initial W_K, W_Q: ‖ΔW_K‖, ‖ΔW_Q‖ (topic.norms)
            self.facts |= {"W_K0": layer0(self.model.W_K), "W_Q0": layer0(self.model.W_Q)}

    def sample(self, gen):
        return self.ds.sample(gen)

    def loss(self, batch):
        return self.model.loss(batch["tokens"], batch["labels"], batch["keys"])

    def probe_batch(self, gen):
        return self.ds.probe_batch()


def _size(cfg) -> int:
    return member_size(cfg.typed_model(), cfg.typed_data().vocab_size)


@register_task("lda_mlm", LdaDataConfig, TopicModelConfig, "masked LM on LDA documents with the one-layer model",
               size=_size)
def _build(cfg, members):
    return LdaMlmTask(cfg, members)


QUICK_DATA = {"num_train": 2000, "num_dev": 500, "num_test": 10, "probe_docs": 100}
PROBES = ["topic.norms", "topic.attention", "topic.blocks", "topic.dev_loss"]


def param_names(model: dict) -> list[str]:
    m = build_model(LdaDataConfig(num_train=1, num_dev=1, num_test=1), TopicModelConfig.model_validate(model))
    return [n for n, _ in m.named_parameters()]


def lda_config(model: dict, *, data: dict | None = None, steps: int = 3000, optimizer: str = "adam",
               lr: float = 0.01, seeds=(0, 1, 2), every: int = 50, quick: bool = False) -> dict:
    """A run config: the authors' defaults (Adam lr 0.01, batch 40, docs/reproductions/topic.md#training-defaults),
    one parameter group."""
    group = {"params": param_names(model), "optimizer": optimizer, "lr": lr}
    return {"task": "lda_mlm", "data": (QUICK_DATA if quick else {}) | (data or {}), "model": dict(model),
            "seeds": list(seeds), "optim": {"steps": steps, "groups": {"all": group}},
            "probes": {"names": PROBES, "every": every}, "checkpoint": {"schedule": "log", "num": 8}}
