#!/bin/bash
# ThinK decode speed A/B (docs/kv-think.md, "Decode speed"): two kvx builds, before and after a change to
# the attention over pruned pages, in interleaved rounds (per round every (binary, configuration) once, so a
# slow minute of a shared machine lands on all of them).
#  1. kvx bench at 8k context on the smollm2-135m shape (same flags as scripts/eviction_report.py --speed):
#     f16, ThinK lambda 0.5 and 0.4, SnapKV 0.5. One JSON line per run in $OUT_BENCH.
#  2. kv_bench's decode attention alone over a whole smollm2-shaped 8k cache (30 layers, 3 kv heads, 9 query
#     heads), f16 and with 32 / 20 of 64 key channels kept, 1 and 2 threads. One line per benchmark in $OUT_KERNEL.
# BEFORE and AFTER are directories holding kvx and kv_bench (copies of build/); render the document with
# scripts/think_speed_report.py.
set -e
BEFORE=${BEFORE:-/tmp/thinkspeed-before}
AFTER=${AFTER:-/tmp/thinkspeed-after}
ROUNDS=${ROUNDS:-3}
M=${M:-/tmp/kvx-bench-models/smollm2-135m-q8_0.gguf}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_BENCH=${OUT_BENCH:-$ROOT/docs/results/think/decode_ab_8k.jsonl}
OUT_KERNEL=${OUT_KERNEL:-$ROOT/docs/results/think/attention_ab_8k.jsonl}
SPECS=("codec=f16" "codec=f16;policy=think,lambda=0.5" "codec=f16;policy=think,lambda=0.4" "codec=f16;policy=snapkv,ratio=0.5")
[ -f "$M" ] || "$AFTER/kvx" gen-model --shape smollm2-135m --type q8_0 -o "$M"
mkdir -p "$(dirname "$OUT_BENCH")"
: > "$OUT_BENCH"
: > "$OUT_KERNEL"
TMP=$(mktemp -d)
for round in $(seq 1 "$ROUNDS"); do
  for bin in before after; do
    dir=$BEFORE; [ $bin = after ] && dir=$AFTER
    "$dir/kv_bench" --benchmark_filter='AllLayers(Pruned)?/f16(_keep32|_keep20)?/ctx:8192/' --benchmark_format=json \
        > "$TMP/kernel.json" 2>/dev/null
    python3 -c "
import json, os, sys
for b in json.load(open(sys.argv[1]))['benchmarks']:
    print(json.dumps({'round': int(sys.argv[2]), 'bin': sys.argv[3], 'name': b['name'], 'real_ms': b['real_time'],
                      'cpu_ms': b['cpu_time'], 'kv_bytes': b['kv_bytes'], 'load': os.getloadavg()[0]}))" \
        "$TMP/kernel.json" "$round" "$bin" >> "$OUT_KERNEL"
    for spec in "${SPECS[@]}"; do
      "$dir/kvx" bench -m "$M" -t 2 --kv "$spec" --depths 8192 -r 1 -n 32 -p 64 --json "$TMP/bench.json" > /dev/null
      python3 -c "
import json, os, sys
d = json.load(open(sys.argv[1]))['decode'][0]
print(json.dumps({'round': int(sys.argv[2]), 'bin': sys.argv[3], 'spec': sys.argv[4], 'tok_s': d['tok_s'],
                  'kv_bytes': d['kv_bytes'], 'load': os.getloadavg()[0]}))" "$TMP/bench.json" "$round" "$bin" "$spec" \
          >> "$OUT_BENCH"
      tail -1 "$OUT_BENCH"
    done
  done
done
rm -rf "$TMP"
