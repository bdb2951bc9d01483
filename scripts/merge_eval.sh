#!/bin/sh
# Passkey on the recall model: H2O dropping vs KVMerger (H2O + fate=merge,
# both weightings) at the same ratio, against f16. 3072 tokens, depths 0.25
# and 0.75, 2 trials each (a small sample, not the issue's sweep). Writes
# docs/results/merging/eval-r$R/report.{json,md}. A few minutes on 2 cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
R=${R:-0.75}
$KVX eval -m "$M" -q --tasks passkey -c 3072 --lengths 3072 --depths 0.25,0.75 --passkey-trials 2 \
  --baseline codec=f16 \
  --kv "codec=f16;policy=h2o,ratio=$R" \
  --kv "codec=f16;policy=kvmerger,ratio=$R" \
  --kv "codec=f16;policy=kvmerger,ratio=$R,merge_weight=gauss" \
  --report docs/results/merging/eval-r$R
