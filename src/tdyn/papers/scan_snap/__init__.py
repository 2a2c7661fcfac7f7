"""Scan and Snap (Tian, Wang, Chen, Du, NeurIPS 2023): next-token prediction with a one-layer attention
+ decoder (the Y/Z model), the theory's closed forms, and the synthetic Syn-Small / Syn-Medium data.

The package: ``data`` (the distribution), ``model`` (the equations), ``task`` (data wired to the model),
``probes``, ``theory``, the reproductions, and this manifest (read without importing any of them)."""

from tdyn.manifest import Paper, Reproduction

#: the Syn-Medium keys that the Fig 6 sweep's panels (labelled by M), its dip cells and the descent thresholds are laid
#: out for
_SYN_MEDIUM = {k: "its panels, dip cells and descent thresholds are laid out for Syn-Medium's sequence classes"
               for k in ("data.num_next_per_last", "data.num_unique_per_next", "data.num_common")}
_SYN_SMALL = {k: "its maps are laid out as Syn-Small's tokens (10 common | 10 distinct per class) and its claims "
                 "read that layout (Fig 5's ≥ 10% share is 1/10 of the distinct tokens)"
              for k in ("data.num_last", "data.num_next_per_last", "data.num_unique_per_next", "data.num_common",
                        "data.num_common_per_last")}

MANIFEST = Paper(
    name="scan_snap", prefix="scan-snap", label="Tian et al. 2023",
    title="Tian, Wang, Chen, Du 2023 — Scan and Snap (NeurIPS 2023)",
    docs="scan-snap.md",
    tasks={
        "scan_snap": "tdyn.papers.scan_snap.task",
    },
    probes={
        "scan_snap.attention": "tdyn.papers.scan_snap.probes",
        "scan_snap.decoder": "tdyn.papers.scan_snap.probes",
        "scan_snap.attention_entropy": "tdyn.papers.scan_snap.probes",
    },
    benches={
        "scan_snap_single": "tdyn.papers.scan_snap.bench",
        "scan_snap_ensemble32": "tdyn.papers.scan_snap.bench",
        "scan_snap_member_steps": "tdyn.papers.scan_snap.bench",
        "plain_vs_handwritten_yz": "tdyn.papers.scan_snap.bench",
        "startup": "tdyn.papers.scan_snap.bench",
        "allocation": "tdyn.papers.scan_snap.bench",
        "fig6_sweep": "tdyn.papers.scan_snap.bench",
    },
    reproductions={
        "scan-snap/fig3": Reproduction("tdyn.papers.scan_snap.theory_figures",
            "χ_l(t) (Thm 4): smaller η_Y → later snap time t₀ and larger final χ",
            "reproduces Fig 3 of Tian et al. 2023"),
        "scan-snap/fig8": Reproduction("tdyn.papers.scan_snap.theory_figures",
            "h*(s) (Lemma 5 recursion) vs h(s) (Lemma 6 ODE): 0 ≤ h* − h ≤ 2η_Y/M, gap → 0",
            "reproduces Fig 8 of Tian et al. 2023",
            unshipped={"fig8.csv": "30,000 curve points, 2.3 MB; `tdyn reproduce scan-snap/fig8` makes them in "
                                   "seconds (no training)"}),
        "scan-snap/fig9": Reproduction("tdyn.papers.scan_snap.theory_figures",
            "B_n(t) at fixed ν = η_Y/η_Z (Thm 4): B_n(t₀) is the same for every η_Z",
            "reproduces Fig 9 of Tian et al. 2023"),
        "scan-snap/fig4": Reproduction("tdyn.papers.scan_snap.fig4_fig5",
            "Syn-Small c_n maps: attention scans onto the top distinct token; η_Y=10 gives a denser map",
            "reproduces Fig 4 of Tian et al. 2023",
            fixed={"model.init": "zero init: its claims read the step-0 loss as exactly ln M",
                   "ensemble.lrs": "its runs are labelled and compared as η_Y ∈ {1, 10} at η_Z = 1", **_SYN_SMALL}),
        "scan-snap/fig5": Reproduction("tdyn.papers.scan_snap.fig4_fig5",
            "Syn-Small with Adam, η ∈ {0.1, 0.5, 1}: different rates pick different distinct tokens",
            "reproduces Fig 5 of Tian et al. 2023",
            fixed={**{f"optim.groups.{g}.optimizer": "Fig 5 is the paper's Adam run" for g in "YZ"}, **_SYN_SMALL,
                   "seeds": "its seeds are --seed and the two after it (its map shows seed --seed): use --seed N"}),
        "scan-snap/fig6": Reproduction("tdyn.papers.scan_snap.fig6",
            "Syn-Medium sweep (640 runs at full settings): distinct-token entropy vs η_Y/η_Z per η_Z — larger η_Z sparser; rises past ratio ≈ 2",
            "reproduces Fig 6 of Tian et al. 2023", fixed=_SYN_MEDIUM),
        "scan-snap/fig11-12": Reproduction("tdyn.papers.scan_snap.fig6",
            "Recall of distinct tokens vs attention threshold from the Fig 6 sweep's final weights: smaller ratio or larger η_Z → sparser, read from the descent rate",
            "reproduces Figs 11 and 12 of Tian et al. 2023", reuses="scan-snap/fig6", fixed=_SYN_MEDIUM),
        "scan-snap/thm3": Reproduction("tdyn.papers.scan_snap.thm3",
            "Thm 3 invariant (1 − e^{−2z})/P(l|n)² equal across a class's distinct tokens (long sequences, plain SGD)",
            "tests Theorem 3 of Tian et al. 2023 (no figure in the paper)",
            fixed={"model.init": "Theorem 3's z(0) = 0: zero init (the invariant is measured from Z = 0)",
                   **{f"optim.groups.{g}.optimizer": "Theorem 3 is stated for SGD" for g in "YZ"}}),
        "scan-snap/snap-time": Reproduction("tdyn.papers.scan_snap.snap_time",
            "Decoder switch vs t'₀ = K ln M/η_Y and attention snap (B_n leaving its scan law) vs t₀ = 2K ln M/η_Y, in Thm 4's setting and on the paper's Syn-Medium data",
            "beyond the paper: Theorem 4's times t₀ and t′₀ of Tian et al. 2023 measured in training (no paper figure)",
            fixed={"model.init": "Theorem 4's setting: zero init",
                   "seeds": "its seeds are --seed and the ones after it (its curves are seed --seed's): use --seed N",
                   **{f"optim.groups.{g}.{k}": "Theorem 4's setting: plain SGD" for g in "YZ"
                      for k in ("optimizer", "momentum")}}),
    },
    exports={
        "models": {"YZModel": "tdyn.papers.scan_snap.model", "YZConfig": "tdyn.papers.scan_snap.model"},
        "data": {"ScanSnapDataConfig": "tdyn.papers.scan_snap.data", "SequenceClasses": "tdyn.papers.scan_snap.data"},
    },
    aliases={
        "tdyn.data.scan_snap": "tdyn.papers.scan_snap.data",
        "tdyn.models.yz": "tdyn.papers.scan_snap.model",
        "tdyn.tasks.scan_snap": "tdyn.papers.scan_snap.task",
        "tdyn.probes.scan_snap": "tdyn.papers.scan_snap.probes",
        "tdyn.theory.scan_snap": "tdyn.papers.scan_snap.theory",
    },
)
