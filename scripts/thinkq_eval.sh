#!/bin/sh
# ThinK over quantized codecs (docs/kv-think.md, "Quantized codecs") on the recall model at 2048 tokens:
# perplexity and KLD vs the f16 baseline (2 chunks of recall_val.txt; the first 75% of each chunk prefilled
# and compressed once with the question excluded, the rest scored token by token), and the pool's bytes at
# the end of each chunk: int4 and int8 alone, with think lambda=0.5, int4 with snapkv 0.5 then think 0.5, and
# the f16 counterparts. Writes docs/results/think/thinkq-excluded/report.{json,md}; then
# scripts/splice_table.py thinkq splices the table of docs/kv-think.md from the report. A few minutes on 2
# shared cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
$KVX eval -m "$M" -q --tasks ppl,kld -f ../shared/golden/recall_val.txt -c 2048 --chunks 2 \
  --compress excluded -t 2 --baseline codec=f16 \
  --kv "codec=f16;policy=think,lambda=0.5" \
  --kv "codec=f16;policy=snapkv,ratio=0.5;policy=think,lambda=0.5" \
  --kv "codec=int8" \
  --kv "codec=int8;policy=think,lambda=0.5" \
  --kv "codec=int4,rotate=none" \
  --kv "codec=int4,rotate=none;policy=think,lambda=0.5" \
  --kv "codec=int4,rotate=none;policy=snapkv,ratio=0.5" \
  --kv "codec=int4,rotate=none;policy=snapkv,ratio=0.5;policy=think,lambda=0.5" \
  --report docs/results/think/thinkq-excluded
python3 scripts/splice_table.py thinkq
