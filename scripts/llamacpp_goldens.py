#!/usr/bin/env python3
"""Golden data from llama.cpp that ../shared/golden lacks, written to tests/data/golden/.

../shared/golden is read-only and was made by llama.cpp commit c392e50 (CPU build);
this script runs the same tools with the same protocol (the commands recorded in
../shared/golden/perplexity.json and recall/llamacpp.json) for the runs a golden test
needs and that are missing there:

  recall_perplexity_f32.json   llama-perplexity on recall_val.txt with an f32 KV cache
                               (-ctk f32 -ctv f32) at c = 512 (16 chunks) and 2048
                               (8 chunks): llamacpp.json has these runs only with f16 KV.

Goldens come from llama.cpp only, never from kvx's own output. kvx never builds or
ships llama.cpp: point --llama-bin at the bin/ folder of a build made elsewhere.

Usage: scripts/llamacpp_goldens.py --llama-bin DIR [--shared ../shared] [--threads 2]
"""
import argparse, json, os, re, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/data/golden")

RECALL_MODEL = "models/recall/recall-llama-8L-d512-f16.gguf"
RECALL_TEXT = "golden/recall_val.txt"
# (ctx, chunks): the f16 runs of recall/llamacpp.json, here with f32 K and V.
RECALL_F32_RUNS = [(512, 16), (2048, 8)]


def llama_perplexity(args, model, text, ctx, chunks, extra):
    """Runs llama-perplexity as ../shared/golden did and parses its running PPL per chunk."""
    # The command of recall/llamacpp.json (default batch 2048), run from the shared
    # folder so the recorded paths are the relative ones it records.
    cmd = [os.path.join(args.llama_bin, "llama-perplexity"), "-m", model, "-f", text, "-t", str(args.threads),
           "-c", str(ctx), "--chunks", str(chunks)] + extra
    t0 = time.time()
    r = subprocess.run(cmd, cwd=args.shared, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("llama-perplexity failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-3000:]))
    log = r.stdout + r.stderr
    running = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+)", log)]
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if not m or len(running) != chunks:
        sys.exit("could not parse llama-perplexity output of %s\n%s" % (" ".join(cmd), log[-3000:]))
    return {"command": " ".join(["llama-perplexity"] + cmd[1:]), "ctx": ctx, "chunks": chunks,
            "ppl": float(m.group(1)), "ppl_pm": float(m.group(2)), "final_line": m.group(0),
            "running_ppl_by_chunk": running, "wall_s": round(time.time() - t0, 1),
            "kv_cache": "f32/f32"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True, help="bin/ folder of a llama.cpp CPU build (c392e50)")
    ap.add_argument("--shared", default=os.path.normpath(os.path.join(ROOT, "../shared")))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.shared = os.path.abspath(args.shared)
    os.makedirs(OUT, exist_ok=True)
    runs = []
    for ctx, chunks in RECALL_F32_RUNS:
        run = llama_perplexity(args, RECALL_MODEL, RECALL_TEXT, ctx, chunks, ["-ctk", "f32", "-ctv", "f32"])
        print("recall c=%d f32 KV: %s (%.0f s)" % (ctx, run["final_line"], run["wall_s"]), flush=True)
        runs.append(run)
    doc = {"generator": "scripts/llamacpp_goldens.py",
           "llama_cpp": "CPU build of c392e5094deaf2d1a7c18683214f007fad3fe42b (as ../shared/golden), %d threads"
                        % args.threads,
           "model": RECALL_MODEL, "text": RECALL_TEXT, "runs": runs}
    with open(os.path.join(OUT, "recall_perplexity_f32.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote tests/data/golden/recall_perplexity_f32.json")


if __name__ == "__main__":
    main()
