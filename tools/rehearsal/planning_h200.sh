#!/usr/bin/env bash
# benchmarks/planning.py on the lent H200 host (16 cores, the host of issue 29's figures), from
# the site bundle, for this checkout and for an older tree (docs/performance.md, planning).
# Carry .bundle/site.tar.xz's parts first (docs/rehearsal.md), then this with the older tree:
#   git archive --format=tar.gz -o .bundle/old.tar.gz OLD Snakefile rules src scripts config \
#     profiles report benchmarks pyproject.toml
#   OUT=$OUT bash tools/rehearsal/run.sh receive && OUT=$OUT bash tools/rehearsal/planning_h200.sh
# Writes $OUT/planning-new.json, planning-old.json and ab.txt (tools/rehearsal/dryrun_ab.py).
set -u
site=${WORK:-/tmp/servesweep-h200}/site
out=${OUT:?OUT: where the results go}
# planning.py runs `snakemake`; the bundle has the package, not its console script
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -m snakemake "$@"\n' >/tmp/bin/snakemake
chmod +x /tmp/bin/snakemake
export PATH=/tmp/bin:$PATH
echo "$(nproc) cpus; $(uptime); $(python3 -V)"
mkdir -p /tmp/old && tar -xzf .bundle/old.tar.gz -C /tmp/old
PYTHONPATH=$site:$PWD/src timeout 280 python3 benchmarks/planning.py --sizes 100,1000,10000 \
  --repeats 3 --out "$out/planning-new.json" >"$out/new.log" 2>&1
echo "new: rc $?"
grep -E "N=|check" "$out/new.log"
PYTHONPATH=$site:/tmp/old/src timeout 200 python3 benchmarks/planning.py --workflow /tmp/old \
  --sizes 10000 --repeats 3 --out "$out/planning-old.json" >"$out/old.log" 2>&1
echo "old: rc $?"
grep -E "N=|check" "$out/old.log"
PYTHONPATH=$site:$PWD/src timeout 240 python3 tools/rehearsal/dryrun_ab.py 4 | tee "$out/ab.txt"
