#!/bin/sh
# ThinK (policy=think, docs/kv-think.md) on the recall model at 2048 tokens: passkey (depths 0, 0.5, 1,
# 2 trials each), perplexity and KLD vs the f16 baseline (2 chunks of recall_val.txt; the first 75% of each
# chunk (kvx eval --kld-context) compressed, the rest scored token by token), the cache compressed once
# with the question excluded (MODE=included for the other moment): lambda 0.25 / 0.4 / 0.5, snapkv 0.5
# alone and snapkv 0.5 then think 0.4. Writes docs/results/think/think-$MODE/report.{json,md};
# then scripts/splice_table.py splices the table of docs/kv-think.md from the reports. A few minutes on 2
# shared cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
MODE=${MODE:-excluded}
$KVX eval -m "$M" -q --tasks passkey,ppl,kld -f ../shared/golden/recall_val.txt -c 2048 --lengths 2048 \
  --depths 0,0.5,1 --passkey-trials 2 --chunks 2 --compress "$MODE" -t 2 --data ../shared/data \
  --baseline codec=f16 \
  --kv "codec=f16;policy=think,lambda=0.25" \
  --kv "codec=f16;policy=think,lambda=0.4" \
  --kv "codec=f16;policy=think,lambda=0.5" \
  --kv "codec=f16;policy=snapkv,ratio=0.5" \
  --kv "codec=f16;policy=snapkv,ratio=0.5;policy=think,lambda=0.4" \
  --report docs/results/think/think-$MODE
python3 scripts/splice_table.py think
