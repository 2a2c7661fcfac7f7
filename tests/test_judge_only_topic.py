"""The topic reproductions, written as phases, are judged again from their tables alone: ``tdyn reproduce NAME
--judge-only`` on a quick run's output, its run directories removed, gives the same claims and numbers and draws
the figures again (one reproduction per family whose quick run is short: E1, E3, E6)."""

import pytest
from judging import judged_again


@pytest.mark.parametrize("name", ["topic/embeddings", "topic/stage2", "topic/squared-loss"])
def test_judge_only_gives_the_same_results(cli, tmp_path, name):
    out = tmp_path / name.replace("/", "__")
    r = cli("reproduce", name, "--quick", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    judged_again(cli, name, out)
