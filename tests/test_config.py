"""Config validation and overrides: bad input exits 2 with one line naming key, value, allowed values."""

import json

import pytest

from tdyn.config import apply_overrides, load_config
from tdyn.errors import ConfigError

CFG = "syn_small"


@pytest.mark.parametrize("override, expected", [
    ("optim.groups.Y.lrr=3", ["optim.groups.Y.lrr", "allowed keys", "lr"]),
    ("optim.groups.Y.lr=abc", ["optim.groups.Y.lr", '"abc"', "number"]),
    ("optim.groups.Y.lr=-1", ["optim.groups.Y.lr", "-1", "greater than 0"]),
    ("data.seq_len=1", ["data.seq_len", "1", "greater than or equal to 2"]),
    ("dtype=float16", ["dtype", "float16", "'float32' or 'float64'"]),
    ("optim.groups.Z.optimizer=rmsprop", ["optim.groups.Z.optimizer", "rmsprop", "'sgd', 'adam' or 'adamw'"]),
    ("data.foo=1", ["data.foo", "allowed keys", "num_last"]),
    ("task=nope", ["nope", "allowed", "scan_snap"]),
])
def test_cli_config_errors(cli, tmp_path, override, expected):
    r = cli("run", CFG, "--out", tmp_path / "r", "--set", override)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for e in expected:
        assert e in lines[0], lines[0]
    assert not (tmp_path / "r").exists()


def test_cli_missing_file_and_unknown_experiment(cli, tmp_path):
    for src in ("nope.yaml", "no/such-experiment"):
        r = cli("run", src, "--out", tmp_path / "r")
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_overrides_are_typed():
    cfg = load_config(CFG, ["seeds=1,2,3", "optim.groups.Z.lr=10", "data.seq_len=64",
                            "optim.freeze.Z.until=5", "ensemble.lrs=[{Y: 1}, {Y: 2}]"])
    assert cfg.seeds == [1, 2, 3]
    assert cfg.optim.groups["Z"].lr == 10.0
    assert cfg.data["seq_len"] == 64
    assert cfg.optim.freeze["Z"].frozen(4) and not cfg.optim.freeze["Z"].frozen(5)
    assert cfg.ensemble.lrs == [{"Y": 1.0}, {"Y": 2.0}]


def test_resolved_config_is_saved(tmp_path):
    from tdyn.train.trainer import train

    cfg = load_config(CFG, ["optim.steps=3"])
    (d,) = train(cfg, tmp_path / "r", progress=False)
    saved = json.loads((d / "config.json").read_text())
    assert saved["data"]["num_common"] == 10          # defaults are filled in
    assert load_config(saved) == cfg


def test_override_shadowed_by_ensemble_lrs_is_an_error():
    """A group's lr that ensemble.lrs sets per member would be unused: an error, never dropped."""
    with pytest.raises(ConfigError, match="shadowed by ensemble.lrs"):
        load_config(CFG, ["optim.groups.Y.lr=10", "ensemble.lrs=[{Y: 1}, {Y: 2}]"])


def test_unknown_group_in_ensemble_lrs():
    with pytest.raises(ConfigError, match="unknown group 'X'"):
        load_config(CFG, ["ensemble.lrs=[{X: 1}]"])


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["seeds"])
