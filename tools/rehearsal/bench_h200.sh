#!/usr/bin/env bash
# benchmarks/ on the lent H200 host (16 cores, the host of issue 29's figures), from the site
# bundle; no GPU used (docs/performance.md). Carry .bundle/site.tar.xz's parts first
# (docs/rehearsal.md), then
#   OUT=$OUT bash tools/rehearsal/run.sh receive && OUT=$OUT bash tools/rehearsal/bench_h200.sh STEP...
# Steps, in the order given:
#   planning         planning.py at 100/1k/10k for the checkout, and at 10k for an older tree
#                    carried as .bundle/old.tar.gz (git archive OLD Snakefile rules src scripts
#                    config profiles report benchmarks pyproject.toml): planning-new/old.json
#   ab               dryrun_ab.py, 3 rounds at 10k: the checkout, the older tree if carried, the
#                    plain Snakefile, and both again under the Snakemake in .bundle/sm-alt if
#                    carried (pip install --target): dryrun_ab.json
#   aggregation[=N]  aggregation.py --repeats 3 --cores N (default: every CPU; 1: one process
#                    per job, as before the workers): aggregation-N.json
#   client=CORES     client.py with the sim on CORES (1, 1-4, ...): client-CORES.json; the sim's
#                    cores are its processes on one port (client.py --server-cores)
set -u
site=${WORK:-/tmp/servesweep-h200}/site
out=${OUT:?OUT: where the results go}
# The benchmarks run `snakemake`; the bundle has the package, not its console script.
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -m snakemake "$@"\n' >/tmp/bin/snakemake
chmod +x /tmp/bin/snakemake
export PATH=/tmp/bin:$PATH PYTHONPATH=$site:$PWD/src:$PWD
export SGLANG_WHEEL=$PWD/.bundle/sglang-0.5.23-bench.whl
echo "$(nproc) cpus; $(uptime); $(python3 -V)"
run() {  # NAME TIMEOUT_S COMMAND...: its log in $out/NAME.log, the checks' lines shown
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "$name: rc $?"
  grep -E "N=|req/s|results.csv|check|FAILED|median|ratio" "$out/$name.log" | tail -40
}
for step in "$@"; do
  case $step in
  planning)
    run planning-new 280 python3 benchmarks/planning.py --sizes 100,1000,10000 --repeats 3 \
      --out "$out/planning-new.json"
    if [ -f .bundle/old.tar.gz ]; then
      mkdir -p /tmp/old && tar -xzf .bundle/old.tar.gz -C /tmp/old
      PYTHONPATH=$site:/tmp/old/src run planning-old 200 python3 benchmarks/planning.py \
        --workflow /tmp/old --sizes 10000 --repeats 3 --out "$out/planning-old.json"
    fi
    ;;
  ab)
    alt=()
    [ -d .bundle/sm-alt ] && alt=(ALT_SNAKEMAKE="$PWD/.bundle/sm-alt")
    run ab 300 env "${alt[@]}" OUT="$out" python3 tools/rehearsal/dryrun_ab.py 3
    ;;
  aggregation | aggregation=*)
    cores=$(nproc)
    [ "$step" = aggregation ] || cores=${step#aggregation=}
    run "aggregation-$cores" 290 python3 benchmarks/aggregation.py --repeats 3 --cores "$cores" \
      --out "$out/aggregation-$cores.json"
    ;;
  client=*)
    cores=${step#client=}
    run "client-$cores" 280 python3 benchmarks/client.py --client-core 0 \
      --server-cores "$cores" --out "$out/client-$cores.json"
    ;;
  *) echo "bench_h200: unknown step $step" >&2; exit 2 ;;
  esac
done
