#!/bin/sh
# Chunk reuse (docs/kv-reuse.md) on the recall model: kvx eval --tasks rag
# with every repair (none, epic k=1,4,16, blend r=0.05,0.15,0.3, blend
# r=0.05 with k=16, full) at SIZES tokens of documents (default
# 2048,4096), QUESTIONS questions each, f16 pages (SPEC), for the needle in
# one document (NEEDLE=whole) and cut between two chunks (NEEDLE=split: the
# answer needs cross-chunk attention), then splices the table into
# docs/kv-reuse.md between <!-- rag-table-NEEDLE:begin --> and
# <!-- rag-table-NEEDLE:end -->, and the README's line between
# <!-- rag-line:begin --> and <!-- rag-line:end --> (from the split table's
# largest size). Tens of minutes on 2 loaded cores; run with nice.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
SIZES=${SIZES:-2048,4096}
QUESTIONS=${QUESTIONS:-12}
SPEC=${SPEC:-codec=f16}
NEEDLE=${NEEDLE:-whole}
TABLE=$(mktemp)
trap 'rm -f "$TABLE"' EXIT
$KVX eval -m "$M" -q --tasks rag --kv "$SPEC" --rag-sizes "$SIZES" --rag-questions "$QUESTIONS" \
  --rag-needle "$NEEDLE" -t 2 --data ../shared/data > "$TABLE"
python3 - "$TABLE" "$SIZES" "$QUESTIONS" "$SPEC" "$NEEDLE" <<'PY'
import sys, re
table, sizes, questions, spec, needle = open(sys.argv[1]).read(), *sys.argv[2:6]
def splice(page, marker, body):
    text = open(page).read()
    new = "<!-- %s:begin -->\n%s<!-- %s:end -->" % (marker, body, marker)
    text, n = re.subn(r"<!-- %s:begin -->.*?<!-- %s:end -->" % (marker, marker), lambda m: new, text, flags=re.S)
    if n != 1:
        sys.exit("%s has no %s markers" % (page, marker))
    open(page, "w").write(text)
cmd = ("`NEEDLE=%s SIZES=%s QUESTIONS=%s SPEC=%s scripts/kv_reuse_eval.sh`: `kvx eval --tasks rag --kv %s "
       "--rag-sizes %s --rag-questions %s --rag-needle %s -t 2`\n\n" % (needle, sizes, questions, spec, spec, sizes,
                                                                      questions, needle))
splice("docs/kv-reuse.md", "rag-table-" + needle, cmd + table)
if needle == "split":
    rows = [r.split("|")[1:-1] for r in table.splitlines()[2:]]
    size = max(int(r[0]) for r in rows)
    cell = {r[1].strip(): r for r in rows if int(r[0]) == size}
    def say(name):
        r = cell[name]
        return "`%s` %s, KLD %s, %sx TTFT" % (name, r[2].strip().split(" =")[0], r[3].strip(), r[5].strip())
    line = ("Chunk reuse, %d tokens of shuffled documents with the needle cut across two chunks (recall model, "
            "`scripts/kv_reuse_eval.sh`): %s; %s; %s; %s.\n" % (size, say("full"), say("none"),
                                                                say("epic,k=16"), say("blend,r=0.05,layer=1,k=16")))
    splice("README.md", "rag-line", line)
print(table, end="")
PY
