#!/bin/sh
# Passkey on the recall model with the head-typing policies, Quest and
# StreamingLLM at the same sinks + window (the floor duo must beat), against
# f16. Head tables from kvx calibrate-heads (calibrated at 1024/2048 tokens;
# evaluated at 3072 so no calibration prompt is reused). Writes
# docs/results/head_typing/eval/report.{json,md}. A few minutes on 2 cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
H=docs/results/head_typing
KVX=${KVX:-build/kvx}
$KVX calibrate-heads -m "$M" --method duo -o $H/recall-duo.json
$KVX calibrate-heads -m "$M" --method razor -o $H/recall-razor.json
$KVX eval -m "$M" -q --tasks passkey -c 3072 --lengths 3072 --depths 0.25,0.75 --passkey-trials 2 \
  --baseline codec=f16 \
  --kv "codec=f16;policy=duo,heads=$H/recall-duo.json,retrieval=0.0625" \
  --kv "codec=f16;policy=razor,heads=$H/recall-razor.json,retrieval=0.0625,window_fraction=0" \
  --kv "codec=f16;policy=streamingllm,sinks=128,window=256" \
  --kv "codec=f16;policy=quest,budget=256" \
  --report $H/eval
