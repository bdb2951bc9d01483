#!/usr/bin/env python3
"""The KV tiers' storage codec on the recall model (docs/tiers.md#the-storage-codec): bytes per token and
KLD against f16 pages at each storage level (`kvx eval --tasks kld --storage-codec LEVEL`: the context's
256-token blocks go through the tier block format and back, as a tier hit loads them, then the rest of
each chunk is scored teacher-forced), beside KIVI-4 and int4 pages in the pool. Prints a Markdown table
and, with --write, splices it into docs/tiers.md between <!-- storage-codec:begin --> and
<!-- storage-codec:end -->.

  scripts/storage_codec_report.py --chunks 2 --write     # needs build/kvx and ../shared
  scripts/storage_codec_report.py --chunks 2 --levels compact   # one level, printed only
"""
import argparse, os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KVX_SHARED", os.path.join(ROOT, "..", "shared"))
F16_BYTES_PER_TOKEN = 4096  # recall: 8 layers x 2 kv heads x 64 x (K, V) x 2 bytes
LEVELS = ["lossless", "high", "medium", "low", "compact"]
# compact codes pre-RoPE keys (docs/tiers.md#the-compact-level), against the same f16 baseline.
LEVEL_SPEC = {level: "codec=f16" for level in LEVELS} | {"compact": "codec=f16,prerope=1"}
LEVEL_ROW = {level: "f16 pool, tier block `--cache-codec %s`" % level for level in LEVELS} | {
    "compact": "f16 pool `prerope=1`, tier block at `compact`"}


def eval_rows(kvx, model, text, chunks, specs, storage=None):
    """The non-baseline rows of one `kvx eval --tasks kld` run: (spec, vs f16, KLD mean, KLD p99, top-1)."""
    cmd = [kvx, "eval", "-m", model, "--baseline", "codec=f16", "--tasks", "kld", "-f", text, "-c", "2048",
           "--chunk", "2048", "--chunks", str(chunks), "-t", "2"]
    for s in specs:
        cmd += ["--kv", s]
    if storage:
        cmd += ["--storage-codec", storage]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].isdigit() and cells[0] != "0":
            ratio = float(cells[3].rstrip("×"))
            rows.append((cells[1].strip("`"), ratio, cells[4], cells[5], cells[6]))
    if len(rows) != len(specs):
        sys.exit("unexpected kvx eval output:\n" + out)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--model", default=os.path.join(SHARED, "models", "recall", "recall-llama-8L-d512-f16.gguf"))
    ap.add_argument("--text", default=os.path.join(SHARED, "golden", "recall_val.txt"))
    ap.add_argument("--chunks", type=int, default=2, help="2048-token chunks (1536 context + 511 scored each)")
    ap.add_argument("--levels", nargs="+", default=LEVELS, choices=LEVELS, help="storage levels to measure")
    ap.add_argument("--write", action="store_true", help="splice the table into docs/tiers.md")
    args = ap.parse_args()
    table = ["| KV as stored | bytes / token | vs f16 | KLD mean | KLD p99 | top-1 |", "|---|---:|---:|---:|---:|---:|"]
    for level in args.levels:
        (_, ratio, mean, p99, top1), = eval_rows(args.kvx, args.model, args.text, args.chunks, [LEVEL_SPEC[level]],
                                                 level)
        table.append("| %s | %.0f | %.2f× | %s | %s | %s |" %
                     (LEVEL_ROW[level], F16_BYTES_PER_TOKEN / ratio, ratio, mean, p99, top1))
    for spec, ratio, mean, p99, top1 in eval_rows(args.kvx, args.model, args.text, args.chunks,
                                                   ["codec=kivi4,page=16", "codec=int4,rotate=none"]):
        table.append("| pool pages `%s` (no tier) | %.0f | %.2f× | %s | %s | %s |" %
                     (spec, F16_BYTES_PER_TOKEN / ratio, ratio, mean, p99, top1))
    text = "\n".join(table)
    print(text)
    if args.write:
        path = os.path.join(ROOT, "docs", "tiers.md")
        doc = open(path).read()
        new = re.sub(r"(<!-- storage-codec:begin -->\n).*?(<!-- storage-codec:end -->)",
                     lambda mo: mo.group(1) + text + "\n" + mo.group(2), doc, flags=re.S)
        if new == doc and "<!-- storage-codec:begin -->" not in doc:
            sys.exit("docs/tiers.md has no <!-- storage-codec:begin --> marker")
        open(path, "w").write(new)


if __name__ == "__main__":
    main()
