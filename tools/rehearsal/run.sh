#!/usr/bin/env bash
# The H200 rehearsal, one command on the GPU machine (docs/rehearsal.md). From the checkout:
#   OUT=/some/dir bash tools/rehearsal/run.sh STEP...
# with the staged bundle in .bundle/site.tar.xz (tools/rehearsal/stage_bundle.sh) and, to resume,
# the results/ of the last call. Steps, run in the order given:
#   receive        only keep a carried part of a bundle (site.tar.xz.KofN, pd.tar.xz.KofN), and
#                  unpack the bundle once all its parts are here
#   builtin        the rehearsal matrix with the builtin client   (RUN_ID h200-rehearsal)
#   bench_serving  the same matrix with SGLang's bench_serving    (RUN_ID h200-rehearsal-bench)
#   flow           seed 003's flow: servesweep up, two runs (two RUN_IDs) on the service, down
#   x4             the multi-GPU matrix, TP = EP = GPUS (default 4; h200x4_rehearsal.yaml)
#   pd-probe       seconds: does the PD bundle load here (Mooncake's libraries, the router)?
#   pd             seed 003's six cases, prefill on GPUs 0-1, decode on 2-3 (h200x4_pd_rehearsal.yaml)
#   pd1-up         seed 003 on ONE GPU (h200_pd_rehearsal.yaml): servesweep up (prefill, decode,
#                  router; both engines on GPU 0)
#   pd1-flow       on that service: SUITE=standard, then decode512 and decode512-c8, each under
#                  its own RUN_ID (pd-standard, pd-decode512, pd-decode512-c8), 3 repeats each
#   pd1-bench      the six cases once more with bench_serving on the service (RUN_ID pd-bench,
#                  PD_BENCH_REPEATS repeats, default 1: 27 s a cell-repeat)
#   pd1-faults     the decode server killed mid-cell on the service, servesweep down (GPU memory
#                  back to idle), then the prefill server and the router killed mid-cell, each
#                  in a run that starts its own servers (tools/rehearsal/kill_role.py)
#   pd1-transfer   MOONCAKE_PROTOCOL=rdma on a machine without RDMA: a broken transfer, or (as
#                  Mooncake's source suggests, docs/evidence.md) a fallback to TCP? Observed, not assumed
#   eq-probe       the probe alone of h200_equivalence.yaml's triton served whole, against
#                  PD_PROBE (a PD run's equivalence/pd.json): PD against whole serving
#   eq-runners     h200_equivalence.yaml: triton vs triton_kernel served whole (one run), triton
#                  started again under another RUN_ID, and the equivalence of the pairs
# x4 and pd make the 7.6 B model (X4_MODEL_ARGS). pd-probe and pd need .bundle/pd.tar.xz. The
# device tool's 64 MiB carry counts the checkout too, so each bundle is carried as parts
# (NAME.tar.xz.KofN), one per call on a warm machine, which keeps what earlier calls left under
# $WORK; `receive` is the step for a call that only brings a part.
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

# unpack NAME: .bundle/NAME.tar.xz whole, or its parts NAME.tar.xz.KofN (stage_bundle.sh), one
# carried per call on a warm machine: each call keeps its part under $work/parts, and the last
# one unpacks. Returns 1 while parts are missing (or none of NAME is here).
unpack() {
  local name=$1 files want
  [ -f "$work/site/.$name-unpacked" ] && return 0
  mkdir -p "$work/site" "$work/parts"
  files=(".bundle/$name.tar.xz")
  if [ ! -f "${files[0]}" ]; then
    mapfile -t files < <(ls "$work/parts/$name.tar.xz."*of* 2>/dev/null | sort -V)
    [ "${#files[@]}" = 0 ] && return 1
    want=$(printf '%s\n' "${files[@]}" | sed 's/.*of//' | sort -u)
    if [ "$(wc -w <<<"$want")" != 1 ] || [ "${#files[@]}" != "$want" ]; then
      mark "bundle $name: ${#files[@]} of $want parts here ($(cd "$work/parts" && ls "$name".* | tr '\n' ' ')); carry the next part while this machine is warm"
      return 1
    fi
  fi
  cat "${files[@]}" | xz -T0 -dc | tar -x -C "$work/site" && touch "$work/site/.$name-unpacked" \
    || { mark "FAIL: could not unpack ${files[*]}"; exit 2; }
  rm -f "$work/parts/$name.tar.xz."*
}
# Every carried part of every bundle is kept first, whichever bundle is complete yet.
mkdir -p "$work/parts"
for part in .bundle/*.tar.xz.*of*; do [ -f "$part" ] && cp "$part" "$work/parts/"; done
if ! unpack site; then
  [ "${steps[*]}" = receive ] && exit 0
  mark "FAIL: no complete bundle: carry .bundle/site.tar.xz or each of its parts"
  exit 2
fi
if ! unpack pd && [ -n "$(ls "$work/parts/pd.tar.xz."* 2>/dev/null)" ]; then
  [ "${steps[*]}" = receive ] && exit 0
  mark "FAIL: the PD bundle is incomplete: carry its next part"
  exit 2
fi
[ "${steps[*]}" = receive ] && { mark "bundle: complete and unpacked"; exit 0; }
export PYTHONPATH="$work/site:$PWD/src"
mark "bundle unpacked in $work/site ($(du -sh "$work/site" | cut -f1))"
if [ -f "$work/site/mooncake/engine.so" ]; then
  # Link only the system libraries Mooncake's engine lacks here; the image's own stay first.
  mkdir -p "$work/ldmissing"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$work/site/mooncake_transfer_engine_cuda13.libs:$work/ldmissing"
  for _ in 1 2 3; do # what a linked library needs in turn (libibverbs: libnl-3)
    for lib in $(ldd "$work/site/mooncake/engine.so" | awk '/not found/ {print $1}'); do
      [ -e "$work/site/pdlibs/$lib" ] && ln -sf "$work/site/pdlibs/$lib" "$work/ldmissing/$lib"
    done
  done
  mark "mooncake: linked from the bundle: $(ls "$work/ldmissing" | tr '\n' ' ')"
fi
python3 -m pip list 2>/dev/null | grep -i -E '^(sglang|sglang-kernel|flashinfer-python|torch|triton|transformers|tokenizers|pandas|numpy|matplotlib|seaborn|aiohttp|snakemake|pydantic) ' \
  | tr -s ' ' | tr '\n' ';' | sed 's/^/[packages] /' | tee -a "$out/run.log"; echo | tee -a "$out/run.log"
case " ${steps[*]} " in
*" builtin "* | *" bench_serving "* | *" flow "* | *" pd1-"* | *" eq-runners "* | *" eq-probe "*)
  python3 tools/rehearsal/make_model.py "$work/model" 2>&1 | grep -v -i warn | tee -a "$out/run.log"
  mark "model ready in $work/model"
  ;;
esac
case " ${steps[*]} " in
*" x4 "* | *" pd "*)
  # 7.6 B parameters, 64 experts: every GPU of TP = EP = 4 works (16 experts each)
  # shellcheck disable=SC2086
  python3 tools/rehearsal/make_model.py "$work/model-x4" ${X4_MODEL_ARGS:---hidden 3072 --layers 12 --heads 24 --kv-heads 8 --experts 64 --topk 8 --moe-inter 1024} \
    2>&1 | grep -v -i warn | tee -a "$out/run.log"
  mark "model ready in $work/model-x4"
  ;;
esac

python3 tools/rehearsal/watch_metrics.py results "$out/metrics.jsonl" --interval 0.5 &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT

cfg=config/experiments/h200_rehearsal.yaml
pd1=config/experiments/h200_pd_rehearsal.yaml
gpus=${GPUS:-4}
x4cfg=config/experiments/h200x4_rehearsal.yaml
if [ "$gpus" != 4 ]; then # the same matrix on 2 or 8 GPUs: gpus_per_node = tp = ep = GPUS
  x4cfg=$work/h200x${gpus}_rehearsal.yaml
  python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); n = int(sys.argv[2])
c['cluster']['gpus_per_node'] = c['server']['tp_size'] = c['server']['ep_size'] = n
c['run_id'] = f'h200x{n}-rehearsal'; yaml.safe_dump(c, open(sys.argv[3], 'w'), sort_keys=False)" \
    config/experiments/h200x4_rehearsal.yaml "$gpus" "$x4cfg"
fi
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
  if [ "$rc" != 0 ] && grep -q 'ProbeFailed' "$out/snakemake-$run.log"; then
    # The equivalence probe found no answer it could read: say so, and measure without it.
    mark "run $run: the equivalence probe failed: $(grep -m1 'ProbeFailed' "$out/snakemake-$run.log")"
    python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); c['equivalence'] = {'enabled': False}
yaml.safe_dump(c, open(sys.argv[2], 'w'), sort_keys=False)" "$cfg" "$work/noprobe-$run.yaml"
    env RUN_ID="$run" "$@" timeout -s INT -k 60 "$(left)" python3 -m snakemake --cores 1 all \
      --configfile "$work/noprobe-$run.yaml" >>"$out/snakemake-$run.log" 2>&1
    rc=$?
  fi
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
  x4) cfg=$x4cfg snake "h200x${gpus}-rehearsal" ;;
  pd-probe)
    { # each line: what was checked, then what it printed
      echo "## nvidia-smi topo -m"; nvidia-smi topo -m
      echo "## ldd mooncake/engine.so (missing: '=> not found')"; ldd "$work/site/mooncake/engine.so"
      echo "## import mooncake.engine"; python3 -c "from mooncake.engine import TransferEngine; print('ok', TransferEngine)"
      echo "## sglang_router.launch_router --help (mini-lb)"; python3 -m sglang_router.launch_router --help | grep -i -E 'mini|pd-disagg'
      echo "## SGLang's Mooncake connector (what a PD server imports)"; python3 -c "import sglang.srt.disaggregation.mooncake.conn as c; print('ok', c.__name__)" 2>&1 | grep -v -i warn | tail -3
      echo "## /dev/infiniband"; ls /dev/infiniband 2>&1
    } >"$out/pd-probe.txt" 2>&1
    mark "pd-probe: $(grep -c '=> not found' "$out/pd-probe.txt") libraries not found; $(grep -c '^ok' "$out/pd-probe.txt") import ok"
    ;;
  pd) cfg=config/experiments/h200x4_pd_rehearsal.yaml snake h200x4-pd-rehearsal ;;
  pd1-up)
    mark "pd1: servesweep up ($pd1)"
    RUN_ID=pd-up python3 -m servesweep.workflow.cli up --configfile "$pd1" >>"$out/pd1-flow.log" 2>&1 \
      || mark "pd1: up failed: $(tail -1 "$out/pd1-flow.log")"
    mark "pd1: up: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';')"
    ;;
  pd1-flow)
    for suite in standard decode512 decode512-c8; do
      cfg=$pd1 snake "pd-$suite" SUITE="$suite"
    done
    ;;
  pd1-bench)
    python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); c['repeats'] = int(sys.argv[2])
yaml.safe_dump(c, open(sys.argv[3], 'w'), sort_keys=False)" "$pd1" "${PD_BENCH_REPEATS:-1}" "$work/pd1-bench.yaml"
    cfg=$work/pd1-bench.yaml snake pd-bench CLIENT_KIND=bench_serving SUITE=all
    ;;
  pd1-faults)
    for role in ${FAULT_ROLES:-decode prefill router}; do
      python3 tools/rehearsal/kill_role.py results "pd-fault-$role" "$role" --delay 4 --timeout 400 \
        >>"$out/pd1-faults.log" 2>&1 &
      killer=$!
      cfg=$pd1 snake "pd-fault-$role" SUITE=decode512-c8
      wait $killer
      mark "pd1-faults: $role: $(tail -1 "$out/pd1-faults.log")"
      if [ "$role" = decode ]; then # it ran on the service: down, then the GPU must be idle
        RUN_ID=pd-up python3 -m servesweep.workflow.cli down --configfile "$pd1" >>"$out/pd1-flow.log" 2>&1 \
          || mark "pd1: down failed: $(tail -1 "$out/pd1-flow.log")"
      fi
      mark "pd1-faults: after $role: GPU $(nvidia-smi --query-gpu=memory.used --format=csv,noheader); apps: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l); servesweep processes: $(ps -e -o comm=,args= | grep -c -E 'sglang.launch_server|sglang_router' )"
    done
    ;;
  pd1-transfer)
    python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); c['runtime']['env']['MOONCAKE_PROTOCOL'] = 'rdma'
yaml.safe_dump(c, open(sys.argv[2], 'w'), sort_keys=False)" "$pd1" "$work/pd1-rdma.yaml"
    cfg=$work/pd1-rdma.yaml snake pd-fault-transfer SUITE=decode512-c8
    mark "pd1-transfer: GPU $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) after"
    ;;
  eq-probe) # the probe alone of the model served whole with triton (no cell): PD vs whole
    mark "eq-probe: snakemake the probe of triton, $(left)s of budget"
    RUN_ID=eq-whole BACKENDS_CSV=triton timeout -s INT -k 30 "$(left)" python3 -m snakemake --cores 1 \
      --configfile config/experiments/h200_equivalence.yaml \
      "results/eq-whole/equivalence/moe_runner_backend~triton.json" >>"$out/snakemake-eq-whole.log" 2>&1
    mark "eq-probe: exit $?; $(grep -E 'role-ready|ready fp|probe-done' results/eq-whole/orchestrator.log 2>/dev/null | tr '\n' ';')"
    python3 -m servesweep.workflow.cli equivalence "results/eq-whole/equivalence/moe_runner_backend~triton.json" \
      "$PD_PROBE" >"$out/equivalence.txt" 2>&1
    ;;
  eq-runners)
    # EQ_BACKENDS=triton: the baseline alone (PD against the model served whole)
    cfg=config/experiments/h200_equivalence.yaml snake eq-runners BACKENDS_CSV="${EQ_BACKENDS:-triton,triton_kernel}"
    # A third start of triton under another RUN_ID only with EQ_AGAIN=1: the fault runs already
    # start the PD set again, whose probe is compared with the first start's below.
    [ -n "${EQ_AGAIN:-}" ] && cfg=config/experiments/h200_equivalence.yaml snake eq-again BACKENDS_CSV=triton
    {
      base=results/eq-runners/equivalence/moe_runner_backend~triton.json
      echo "## triton_kernel vs triton (one run)"
      python3 -m servesweep.workflow.cli equivalence "$base" results/eq-runners/equivalence/moe_runner_backend~triton_kernel.json
      if [ -f results/eq-again/equivalence/moe_runner_backend~triton.json ]; then
        echo "## triton started again (run eq-again) vs triton (run eq-runners)"
        python3 -m servesweep.workflow.cli equivalence "$base" results/eq-again/equivalence/moe_runner_backend~triton.json
      fi
      for run in pd-standard pd-decode512 pd-decode512-c8 pd-bench pd-fault-prefill pd-fault-router; do
        [ -f "results/$run/equivalence/pd.json" ] || continue
        echo "## PD ($run) vs triton served whole"
        python3 -m servesweep.workflow.cli equivalence "$base" "results/$run/equivalence/pd.json"
        echo "## PD ($run) vs PD (pd-standard)"
        python3 -m servesweep.workflow.cli equivalence results/pd-standard/equivalence/pd.json "results/$run/equivalence/pd.json"
      done
    } >"$out/equivalence.txt" 2>&1
    mark "eq-runners: $(grep -c -E 'same outputs|within numerical' "$out/equivalence.txt") pairs same/within, $(grep -c -E ': outputs differ' "$out/equivalence.txt") differ"
    ;;
  *) mark "unknown step $step" ;;
  esac
done

kill $watcher 2>/dev/null
if [ -d results ]; then
  tar -cf - results | xz -T0 -6 >"$out/results.tar.xz"
  mark "end: results.tar.xz $(du -h "$out/results.tar.xz" | cut -f1)"
else
  mark "end: no results/ (no run was made)"
fi
