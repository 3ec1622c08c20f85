#!/usr/bin/env bash
# The H200 rehearsal, one command on the GPU machine (docs/rehearsal.md). From the checkout:
#   OUT=/some/dir bash tools/rehearsal/run.sh STEP...
# with the staged bundle in .bundle/site.tar.xz (tools/rehearsal/stage_bundle.sh) and, to resume,
# the results/ of the last call. Steps, run in the order given:
#   builtin        the rehearsal matrix with the builtin client   (RUN_ID h200-rehearsal)
#   bench_serving  the same matrix with SGLang's bench_serving    (RUN_ID h200-rehearsal-bench)
#   flow           seed 003's flow: servesweep up, two runs (two RUN_IDs) on the service, down
# Every step resumes: Snakemake runs only the cell-repeats without a record. A step that would
# start after BUDGET_S is skipped; a running one is stopped with Ctrl-C (SIGINT) at the budget,
# which keeps every finished cell. Whatever ran, $OUT gets results.tar.xz (results/ as it is
# now), run.log (this script's timeline) and metrics.jsonl (the /metrics trace).
set -uo pipefail
cd "$(dirname "$0")/../.."
steps=("${@:-builtin}")
budget=${BUDGET_S:-520}
work=${WORK:-/tmp/servesweep-h200}
out=${OUT:?OUT: where the results go}
t0=$(date +%s)
mark() { echo "[t=$(($(date +%s) - t0))s] $*" | tee -a "$out/run.log"; }
left() { echo $((budget - ($(date +%s) - t0))); }

# The GPU machine's notes: NVLink multicast off in every process. Offline, unbuffered.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  export CUDA_HOME
fi
mkdir -p "$work"
mark "start: $(hostname), $(python3 -V 2>&1), $(nproc) cpus, steps: ${steps[*]}"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,power.draw \
  --format=csv,noheader | sed 's/^/[gpu] /' | tee -a "$out/run.log"

if [ ! -f "$work/site/.unpacked" ]; then
  mkdir -p "$work/site"
  xz -T0 -dc .bundle/site.tar.xz | tar -x -C "$work/site" && touch "$work/site/.unpacked" \
    || { mark "FAIL: could not unpack .bundle/site.tar.xz"; exit 2; }
fi
export PYTHONPATH="$work/site:$PWD/src"
mark "bundle unpacked in $work/site ($(du -sh "$work/site" | cut -f1))"
python3 -m pip list 2>/dev/null | grep -i -E '^(sglang|sglang-kernel|flashinfer-python|torch|triton|transformers|tokenizers|pandas|numpy|matplotlib|seaborn|aiohttp|snakemake|pydantic) ' \
  | tr -s ' ' | tr '\n' ';' | sed 's/^/[packages] /' | tee -a "$out/run.log"; echo | tee -a "$out/run.log"
python3 tools/rehearsal/make_model.py "$work/model" 2>&1 | grep -v -i warn | tee -a "$out/run.log"
mark "model ready in $work/model"

python3 tools/rehearsal/watch_metrics.py results "$out/metrics.jsonl" --interval 0.5 &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT

cfg=config/experiments/h200_rehearsal.yaml
snake() { # RUN_ID, then extra env; stops with SIGINT at the budget
  local run=$1 rest
  shift
  rest=$(left)
  if [ "$rest" -lt 90 ]; then
    mark "skip run $run: ${rest}s of budget left"
    return 1
  fi
  mark "run $run ($*): snakemake --cores 1 all, ${rest}s of budget"
  env RUN_ID="$run" "$@" timeout -s INT -k 60 "$rest" python3 -m snakemake --cores 1 all \
    --configfile "$cfg" >>"$out/snakemake-$run.log" 2>&1
  local rc=$?
  mark "run $run: exit $rc; $(grep -c . results/"$run"/results.csv 2>/dev/null || echo 0) lines in results.csv"
  grep -E '^servesweep' "$out/snakemake-$run.log" | tail -5 | tee -a "$out/run.log"
  return $rc
}

for step in "${steps[@]}"; do
  case $step in
  builtin) snake h200-rehearsal ;;
  bench_serving) snake h200-rehearsal-bench CLIENT_KIND=bench_serving ;;
  flow)
    mark "flow: servesweep up"
    RUN_ID=h200-flow-a CHUNKED_PREFILL_SIZES_CSV=8192 python3 -m servesweep.workflow.cli up \
      --configfile "$cfg" >>"$out/flow.log" 2>&1 || mark "flow: up failed"
    mark "flow: $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' ';')"
    { # what preflight's GPU probe reads while the service holds the GPU, and whose pids those are
      nvidia-smi --query-gpu=index,pci.bus_id,memory.used --format=csv && echo @@apps &&
        nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv
      echo @@ps; ps -e -o pid=,sid=,comm= | grep -i -E 'python|sglang'
    } >"$out/probe-service-up.txt" 2>&1
    for suite in a b; do
      snake "h200-flow-$suite" CHUNKED_PREFILL_SIZES_CSV=8192 CONCURRENCIES_CSV=8
    done
    RUN_ID=h200-flow-a CHUNKED_PREFILL_SIZES_CSV=8192 python3 -m servesweep.workflow.cli down \
      --configfile "$cfg" \
      >>"$out/flow.log" 2>&1 || mark "flow: down failed"
    mark "flow: done; $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) in use after down"
    ;;
  *) mark "unknown step $step" ;;
  esac
done

kill $watcher 2>/dev/null
tar -cf - results | xz -T0 -6 >"$out/results.tar.xz"
mark "end: results.tar.xz $(du -h "$out/results.tar.xz" | cut -f1)"
