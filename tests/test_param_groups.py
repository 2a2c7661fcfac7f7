"""Parameter groups by pattern and a default group (issue 37 item 4): ``optim.groups.<g>.params`` entries are
names or fnmatch patterns, ``"*"`` the default group; exact names win, two groups' patterns on one parameter are
an error, as is a pattern that matches nothing. A model trained through patterns equals the one listed by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from test_plain_module import GROUPS, net_config
from tdyn import runs
from tdyn.config import GroupConfig
from tdyn.errors import ConfigError
from tdyn.train.optim import assign_groups
from tdyn.train.trainer import train

NAMES = ["lin__weight", "lin__bias", "ln__weight", "ln__bias", "out__weight", "out__bias"]


def _g(**groups):
    return {g: GroupConfig(params=ps, lr=0.1) for g, ps in groups.items()}


@pytest.mark.parametrize("groups,expect", [
    (dict(all=["*"]), {n: "all" for n in NAMES}),
    (dict(head=["out__*"], body=["*"]), {n: "head" if n.startswith("out") else "body" for n in NAMES}),
    (dict(bias=["*bias"], rest=["*"], ln=["ln__bias"]),          # the exact name wins over the pattern
     {n: "ln" if n == "ln__bias" else "bias" if n.endswith("bias") else "rest" for n in NAMES}),
    (dict(w=["*weight"], b=["*__bias"]), {n: "w" if n.endswith("weight") else "b" for n in NAMES}),
    (dict(lin=["lin__?eight", "lin__bias"]), {"lin__weight": "lin", "lin__bias": "lin"}),   # the rest: in no group
])
def test_patterns_and_the_default_group(groups, expect):
    assert assign_groups(NAMES, _g(**groups)) == expect


@pytest.mark.parametrize("groups,message", [
    (dict(a=["*"], b=["*"]), "'a' and 'b' both list '\\*' \\(the default group\\)"),
    (dict(a=["lin__*"], b=["*weight"]), "pattern '\\*weight' matches 'lin__weight', which a pattern of group 'a'"),
    (dict(a=["emb*"]), "pattern 'emb\\*' matches no parameter"),
    (dict(a=["lin__weight"], b=["lin__weight"]), "parameter 'lin__weight' is already in group 'a'"),
    (dict(a=["nope"]), "unknown parameter 'nope'"),
])
def test_ambiguous_or_empty_entries_are_one_line(groups, message):
    with pytest.raises(ConfigError, match=message):
        assign_groups(NAMES, _g(**groups))


def test_a_plain_model_trained_through_patterns_equals_the_listed_one(tmp_path):
    listed = net_config()
    patterned = net_config()
    patterned["optim"] = dict(listed["optim"], groups={
        "head": dict(listed["optim"]["groups"]["head"], params=["out__*"]),
        "body": dict(listed["optim"]["groups"]["body"], params=["*"])})
    assert set(GROUPS["body"]) | set(GROUPS["head"]) == set(NAMES)
    (a,) = train(listed, tmp_path / "listed", progress=False)
    (b,) = train(patterned, tmp_path / "patterned", progress=False)
    assert runs.read_metrics(a) == runs.read_metrics(b)
    ca, cb = load_file(a / "checkpoints" / "final.safetensors"), load_file(b / "checkpoints" / "final.safetensors")
    assert all(torch.equal(ca[k], cb[k]) for k in ca)
