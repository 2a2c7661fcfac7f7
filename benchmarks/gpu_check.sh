#!/usr/bin/env bash
# The checks a lent GPU machine runs (benchmarks/README.md#gpu): `tdyn bench --device $DEV` and Fig 10 on
# CUDA. Run from the repository root on that machine, whose image has torch but not pydantic, the corpora
# or their token caches: those travel in .devdata/ (ignored; see benchmarks/README.md#gpu for how it is
# made). Writes what it keeps under $OUT (default /tmp/gpu_out).
#
#   bash benchmarks/gpu_check.sh smoke          # quick Fig 10 (5 seeds) fp32 + bf16, bench, full-size step times
#   bash benchmarks/gpu_check.sh fig10 SECONDS  # the full Fig 10 (PRECS="fp32 bf16" by default), training capped
#                                               # (DEADLINE=N: the analysis stops N s after the script's start)
#                                               # at SECONDS. On the H200 float32 alone took ~490 s of training (4
#                                               # processes at once: 412 s on 2026-11-26; the whole call 469 s)
# A dry run on a CPU machine: DEV=cpu EXTRA="--quick --set optim.steps=3" BENCH_ONLY=topic WHEELS=no.
set -u
set -f   # EXTRA's words (e.g. seeds=[1,2]) are arguments, never glob patterns
mode=${1:?smoke or fig10}
[ "$mode" = smoke ] || [ "$mode" = fig10 ] || { echo "gpu_check.sh: mode must be smoke or fig10, not $mode" >&2; exit 2; }
cap=${2:-300}
case $cap in ''|*[!0-9]*) echo "gpu_check.sh: SECONDS must be a whole number, not $cap" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/gpu_out}
DEV=${DEV:-cuda}
EXTRA=${EXTRA:-}
BENCH_ONLY=${BENCH_ONLY:-startup scan_snap_single scan_snap_ensemble32 plain_vs_handwritten_yz plain_vs_handwritten_topic topic fig6_sweep real_lm_tokens_per_s}
W=${W:-/tmp/tdyn_gpu_check}   # scratch (cleared of an earlier call's outputs)
NSTEP=${NSTEP:-400}
L=$OUT/logs   # at most 8 files come back from a lent machine: the logs go back as one archive
set +f; rm -rf "$L" "$W"/q_* "$W"/s_* "$W"/f_* "$W"/cfg_*; set -f   # a warm machine keeps an earlier call's
mkdir -p "$L" "$W"
finish() { [ -d "$L" ] && tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$L"; stamp done; }
trap finish EXIT   # the logs come back as one archive even when the call's limit stops the script
trap 'exit 143' TERM
if [ "${WHEELS:-yes}" = yes ]; then
  set +f; whl=(.devdata/whl/*.whl); set -f   # globs are switched on only where one is meant
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${whl[@]}" || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD/.devdata/site TDYN_CACHE=$PWD/.devdata/cache
fi
export PYTHONUNBUFFERED=1 TMPDIR=$W
tdyn() { python3 -m tdyn "$@"; }
stamp() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())" || exit 1
prec_args() { [ "$1" = bf16 ] && echo "--set autocast=bfloat16"; echo "$EXTRA"; }

if [ "$mode" = smoke ]; then
  stamp "quick Fig 10, 5 seeds (the settings of docs/results/real__entropy-vs-lr), fp32 and bf16 side by side"
  for p in fp32 bf16; do
    timeout 150 python3 -m tdyn reproduce real/entropy-vs-lr --quick --set 'seeds=[1,2,3,4,5]' $(prec_args $p) \
      --device $DEV --out $W/q_$p --quiet > "$L/quick_$p.log" 2>&1 &
  done
  wait
  set +f; tail -n 4 "$L"/quick_*.log; set -f
  tar czf "$OUT/quick.tar.gz" -C $W --exclude=runs q_fp32 q_bf16 2>/dev/null
  stamp "tdyn bench --device $DEV"
  only=(); for e in $BENCH_ONLY; do only+=(--only "$e"); done
  timeout 240 python3 -m tdyn bench --device $DEV "${only[@]}" --out "$OUT/bench-cuda.json" --force 2>&1 | tail -n 40
  stamp "full-size Fig 10 steps: the trainer (clipping, metrics, probes every 250 steps) for $NSTEP steps"
  for p in fp32 bf16; do
    tdyn config real/entropy-vs-lr --set device=$DEV $(prec_args $p) > $W/cfg_$p.yaml || continue
    for n in wiki_eta; do
      python3 -c "import sys, yaml; c = yaml.safe_load(open('$W/cfg_$p.yaml'))['$n']; c['optim']['steps'] = $NSTEP; yaml.safe_dump(c, open('$W/s_${p}_$n.yaml', 'w'))"
      a=$(date +%s.%N)
      timeout 90 python3 -m tdyn run $W/s_${p}_$n.yaml --out $W/s_${p}_$n --quiet > /dev/null 2>"$L/steps_${p}_$n.err"
      rc=$?
      echo "$p $n rc=$rc steps=$NSTEP process_s=$(python3 -c "print(round($(date +%s.%N) - $a, 2))") $(python3 -c "
import datetime as D, json, pathlib as P
m = [json.loads(f.read_text()) for f in P.Path('$W/s_${p}_$n').glob('*/meta.json')]
t = lambda k: D.datetime.fromisoformat(m[0][k])
print('train_s (meta, 1 s resolution)=%d' % (t('ended') - t('started')).total_seconds())" 2>/dev/null)" | tee -a "$OUT/steps.txt"
    done
  done
  exit 0
fi

# fig10: per precision, a 1-step reproduction makes the output directory; the four jobs `tdyn config`
# prints for the same settings then train concurrently on the one GPU (`tdyn run`, one process each);
# `reproduce --resume` keeps them (same configs) and runs the analysis.
for p in ${PRECS:-fp32 bf16}; do
  (
    d=$W/f_$p
    timeout 120 python3 -m tdyn reproduce real/entropy-vs-lr --device $DEV $(prec_args $p) --set optim.steps=1 --out $d --quiet > "$L/pre_$p.log" 2>&1 || exit 1
    tdyn config real/entropy-vs-lr --set device=$DEV $(prec_args $p) > $W/cfg_$p.yaml || exit 1
    python3 -c "import yaml; [yaml.safe_dump(c, open(f'$W/cfg_${p}_{n}.yaml', 'w')) for n, c in yaml.safe_load(open('$W/cfg_$p.yaml')).items()]"
    stamp "$p: training"
    ok=1 pids=()
    for n in wiki_eta wiki_ratio bbc_eta bbc_ratio; do
      timeout "$cap" python3 -m tdyn run $W/cfg_${p}_$n.yaml --out $d/runs/$n --force --quiet > /dev/null 2>"$L/train_${p}_$n.err" &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait $pid || ok=0; done
    stamp "$p: trained (all finished: $ok)"
    # the runs' metrics come back first: the call's limit may stop the analysis, never the training's outputs
    tar czf "$OUT/fig10_${p}_runs.tar.gz" -C $W --exclude='checkpoints' --exclude='*.safetensors' f_$p/runs
    if [ $ok = 1 ]; then
      left=$(( ${DEADLINE:-$((SECONDS + 135))} - SECONDS - 15 ))   # DEADLINE: seconds after the script's start
      timeout $(( left > 10 ? left : 10 )) python3 -m tdyn reproduce real/entropy-vs-lr --device $DEV $(prec_args $p) --resume --out $d --quiet > "$L/fig10_$p.log" 2>&1
      stamp "$p: analysis rc=$?"
      tar czf "$OUT/fig10_$p.tar.gz" -C $W --exclude='runs' f_$p
    fi
  ) &
done
wait
set +f; tail -n 12 "$L"/fig10_*.log "$L"/train_*.err 2>/dev/null; set -f
