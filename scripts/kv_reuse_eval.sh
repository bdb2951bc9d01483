#!/bin/sh
# Chunk reuse (docs/kv-reuse.md) on the recall model: kvx eval --tasks rag
# with every repair (none, epic k=1,4,16, blend r=0.05,0.15,0.3, blend
# r=0.05 with k=16, full) at SIZES tokens of documents (default
# 2048,4096,7168: 7168 is the 8k size, whose prompt still fits the model's
# 8192-token context), QUESTIONS questions each (one count for every size, or
# one per size: 30,30,12), f16 pages (SPEC), for the needle in one document
# (NEEDLE=whole) and cut between two chunks (NEEDLE=split: the answer needs
# cross-chunk attention). Each size is one kvx run whose table and JSON
# (per-question answers, McNemar against full) land in OUT as it finishes; a
# size already in OUT is not run again, so an interrupted run resumes. Then
# splices the tables into docs/kv-reuse.md between
# <!-- rag-table-NEEDLE:begin --> and <!-- rag-table-NEEDLE:end -->, and the
# README's line between <!-- rag-line:begin --> and <!-- rag-line:end -->
# (from the split table's largest size). An hour and more on 2 loaded cores
# at 30 questions; run with nice.
set -e
cd "$(dirname "$0")/.."
M=${M:-../shared/models/recall/recall-llama-8L-d512-f16.gguf}
KVX=${KVX:-build/kvx}
SIZES=${SIZES:-2048,4096,7168}
QUESTIONS=${QUESTIONS:-30,30,12}
SPEC=${SPEC:-codec=f16}
NEEDLE=${NEEDLE:-whole}
OUT=${OUT:-/tmp/kvx-rag-$NEEDLE}
mkdir -p "$OUT"
i=1
for size in $(echo "$SIZES" | tr , ' '); do
  q=$(echo "$QUESTIONS" | cut -d, -f$i)
  [ -n "$q" ] || q=$(echo "$QUESTIONS" | tr , '\n' | tail -n 1)
  i=$((i + 1))
  [ -s "$OUT/$size-$q.md" ] && continue
  start=$(date +%s)
  $KVX eval -m "$M" -q --tasks rag --kv "$SPEC" --rag-sizes "$size" --rag-questions "$q" \
    --rag-needle "$NEEDLE" -t 2 --data ../shared/data --json "$OUT/$size-$q.json" > "$OUT/$size-$q.tmp"
  mv "$OUT/$size-$q.tmp" "$OUT/$size-$q.md"
  echo "$size tokens, $q questions: $(( $(date +%s) - start )) s" | tee -a "$OUT/seconds.txt" >&2
done
python3 - "$OUT" "$SIZES" "$QUESTIONS" "$SPEC" "$NEEDLE" <<'PY'
import sys, re, os
out, sizes, questions, spec, needle = sys.argv[1:6]
counts = questions.split(",")
table = ""
for i, size in enumerate(sizes.split(",")):
    lines = open(os.path.join(out, "%s-%s.md" % (size, counts[min(i, len(counts) - 1)]))).read().splitlines(True)
    table += "".join(lines if not table else lines[2:])
def splice(page, marker, body):
    text = open(page).read()
    new = "<!-- %s:begin -->\n%s<!-- %s:end -->" % (marker, body, marker)
    text, n = re.subn(r"<!-- %s:begin -->.*?<!-- %s:end -->" % (marker, marker), lambda m: new, text, flags=re.S)
    if n != 1:
        sys.exit("%s has no %s markers" % (page, marker))
    open(page, "w").write(text)
cmd = ("`NEEDLE=%s SIZES=%s QUESTIONS=%s SPEC=%s scripts/kv_reuse_eval.sh`: per size `kvx eval --tasks rag --kv %s "
       "--rag-sizes SIZE --rag-questions N --rag-needle %s -t 2 --json FILE`\n\n" % (needle, sizes, questions, spec,
                                                                                     spec, needle))
splice("docs/kv-reuse.md", "rag-table-" + needle, cmd + table)
if needle == "split":
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]]
    size = max(int(r[0]) for r in rows)
    cell = {r[1]: r for r in rows if int(r[0]) == size}
    def say(name):
        r = cell[name]
        verdict = "" if name == "full" else ", %s vs full" % r[3].split(" (")[0]
        return "`%s` %s%s, KLD %s, %sx TTFT" % (name, r[2].split(" =")[0], verdict, r[4], r[6])
    line = ("Chunk reuse, %d tokens of shuffled documents with the needle cut across two chunks (recall model, "
            "`scripts/kv_reuse_eval.sh`): %s; %s; %s; %s.\n" % (size, say("full"), say("none"),
                                                                say("epic,k=16"), say("blend,r=0.05,layer=1,k=16")))
    splice("README.md", "rag-line", line)
print(table, end="")
PY
