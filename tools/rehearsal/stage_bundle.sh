#!/usr/bin/env bash
# Stage the offline bundle for the H200 rehearsal (docs/rehearsal.md): SGLang 0.5.17 and
# servesweep's workflow dependencies, for a GPU machine that has no package index and whose
# python3 3.12 already holds torch 2.11.0+cu130, triton, numpy, pandas, matplotlib, aiohttp, ...
#
# Usage (on a machine with a package index, from the checkout):
#   bash tools/rehearsal/stage_bundle.sh .bundle        # .bundle/site.tar.xz
#   bash tools/rehearsal/stage_bundle.sh .bundle pd     # .bundle/pd.tar.xz: the PD extras
#     (Mooncake, sglang-router, and the system libraries in bundle-pd-debs.txt under pdlibs/)
# Writes .bundle/site.tar.xz and its parts site.tar.xz.KofN (unpack it on the GPU machine and
# put it first on PYTHONPATH; tools/rehearsal/run.sh does both). .bundle/wheels keeps the
# downloads, so a rerun fetches nothing. Any python3 with pip works here: cp312/manylinux wheels are chosen by flags.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: stage_bundle.sh OUTDIR [pd]}
kind=${2:-site}
mkdir -p "$out/wheels"
out=$(cd "$out" && pwd)
py=${PY:-python3}
case $kind in
site) req="$here/bundle-requirements.txt" ;;
pd) req="$here/bundle-pd-requirements.txt" ;;
*) echo "stage_bundle: unknown bundle $kind (site or pd)" >&2; exit 2 ;;
esac

plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3
  --abi none --platform any --platform manylinux1_x86_64 --platform manylinux2014_x86_64)
for n in 5 17 24 26 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done

# The device tool's carry counts the checkout too (64 MiB in all): once the committed evidence
# grew past 8 MB, a 56 MB bundle no longer fits beside it. split_parts NAME writes parts of
# PART_MB each (NAME.tar.xz.KofN), carried one per call on a warm machine; run.sh keeps them
# and unpacks the bundle once all its parts are there.
split_parts() {
  echo "== split $1.tar.xz into parts of ${PART_MB:=28} MB"
  rm -f "$out/$1.tar.xz."*of* "$out/$1.tar.xz.part"*
  split -b "${PART_MB}M" -d -a 1 "$out/$1.tar.xz" "$out/$1.tar.xz.part"
  local parts=("$out/$1.tar.xz.part"*) i
  for i in "${!parts[@]}"; do mv "${parts[$i]}" "$out/$1.tar.xz.$((i + 1))of${#parts[@]}"; done
  ls -la "$out/$1.tar.xz."*of*
}

echo "== download (no deps: the file lists every package)"
grep -v '^#' "$req" | while read -r pin; do
  "$py" -m pip download -q --no-deps "${plat[@]}" -d "$out/wheels" "$pin" 2>/dev/null && continue
  # No wheel on the index (e.g. connection-pool 0.0.3): build one, which must be pure Python.
  "$py" -m pip wheel -q --no-deps -w "$out/wheels" "$pin"
  ls "$out/wheels" | grep -qi "^${pin%%==*}-${pin##*==}-py3-none-any.whl$" \
    || ls "$out/wheels" | grep -qi "^$(tr - _ <<<"${pin%%==*}")-${pin##*==}-py3-none-any.whl$" \
    || { echo "stage_bundle: $pin has no cp312 wheel and is not pure Python" >&2; exit 1; }
done

echo "== install into $out/$kind"
s=$out/$kind
rm -rf "$s"
"$py" -m pip install -q --no-deps --no-compile --no-index --find-links "$out/wheels" \
  "${plat[@]}" --target "$s" -r "$req"

if [ "$kind" = pd ]; then
  echo "== slim: Mooncake's transfer engine only (no store, EP, process group or tools)"
  rm -f "$s"/mooncake/libmooncake_pg.so "$s"/mooncake/transfer_engine_bench \
    "$s"/mooncake/store.so "$s"/mooncake/mooncake_client "$s"/mooncake/mooncake_master \
    "$s"/mooncake/libmooncake_ep_device.so "$s"/mooncake/_ep*.so
  echo "== system libraries (Debian packages of bundle-pd-debs.txt) into pdlibs/"
  debs=$(mktemp -d)
  (cd "$debs" && grep -v '^#' "$here/bundle-pd-debs.txt" | xargs apt-get download -q >/dev/null)
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$debs/root"; done
  mkdir -p "$s/pdlibs"
  find "$debs/root" \( -type f -o -type l \) -name '*.so*' -exec cp -P {} "$s/pdlibs/" \;
  rm -rf "$debs" "$s"/bin
  du -sh "$s"
  tar -C "$s" -cf - . | xz -9 -T0 >"$out/pd.tar.xz.tmp"
  mv "$out/pd.tar.xz.tmp" "$out/pd.tar.xz"
  ls -la "$out/pd.tar.xz"
  split_parts pd
  exit 0
fi

echo "== slim (what the rehearsal never loads)"
# sgl-kernel: Hopper's common ops stay; FA3 (1.1 GB), Blackwell, InfLLM and FlashMLA ops go.
rm -f "$s"/sgl_kernel/flash_ops.*.so "$s"/sgl_kernel/infllm_ops*.so "$s"/sgl_kernel/flashmla_ops*.so
rm -rf "$s"/sgl_kernel/sm100
rm -f "$s"/xgrammar/lib/libxgrammar.a # for building against xgrammar, not for running it
# sglang: the diffusion runtime and the Rust front ends (SGLANG_RUST_SERVER, --grpc-port).
rm -rf "$s"/sglang/multimodal_gen
rm -f "$s"/sglang/srt/server/_core*.so "$s"/sglang/srt/grpc/_core*.so \
  "$s"/sglang/srt/multimodal/_core*.so
# pulp's bundled CBC binaries: the workflow runs with --scheduler greedy (no ILP solver).
rm -rf "$s"/pulp/solverdir
# console scripts carry this machine's interpreter in their shebang; run modules with -m.
rm -rf "$s"/bin
du -sh "$s"

echo "== compress"
tar -C "$s" -cf - . | xz -9 -T0 >"$out/site.tar.xz.tmp"
mv "$out/site.tar.xz.tmp" "$out/site.tar.xz"
ls -la "$out/site.tar.xz"
split_parts site

