"""The real-text figures are drawn from their tables alone: Fig 10's (draw_entropy_vs_lr) with the settings in
the title, QUICK for quick runs, and the separate-rate panels set apart as beyond the paper; Fig 7's maps
(draw_attention_maps) from attention_maps.csv with a colour bar. Text readable at page width."""

import matplotlib
import matplotlib.text
import numpy as np
import pytest

from tdyn.papers.real_text import attention_maps as am
from tdyn.papers.real_text import entropy_vs_lr as ev
from tdyn.papers.real_text.analysis import CORPORA
from tdyn.runs import write_csv


@pytest.fixture
def drawn(monkeypatch):
    from tdyn.report import style

    figs = []

    def save(fig, path):
        figs.append(fig)
        fig.savefig(path)

    monkeypatch.setattr(style, "save", save)
    yield figs
    for f in figs:
        matplotlib.pyplot.close(f)


def _readable(fig, size=12):
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_text().strip() and t.get_visible():
            assert t.get_fontsize() >= size, t.get_text()


def _fig10_tables(out, steps):
    final, curves, ratio = [], [], []
    for corpus in CORPORA:
        for seed in (1, 2, 3):
            for e in (1.0, 2.0, 3.0, 4.0, 5.0):
                h = 2.5 - 0.2 * e + 0.01 * seed
                final.append({"corpus": corpus, "seed": seed, "all": e, "entropy": h, "val_loss": 5.0})
                curves += [{"corpus": corpus, "eta": e, "seed": seed, "step": s, "entropy": 2.6 - (2.6 - h) * s / steps,
                            "val_loss": 5.0} for s in range(0, steps + 1, steps // 10)]
            for z in (1.0, 3.0):
                for q in (1.0, 2.0, 5.0):
                    ratio.append({"corpus": corpus, "seed": seed, "Z": z, "Y": z * q, "ratio": q,
                                  "entropy": 2.0 - 0.3 * z + 0.05 * q, "val_loss": 5.0})
    write_csv(out / "final_entropy.csv", final, ev.FINAL_COLS)
    write_csv(out / "entropy_curves.csv", curves, ev.CURVE_COLS)
    write_csv(out / "ratio.csv", ratio, ev.RATIO_COLS)


@pytest.mark.parametrize("quick", [True, False])
def test_fig10_figure_from_tables(tmp_path, drawn, quick):
    steps = 150 if quick else 5000
    _fig10_tables(tmp_path, steps)
    path = ev.draw_entropy_vs_lr(tmp_path, quick=quick, note="(float32 on cuda)")
    assert path == tmp_path / "entropy_vs_lr.png" and path.stat().st_size > 0
    (fig,) = drawn
    paper, beyond = fig.subfigs
    title = paper._suptitle.get_text()
    assert "Fig 10" in title and f"{steps} steps" in title and "(float32 on cuda)" in title
    if quick:
        assert "QUICK run: 150 steps, vocabulary 2,000, d = 64, 3 seeds" in title
    else:
        assert "QUICK" not in title and "vocabulary 20,000, d = 200" in title
    # Fig 10's panels (final entropy vs η; entropy over training) apart from the separate-rate ones, which say
    # they are beyond the paper
    assert all("η_Y / η_Z" not in ax.get_xlabel() for ax in paper.axes)
    assert all("η_Y / η_Z" in ax.get_xlabel() for ax in beyond.axes) and len(beyond.axes) == len(CORPORA)
    assert "BEYOND THE PAPER" in beyond._suptitle.get_text()
    # the every-step reading between neighbouring η: each step here falls by 0.2 with no seed spread
    marks = [t.get_text() for ax in paper.axes for t in ax.texts]
    assert marks == ["✓"] * 4 * len(CORPORA)
    _readable(fig)


def test_fig10_figure_reads_the_settings_note(tmp_path, drawn):
    _fig10_tables(tmp_path, 150)
    (tmp_path / "results.json").write_text('{"quick": true, "settings_note": "quick settings (--set seeds=[1,2,3]); '
                                           'claims re-judged from this directory\'s CSVs (--from-tables)"}')
    ev.draw_entropy_vs_lr(tmp_path)
    title = drawn[0].subfigs[0]._suptitle.get_text()
    assert "QUICK run: 150 steps" in title and "(--set seeds=[1,2,3])" in title and "re-judged" not in title


@pytest.mark.parametrize("quick", [True, False])
def test_attention_maps_figure_from_tables(tmp_path, drawn, quick):
    maps, ent = [], []
    rng = np.random.default_rng(0)
    for L in (1, 3):
        for s in (0, 500, 1000, 1500):
            A = np.tril(rng.random((35, 35)))
            A /= A.sum(1, keepdims=True)
            maps += [{"n_layers": L, "step": s, "query": q, "key": k, "weight": A[q, k]}
                     for q in range(35) for k in range(35)]
        ent += [{"n_layers": L, "step": s, "val_loss": 5.0, "entropy_layer0": 2.6 - s / 1000} for s in range(0, 1501, 50)]
    write_csv(tmp_path / "attention_maps.csv", maps, am.MAP_COLS)
    write_csv(tmp_path / "entropy.csv", ent, ["n_layers", "step", "val_loss", "entropy_layer0"])
    path = am.draw_attention_maps(tmp_path, quick=quick)
    assert path == tmp_path / "attention_maps.png" and path.stat().st_size > 0
    (fig,) = drawn
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 8
    bars = [ax for ax in fig.axes if not ax.images and "attention weight" in ax.get_ylabel()]
    assert len(bars) == 1, "one colour bar for every map"
    assert images[1].get_title() == "1 layer, iter. 500\nval. entropy 2.10 nats (batch mean)"
    assert ("QUICK run (240 steps" in fig._suptitle.get_text()) == quick
    assert np.allclose(images[0].images[0].get_array().sum(1), 1.0)
    _readable(fig)
