#!/usr/bin/env bash
# Full-setting evidence of the reproductions too slow for the 2-core CPU, made on a lent GPU machine
# (16 CPU cores and one GPU): every named reproduction in its own process, all at once, each capped at
# CAP seconds. Run from the repository root there, with .devdata/ carried (benchmarks/gpu_devdata.sh).
# What finished comes back under $OUT as evidence.tar.gz (each reproduction's directory without its
# runs/), the logs as logs.tar.gz; here, `bash benchmarks/device_evidence.sh unpack DIR` puts them into
# docs/results/ with a provenance.json each.
#
#   bash benchmarks/device_evidence.sh run CAP NAME[@cuda] ...   # NAME@cuda trains on the GPU, else CPU
#   bash benchmarks/device_evidence.sh unpack FILES_DIR          # here: FILES_DIR holds evidence.tar.gz
# A dry run on a CPU machine: PY=.venv/bin/python WHEELS=no EXTRA=--quick bash benchmarks/device_evidence.sh run 60 topic/stage1
set -u
mode=${1:?run or unpack}
slug() { echo "${1//\//__}"; }

if [ "$mode" = unpack ]; then
  src=${2:?the directory holding evidence.tar.gz}
  t=$(mktemp -d)
  tar xzf "$src/evidence.tar.gz" -C "$t" || exit 1
  for d in "$t"/*/; do
    s=$(basename "$d")
    [ -f "$d/results.json" ] || { echo "skip $s: no results.json"; continue; }
    rm -rf "docs/results/$s" && mkdir -p "docs/results/$s" && cp -r "$d"/. "docs/results/$s/"
    echo "docs/results/$s"
  done
  rm -rf "$t"
  exit 0
fi
[ "$mode" = run ] || { echo "device_evidence.sh: mode must be run or unpack, not $mode" >&2; exit 2; }
cap=${2:?CAP seconds}; shift 2
case $cap in ''|*[!0-9]*) echo "device_evidence.sh: CAP must be a whole number, not $cap" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/device_out}
W=${W:-/tmp/tdyn_device_evidence}
rm -rf "$W" && mkdir -p "$W/logs" "$OUT"
if [ "${WHEELS:-yes}" = yes ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devdata/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD/.devdata/site TDYN_CACHE=$PWD/.devdata/cache
fi
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 TDYN_THREADS=${TDYN_THREADS:-2} MPLBACKEND=Agg
stamp() { echo "[$(date +%T)] $*"; }
finish() {
  ( cd "$W" && tar czf "$OUT/logs.tar.gz" logs )
  have=(); for d in "$W"/*/; do [ -f "$d/results.json" ] && have+=("$(basename "$d")"); done
  [ ${#have[@]} -gt 0 ] && tar czf "$OUT/evidence.tar.gz" -C "$W" --exclude=runs --exclude='.tdyn.lock' "${have[@]}"
  stamp "finished: ${have[*]:-none}"
}
trap finish EXIT
trap 'exit 143' TERM
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
"$PY" -c "import sys, torch, os; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cpus', os.cpu_count(), torch.cuda.is_available() and torch.cuda.get_device_name())"
git log -1 --format='commit %H' 2>/dev/null
for spec in "$@"; do
  name=${spec%@*}; dev=cpu; [ "$spec" != "$name" ] && dev=${spec#*@}
  s=$(slug "$name")
  stamp "start $name on $dev"
  ( a=$(date +%s)
    timeout "$cap" "$PY" -m tdyn reproduce "$name" --out "$W/$s" --device "$dev" --quiet ${EXTRA:-} > "$W/logs/$s.log" 2>&1
    echo "rc=$? wall_s=$(( $(date +%s) - a )) device=$dev" >> "$W/logs/$s.log" ) &
done
wait
for f in "$W"/logs/*.log; do echo "== $(basename "$f")"; tail -n 3 "$f"; done
