"""The one registry helper: duplicate names refused, one-line errors listing the allowed names, and
an explicit name -> module table imported only on lookup."""

import sys

import pytest

from tdyn.errors import ConfigError, UserError
from tdyn.registry import Registry


def test_register_get_items():
    r = Registry("widget")
    r.register("b", 2)
    r.decorator("a")(1)
    assert r.get("a") == 1 and r.items() == {"a": 1, "b": 2} and r.names() == ["a", "b"] and "a" in r
    with pytest.raises(RuntimeError, match="registered twice"):
        r.register("a", 3)
    with pytest.raises(UserError, match=r"^unknown widget 'c'; allowed: a, b$"):
        r.get("c")
    r2 = Registry("probe", error=ConfigError, label="probes.names")
    with pytest.raises(ConfigError, match=r"^probes.names: unknown probe 'x'"):
        r2.get("x")


def test_table_is_imported_on_lookup_only(monkeypatch):
    from tdyn.tasks import TASKS

    monkeypatch.delitem(TASKS._items, "corpus_lm", raising=False)
    monkeypatch.delitem(sys.modules, "tdyn.papers.real_text.task", raising=False)
    TASKS.get("scan_snap")
    assert "tdyn.papers.real_text.task" not in sys.modules
    assert TASKS.get("corpus_lm").name == "corpus_lm"
    assert "tdyn.papers.real_text.task" in sys.modules
