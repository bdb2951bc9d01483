#!/usr/bin/env python3
"""Runs `kvx perplexity` for every llama.cpp run in ../shared/golden/perplexity.json
(f32 and f16 KV caches) and writes docs/results/golden_perplexity.md plus the
README section between <!-- golden-ppl:begin --> and <!-- golden-ppl:end -->.

Usage: scripts/golden_perplexity.py [--kvx build/kvx] [--shared ../shared] [--models probe,...]
"""
import argparse, json, os, re, subprocess, sys, time

MODELS = {
    "stories260K": "models/stories260K/stories260K-F32.gguf",
    "tinystories656K": "models/tinystories656K/TinyStories-656K-F32.gguf",
    "probe": "models/probe/probe-llama-6L-d256-f32.gguf",
}
KV = {"f32/f32": "codec=f32", "f16/f16": "codec=f16"}

def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvx", default=os.path.join(root, "build/kvx"))
    ap.add_argument("--shared", default=os.path.join(root, "../shared"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="2")
    args = ap.parse_args()
    runs = json.load(open(os.path.join(args.shared, "golden/perplexity.json")))
    rows = []
    for run in runs:
        if run["model"] not in args.models.split(",") or run.get("returncode") != 0:
            continue
        if run["kv_cache"] not in KV:
            continue
        text = os.path.join(args.shared, "golden", run["text"] + ".txt")
        cmd = [args.kvx, "perplexity", "-m", os.path.join(args.shared, MODELS[run["model"]]), "-f", text,
               "-c", str(run["ctx"]), "-t", args.threads, "--kv", KV[run["kv_cache"]]]
        t0 = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True)
        secs = time.time() - t0
        m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout)
        if not m:
            sys.exit("kvx failed: %s\n%s" % (" ".join(cmd), out.stderr))
        ours, ref = float(m.group(1)), float(run["ppl"])
        rows.append((run["model"], run["text"], run["ctx"], run["kv_cache"].split("/")[0], ref, ours,
                     100.0 * (ours - ref) / ref, secs))
        print("%-16s %-22s c=%-5d kv=%-4s llama.cpp %10.4f  kvx %10.4f  (%+.4f%%, %.0f s)" % rows[-1], flush=True)
    lines = ["| model | text | ctx | KV | llama.cpp PPL | kvx PPL | diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %d | %s | %.4f | %.4f | %+.4f%% |" % r[:7])
    worst = max(abs(r[6]) for r in rows) if rows else 0
    table = "\n".join(lines) + "\n\nLargest difference: %.4f%% over %d runs. Regenerate with `scripts/golden_perplexity.py`.\n" % (worst, len(rows))
    os.makedirs(os.path.join(root, "docs/results"), exist_ok=True)
    with open(os.path.join(root, "docs/results/golden_perplexity.md"), "w") as f:
        f.write("# Perplexity: kvx vs llama.cpp\n\nEvery llama-perplexity run of `../shared/golden/perplexity.json` "
                "(llama.cpp's protocol; KV f32 = `-ctk f32 -ctv f32`, f16 = its default) against "
                "`kvx perplexity ... --kv codec=f32|f16`, 2 threads.\n\n" + table)
    readme = os.path.join(root, "README.md")
    s = open(readme).read()
    s = re.sub(r"(<!-- golden-ppl:begin -->\n).*?(<!-- golden-ppl:end -->)", lambda m: m.group(1) + table + m.group(2),
               s, flags=re.S)
    open(readme, "w").write(s)

if __name__ == "__main__":
    main()
