#!/bin/sh
# Chunk reuse (docs/kv-reuse.md) on the recall model: kvx eval --tasks rag
# with every repair (none, epic k=1,4,16, blend r=0.05,0.15,0.3, full) at
# SIZES tokens of documents (default 2048,4096), QUESTIONS questions each,
# f16 pages (SPEC), then splices the table into docs/kv-reuse.md between
# <!-- rag-table:begin --> and <!-- rag-table:end -->. Minutes on 2 cores.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
SIZES=${SIZES:-2048,4096}
QUESTIONS=${QUESTIONS:-12}
SPEC=${SPEC:-codec=f16}
TABLE=$(mktemp)
trap 'rm -f "$TABLE"' EXIT
$KVX eval -m "$M" -q --tasks rag --kv "$SPEC" --rag-sizes "$SIZES" --rag-questions "$QUESTIONS" -t 2 \
  --data ../shared/data > "$TABLE"
python3 - "$TABLE" "$SIZES" "$QUESTIONS" "$SPEC" <<'PY'
import sys, re
table, sizes, questions, spec = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], sys.argv[4]
page = "docs/kv-reuse.md"
text = open(page).read()
cmd = ("`scripts/kv_reuse_eval.sh` (SIZES=%s QUESTIONS=%s SPEC=%s): "
       "`kvx eval --tasks rag --kv %s --rag-sizes %s --rag-questions %s -t 2`\n\n" % (sizes, questions, spec, spec, sizes, questions))
new = "<!-- rag-table:begin -->\n" + cmd + table + "<!-- rag-table:end -->"
text, n = re.subn(r"<!-- rag-table:begin -->.*?<!-- rag-table:end -->", lambda m: new, text, flags=re.S)
if n != 1:
    sys.exit("docs/kv-reuse.md has no rag-table markers")
open(page, "w").write(text)
print(table, end="")
PY
