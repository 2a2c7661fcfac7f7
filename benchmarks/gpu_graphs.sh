#!/usr/bin/env bash
# Issue 35 item 6 on a lent GPU (benchmarks/README.md#cuda-graphs): the CUDA-graph step's tests (real graphs
# against the eager CUDA step, bit for bit), where a graph step's time goes (benchmarks/gpu_graph_profile.py),
# and `tdyn bench --device cuda` of the entries the graphs change. Run from the repository root on that
# machine with .devdata/whl (pydantic) and .devdata/whl_test (pytest) carried (benchmarks/gpu_devdata.sh makes
# the first; the second is `pip download pytest pluggy iniconfig packaging pygments`). Writes under $OUT.
# FIG6=yes (default): also the full Fig 6 reproduction with cuda_graph and draw_on_device (its tables and verdicts).
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
stamp() { echo "[$(date +%T)] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .devdata/whl/*.whl .devdata/whl_test/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
stamp "tests/test_cuda_graphs.py"
CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout "${T_TEST:-180}" python3 -m pytest -p no:cacheprovider -rA -s tests/test_cuda_graphs.py > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?"; grep -E "fell back|passed|failed|FAILED|Error" "$OUT/pytest.txt" | tail -30
[ "${PROFILE:-yes}" = yes ] && {
stamp "profile"
timeout "${T_PROF:-170}" python3 benchmarks/gpu_graph_profile.py "${NSTEP:-150}" 2>&1 | tee "$OUT/profile.jsonl" | tail -22
}
stamp "tdyn bench --device cuda"
timeout "${T_BENCH:-230}" python3 -m tdyn bench --device cuda --only scan_snap_member_steps --only fig6_sweep \
  ${BENCH_MORE:---only scan_snap_single} --out "$OUT/bench-cuda.json" --force 2>&1 | tail -12
[ "${FIG6:-yes}" = yes ] && {
stamp "tdyn reproduce scan-snap/fig6 --device cuda, graphs, batches drawn on the GPU"
timeout "${T_FIG6:-120}" python3 -m tdyn reproduce scan-snap/fig6 --device cuda --set cuda_graph=true \
  --set draw_on_device=true --out /tmp/fig6-device --force 2>&1 | tail -8
mkdir -p "$OUT/fig6-device" && cp /tmp/fig6-device/*.json /tmp/fig6-device/*.csv /tmp/fig6-device/*.png "$OUT/fig6-device/"
}
stamp done
