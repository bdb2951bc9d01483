#!/usr/bin/env python3
"""kvx perplexity against every full llama-perplexity run with an f32 or f16 KV cache in the
golden data, rendered as docs/results/golden_perplexity.md and the README's summary of it between
<!-- golden-ppl:begin --> and <!-- golden-ppl:end -->.

llama.cpp's runs: ../shared/golden/perplexity.json (stories260K, TinyStories-656K, probe),
../shared/golden/recall/llamacpp.json (recall, f16 KV) and tests/data/golden/
recall_perplexity_f32.json (recall, f32 KV; made by scripts/llamacpp_goldens.py).
Measuring writes docs/results/golden_perplexity.json (both sides, the commands, seconds);
the documents are rendered from that file alone.

Usage: scripts/golden_perplexity.py [--kvx build/kvx] [--shared ../shared] [--models probe,...]
       scripts/golden_perplexity.py --render-only     # documents from the committed JSON
       scripts/golden_perplexity.py --check           # fail if the documents differ from that render
"""
import argparse, json, os, re, subprocess, sys, time

from reportlib import ROOT, Output, rel

RAW = "docs/results/golden_perplexity.json"

MODELS = {
    "stories260K": "models/stories260K/stories260K-F32.gguf",
    "tinystories656K": "models/tinystories656K/TinyStories-656K-F32.gguf",
    "probe": "models/probe/probe-llama-6L-d256-f32.gguf",
    "recall": "models/recall/recall-llama-8L-d512-f16.gguf",
}
KV = {"f32/f32": "codec=f32", "f16/f16": "codec=f16"}


def llama_runs(shared):
    """Every successful f32/f16-KV llama-perplexity run: dicts with model, text, ctx, kv_cache, ppl,
    chunks (None: the whole file) and the command."""
    runs = []
    for run in json.load(open(os.path.join(shared, "golden/perplexity.json"))):
        if run.get("returncode") == 0 and run["kv_cache"] in KV:
            runs.append({"model": run["model"], "text": run["text"], "ctx": run["ctx"], "kv_cache": run["kv_cache"],
                         "ppl": run["ppl"], "chunks": None, "llama_command": run["command"]})
    recall = json.load(open(os.path.join(shared, "golden/recall/llamacpp.json")))
    for run in recall["results"]["perplexity"].values():
        if run["kv_types"] == ["f16", "f16"] and not run["flash_attn"]:
            ctx = int(re.search(r"-c (\d+)", run["command"]).group(1))
            runs.append({"model": "recall", "text": "recall_val", "ctx": ctx, "kv_cache": "f16/f16", "ppl": run["ppl"],
                         "chunks": len(run["running_ppl_per_chunk"]),
                         "llama_command": run["command"].replace("LLAMA_BUILD/bin/", "")})
    f32 = json.load(open(os.path.join(ROOT, "tests/data/golden/recall_perplexity_f32.json")))
    for run in f32["runs"]:
        runs.append({"model": "recall", "text": "recall_val", "ctx": run["ctx"], "kv_cache": "f32/f32",
                     "ppl": run["ppl"], "chunks": run["chunks"], "llama_command": run["command"]})
    return runs


def measure(args):
    rows = []
    for run in llama_runs(args.shared):
        if run["model"] not in args.models.split(","):
            continue
        text = os.path.join(args.shared, "golden", run["text"] + ".txt")
        cmd = [args.kvx, "perplexity", "-m", os.path.join(args.shared, MODELS[run["model"]]), "-f", text,
               "-c", str(run["ctx"]), "-t", args.threads, "--kv", KV[run["kv_cache"]]]
        if run["chunks"]:
            cmd += ["--chunks", str(run["chunks"])]
        t0 = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True)
        secs = time.time() - t0
        m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout)
        if not m:
            sys.exit("kvx failed: %s\n%s" % (" ".join(cmd), out.stderr))
        row = dict(run, kv=run["kv_cache"].split("/")[0], kvx_ppl=float(m.group(1)), seconds=round(secs, 1),
                   kvx_command=" ".join(rel(c) if c.startswith("/") else c for c in cmd))
        rows.append(row)
        print("%-16s %-22s c=%-5d kv=%-4s llama.cpp %10.4f  kvx %10.4f  (%+.4f%%, %.0f s)" % (
            row["model"], row["text"], row["ctx"], row["kv"], row["ppl"], row["kvx_ppl"],
            100.0 * (row["kvx_ppl"] - row["ppl"]) / row["ppl"], secs), flush=True)
    old = {}
    if os.path.exists(os.path.join(ROOT, RAW)):  # keep rows of models not measured this time
        for r in json.load(open(os.path.join(ROOT, RAW)))["rows"]:
            old[(r["model"], r["text"], r["ctx"], r["kv"])] = r
    for r in rows:
        old[(r["model"], r["text"], r["ctx"], r["kv"])] = r
    data = {"generated": time.strftime("%Y-%m-%d"), "threads": int(args.threads),
            "rows": sorted(old.values(), key=lambda r: (list(MODELS).index(r["model"]), r["text"], r["ctx"], r["kv"]))}
    with open(os.path.join(ROOT, RAW), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def render(out):
    data = json.load(open(os.path.join(ROOT, RAW)))
    lines = ["| model | text | ctx | chunks | KV | llama.cpp PPL | kvx PPL | diff |",
             "|---|---|---|---|---|---|---|---|"]
    diffs = []
    for r in data["rows"]:
        d = 100.0 * (r["kvx_ppl"] - r["ppl"]) / r["ppl"]
        diffs.append(abs(d))
        lines.append("| %s | %s | %d | %s | %s | %.4f | %.4f | %+.4f%% |" % (
            r["model"], r["text"], r["ctx"], r["chunks"] or "all", r["kv"], r["ppl"], r["kvx_ppl"], d))
    table = "\n".join(lines) + ("\n\nLargest difference: %.4f%% over %d runs (llama.cpp prints 4 decimals). "
                                "Measured %s; regenerate with `scripts/golden_perplexity.py`.\n" % (
                                    max(diffs), len(diffs), data["generated"]))
    out.write("docs/results/golden_perplexity.md",
              "# Perplexity: kvx vs llama.cpp\n\nEvery llama-perplexity run with an f32 or f16 KV cache in the "
              "golden data (`../shared/golden/perplexity.json`, `../shared/golden/recall/llamacpp.json`, "
              "`tests/data/golden/recall_perplexity_f32.json`; llama.cpp's protocol; KV f32 = `-ctk f32 -ctv f32`, "
              "f16 = its default) against `kvx perplexity ... --kv codec=f32|f16` with the same chunk count, "
              "%d threads. Raw data: `%s`.\n\n" % (data["threads"], RAW) + table)
    out.readme_block("golden-ppl", headline(data["rows"], data["generated"]))


def headline(rows, generated):
    """The README's summary: per model, how many runs and the largest difference (the full table is in
    docs/results/golden_perplexity.md)."""
    lines = ["| model | runs | contexts | KV caches | largest difference |", "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        lines.append("| %s | %d | %s | %s | %.4f%% |" % (
            model, len(mine), ", ".join(str(c) for c in sorted({r["ctx"] for r in mine})),
            ", ".join(sorted({r["kv"] for r in mine})),
            max(abs(100.0 * (r["kvx_ppl"] - r["ppl"]) / r["ppl"]) for r in mine)))
    return "\n".join(lines) + ("\n\nEvery run, text and chunk count: [docs/results/golden_perplexity.md]"
                               "(docs/results/golden_perplexity.md) (measured %s; regenerated by `scripts/golden_perplexity.py`).\n" % generated)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"))
    ap.add_argument("--shared", default=os.path.normpath(os.path.join(ROOT, "../shared")))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--render-only", action="store_true", help="render the documents from the committed JSON")
    ap.add_argument("--check", action="store_true", help="render in memory and fail on any difference")
    args = ap.parse_args()
    if not (args.render_only or args.check):
        measure(args)
    out = Output(args.check)
    render(out)
    out.finish("golden_perplexity")


if __name__ == "__main__":
    main()
