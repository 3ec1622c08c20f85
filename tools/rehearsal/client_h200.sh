#!/usr/bin/env bash
# benchmarks/client.py on the lent H200 host (16 cores, the host of issue 29's figures), from
# the site bundle, with the sim on several cores so that the client is the side that saturates
# (docs/performance.md, client). Carry .bundle/site.tar.xz's parts first (docs/rehearsal.md) and
# .bundle/sglang-0.5.23-bench.whl (the sglang wheel's sglang/benchmark/ only: bench_serving), then
#   OUT=$OUT bash tools/rehearsal/run.sh receive && OUT=$OUT bash tools/rehearsal/client_h200.sh CORES...
# One full client.py per CORES argument (--server-cores: 1, 1-4, ...); writes
# $OUT/client-<cores>.json and .log.
set -u
site=${WORK:-/tmp/servesweep-h200}/site
out=${OUT:?OUT: where the results go}
export SGLANG_WHEEL=$PWD/.bundle/sglang-0.5.23-bench.whl
echo "$(nproc) cpus; $(uptime); $(python3 -V)"
for cores in "${@:-1-4}"; do
  PYTHONPATH=$site:$PWD/src:$PWD timeout "${CLIENT_TIMEOUT_S:-280}" python3 benchmarks/client.py \
    --client-core 0 --server-cores "$cores" --out "$out/client-$cores.json" >"$out/client-$cores.log" 2>&1
  echo "cores $cores: rc $?"
  grep -E "req/s|check|FAILED" "$out/client-$cores.log"
done
