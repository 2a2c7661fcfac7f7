"""Fig 10 (``real/entropy-vs-lr``) trained in float32 against bf16 autocast: the same reproduction run
twice, the second with ``--set autocast=bfloat16``, compared cell by cell and claim by claim.

    python benchmarks/fig10_bf16_vs_fp32.py FP32_OUT BF16_OUT DEST [LABEL_A LABEL_B]

reads each output directory's ``final_entropy.csv``, ``ratio.csv`` and ``results.json`` and writes
``DEST.csv`` (per corpus and cell: seeds, mean final entropy in each precision, their difference, the
float32 seeds' standard error, the difference in those standard errors, the largest difference of one
seed's pair) and ``DEST_verdicts.csv`` (each claim's verdict in both precisions). The two runs must
have trained the same seeds and cells (checked). This is how the ``quick_*bf16_vs_fp32*.csv`` files in
docs/results/real__entropy-vs-lr/ are made. Any two runs of the same cells compare the same way, named
by LABEL_A and LABEL_B (default fp32 and bf16) in the columns: ``cuda_fp32`` against ``cpu_fp32`` made
``quick_5seeds_cuda_fp32_vs_cpu_fp32*.csv``.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

from tdyn import runs


def _cells(out: Path) -> dict[tuple[str, str, str], dict[int, float]]:
    """(corpus, panel, cell) → {seed: final entropy} from one reproduction's CSVs."""
    cells: dict[tuple[str, str, str], dict[int, float]] = {}
    with (out / "final_entropy.csv").open() as f:
        for r in csv.DictReader(f):
            key = (r["corpus"], "eta", f"eta={float(r['all']):g}")
            cells.setdefault(key, {})[int(r["seed"])] = float(r["entropy"])
    with (out / "ratio.csv").open() as f:
        for r in csv.DictReader(f):
            key = (r["corpus"], "ratio", f"eta_Z={float(r['Z']):g},ratio={float(r['ratio']):g}")
            cells.setdefault(key, {})[int(r["seed"])] = float(r["entropy"])
    return cells


def compare(fp32: Path, bf16: Path, dest: Path, la: str = "fp32", lb: str = "bf16") -> tuple[Path, Path]:
    if la == lb:
        raise SystemExit(f"the two labels must differ (both {la!r}): they name the columns")
    a, b = _cells(fp32), _cells(bf16)
    if a.keys() != b.keys():
        raise SystemExit(f"the two runs trained different cells: {sorted(a.keys() ^ b.keys())[:3]}")
    rows = []
    for key in a:
        if a[key].keys() != b[key].keys():
            raise SystemExit(f"cell {key}: seeds {sorted(a[key])} in {fp32} but {sorted(b[key])} in {bf16}")
        seeds = sorted(a[key])
        xa, xb = [a[key][s] for s in seeds], [b[key][s] for s in seeds]
        ma, mb = statistics.fmean(xa), statistics.fmean(xb)
        diff = mb - ma
        se = statistics.stdev(xa) / math.sqrt(len(xa)) if len(xa) > 1 else math.nan   # the seeds' standard error
        rows.append({"corpus": key[0], "panel": key[1], "cell": key[2], "seeds": len(seeds),
                     f"{la}_mean": f"{ma:.5g}", f"{lb}_mean": f"{mb:.5g}", f"{lb}_minus_{la}": f"{diff:.5g}",
                     f"{la}_seed_se": f"{se:.5g}", "diff_over_se": f"{diff / se:.5g}" if se > 0 else "nan",
                     "max_abs_paired_diff": f"{max(abs(p - q) for p, q in zip(xa, xb)):.5g}"})
    cols = ["corpus", "panel", "cell", "seeds", f"{la}_mean", f"{lb}_mean", f"{lb}_minus_{la}", f"{la}_seed_se",
            "diff_over_se", "max_abs_paired_diff"]
    va = {c["id"]: c["verdict"] for c in runs.read_json(fp32 / runs.RESULTS)["claims"]}
    vb = {c["id"]: c["verdict"] for c in runs.read_json(bf16 / runs.RESULTS)["claims"]}
    verdicts = [{"claim": k, la: va[k], lb: vb.get(k, "missing")} for k in va]
    return (runs.write_csv(f"{dest}.csv", rows, cols),
            runs.write_csv(f"{dest}_verdicts.csv", verdicts, ["claim", la, lb]))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 6):
        raise SystemExit(__doc__.split("\n\n")[1].strip())
    for p in compare(*map(Path, sys.argv[1:4]), *sys.argv[4:]):
        print(p)
