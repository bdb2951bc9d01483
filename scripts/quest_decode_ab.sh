#!/bin/bash
# A/B decode speed at 8k on the smollm2-135m shape: per round, every (binary, spec) once. 3 rounds.
# Binaries: /tmp/quest-base/kvx (before) and /tmp/quest-new1/kvx (after), copies of build/kvx.
# Model: kvx gen-model --shape smollm2-135m --type q8_0 -o $M . Output: one JSON line per run in $OUT
# (docs/results/quest/decode_ab_8k.jsonl is one such run).
M=${M:-/tmp/kvx-bench-models/smollm2-135m-q8_0.gguf}
OUT=/tmp/quest-ab.jsonl; : > $OUT
for round in 1 2 3; do
  for run in "base|codec=f16" "base|codec=f16;policy=quest,budget=1024" "new1|codec=f16" "new1|codec=f16;policy=quest,budget=1024" "new1|codec=f16;policy=quest,budget=512"; do
    bin=${run%%|*}; spec=${run#*|}
    /tmp/quest-$bin/kvx bench -m $M -t 2 --kv "$spec" --depths 8192 -r 1 -n 32 -p 64 --json /tmp/quest-ab.json > /dev/null 2>/tmp/quest-ab.err || { echo "FAIL $run"; cat /tmp/quest-ab.err; }
    python3 -c "import json,os,sys; d=json.load(open('/tmp/quest-ab.json'))['decode'][0]; print(json.dumps({'round':$round,'bin':sys.argv[1],'spec':sys.argv[2],'tok_s':d['tok_s'],'load':os.getloadavg()[0]}))" "$bin" "$spec" >> $OUT
    tail -1 $OUT
  done
done
