#!/bin/sh
# Passkey on the recall model with the head-typing policies, Quest and
# StreamingLLM at the same sinks + window (the floor duo must beat), against
# f16. Head tables from kvx calibrate-heads: duo on natural-text copying (the
# default, leak-free) and on passkey prompts (leaky, for comparison), razor
# on repeated random tokens. Writes docs/results/head_typing/eval/report.{json,md}
# (passkey, 3072 tokens) and retrieval.eval.json: a number hidden in natural
# text (niah_number) at 2048 and 4096 tokens, 50 prompts per length, with each
# duo table at retrieval=0.25 (mode=once, so the specs share each prefill).
# Half an hour on 2 loaded cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
H=docs/results/head_typing
KVX=${KVX:-build/kvx}
$KVX calibrate-heads -m "$M" --method duo -o $H/recall-duo.json
$KVX calibrate-heads -m "$M" --method duo --calib passkey -o $H/recall-duo-passkey.json
$KVX calibrate-heads -m "$M" --method razor -o $H/recall-razor.json
$KVX eval -m "$M" -q --tasks passkey -c 3072 --lengths 3072 --depths 0.25,0.75 --passkey-trials 2 \
  --baseline codec=f16 \
  --kv "codec=f16;policy=duo,heads=$H/recall-duo.json,retrieval=0.0625" \
  --kv "codec=f16;policy=razor,heads=$H/recall-razor.json,retrieval=0.0625,window_fraction=0" \
  --kv "codec=f16;policy=streamingllm,sinks=128,window=256" \
  --kv "codec=f16;policy=quest,budget=256" \
  --report $H/eval
$KVX eval -m "$M" -q --tasks niah_number -c 4096 --lengths 2048,4096 --depths 0.1,0.3,0.5,0.7,0.9 --ruler-trials 10 \
  --baseline codec=f16 --compress included \
  --kv "codec=f16;policy=duo,heads=$H/recall-duo.json,retrieval=0.25,mode=once" \
  --kv "codec=f16;policy=duo,heads=$H/recall-duo-needle-passkey.json,retrieval=0.25,mode=once" \
  --kv "codec=f16;policy=duo,heads=$H/recall-duo-passkey.json,retrieval=0.25,mode=once" \
  --kv "codec=f16;policy=duo,heads=$H/recall-duo.json,retrieval=0.0625,mode=once" \
  --json $H/retrieval.eval.json
