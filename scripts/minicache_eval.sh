#!/bin/sh
# MiniCache (policy=minicache, docs/kv-merging.md) on the recall model:
# passkey and niah_multikey at 2048 tokens, depths 0, 0.5, 1, 2 trials each,
# the cache merged once with the question included (MODE=excluded for the
# other moment), against the f16 baseline: the default (start = n_layers/2,
# t 0.6, gamma 0.05), every layer paired (start=0), half the tokens retained
# (gamma=0.5), and int8 pages merged. Writes
# docs/results/merging/minicache-$MODE/report.{json,md}, then scripts/splice_table.py splices
# the MiniCache table of docs/kv-merging.md from the reports. Minutes on 2 cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
MODE=${MODE:-included}
$KVX eval -m "$M" -q --tasks passkey,niah_multikey -c 2048 --lengths 2048 --depths 0,0.5,1 \
  --passkey-trials 2 --ruler-trials 2 --compress "$MODE" -t 2 --data ../shared/data \
  --baseline codec=f16 \
  --kv "codec=f16;policy=minicache" \
  --kv "codec=f16;policy=minicache,start=0" \
  --kv "codec=f16;policy=minicache,gamma=0.5" \
  --kv "codec=int8;policy=minicache" \
  --report docs/results/merging/minicache-$MODE
python3 scripts/splice_table.py minicache
