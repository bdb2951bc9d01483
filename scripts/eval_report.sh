#!/usr/bin/env bash
# Regenerates the kvx eval reports in docs/results/eval-<model>/ (report.md,
# report.json, pareto.svg, needle-*.svg, passkey-*.svg):
#   tinystories656K  every task, full defaults (context 512, every ppl chunk)
#   stories260K      every task, full defaults
#   probe            ppl, kld, copy, passkey at context 2048 (8 ppl chunks of its
#                    held-out prose, 4 copy sequences per distance, 1 passkey per
#                    cell: 2048-token sequences are slow); it has no induction
#                    heads, so lines and needle are left out
#                    (see ../shared/models/README.md)
# Each model runs the f32 baseline against every spec of $KVX_EVAL_SPECS that
# this build accepts (a spec the runtime rejects is skipped with a note), so
# new codecs join the report as they land.
#
# Usage: scripts/eval_report.sh [model ...]    (default: all three)
# Env:   KVX=path/to/kvx (default build/kvx, built if missing)
#        KVX_SHARED=../shared   KVX_EVAL_THREADS=0 (all cores)
#        KVX_EVAL_SPECS="codec=f16 codec=int8 ..." (space-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${KVX_SHARED:-../shared}
KVX=${KVX:-build/kvx}
THREADS=${KVX_EVAL_THREADS:-0}
SPECS=${KVX_EVAL_SPECS:-"codec=f16 codec=int8 codec=int4 codec=int2 codec=kivi4,page=32 codec=kivi2,page=32"}
OUT=docs/results
if [ ! -x "$KVX" ]; then scripts/build.sh; fi
if [ ! -d "$SHARED/models" ]; then
  echo "eval_report.sh: $SHARED/models not found (set KVX_SHARED)" >&2
  exit 1
fi

# --kv flags for the specs this build accepts on `model`.
spec_flags() {
  local model=$1 flags=() spec
  for spec in $SPECS; do
    if "$KVX" run -m "$model" -p "a" -n 1 --kv "$spec" -t 1 >/dev/null 2>&1; then
      flags+=(--kv "$spec")
    else
      echo "eval_report.sh: skipping --kv $spec (not accepted by this build)" >&2
    fi
  done
  echo "${flags[@]}"
}

run_eval() {
  local name=$1 model=$2
  shift 2
  local dir="$OUT/eval-$name"
  rm -rf "$dir"
  # shellcheck disable=SC2046  # word splitting of the --kv flags is intended
  echo "== $name: kvx eval $(spec_flags "$model") $*" >&2
  # shellcheck disable=SC2046
  "$KVX" eval -m "$model" $(spec_flags "$model") --data "$SHARED/data" -t "$THREADS" --report "$dir" "$@" >/dev/null
}

models=("$@")
[ ${#models[@]} -eq 0 ] && models=(tinystories656K stories260K probe)
for m in "${models[@]}"; do
  case "$m" in
    tinystories656K)
      run_eval tinystories656K "$SHARED/models/tinystories656K/TinyStories-656K-F32.gguf" \
        --tasks all -f "$SHARED/golden/stories_eval.txt" --copy-trials 20 ;;
    stories260K)
      run_eval stories260K "$SHARED/models/stories260K/stories260K-F32.gguf" \
        --tasks all -f "$SHARED/golden/stories_eval.txt" --copy-trials 20 ;;
    probe)
      run_eval probe "$SHARED/models/probe/probe-llama-6L-d256-f32.gguf" \
        --tasks ppl,kld,copy,passkey -f "$SHARED/golden/probe_val.txt" --chunks 8 --copy-trials 4 \
        --passkey-trials 1 ;;
    *) echo "eval_report.sh: unknown model '$m' (tinystories656K, stories260K, probe)" >&2; exit 1 ;;
  esac
done
