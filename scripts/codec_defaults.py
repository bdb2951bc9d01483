#!/usr/bin/env python3
"""The evidence for each codec's default settings (docs/kv-quantization.md, "Codec defaults"): kvx eval's
teacher-forced KLD against an f32 cache on 4096-token chunks of WikiText-2's test split (held out of the recall
model's training), several chunks, for candidate settings of every quantized codec, with the pool's measured bytes.

  scripts/codec_defaults.py --run [CODEC ...]  # run kvx eval (build/kvx) per codec, then render
  scripts/codec_defaults.py                    # render the table from docs/results/codec_defaults/*.json
"""
import json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs/results/codec_defaults")
KVX = os.environ.get("KVX_BIN", os.path.join(ROOT, "build/kvx"))  # a copy keeps a long run safe from rebuilds
SHARED = os.environ.get("KVX_SHARED", os.path.join(ROOT, "..", "shared"))
MODEL = os.path.join(SHARED, "models/recall/recall-llama-8L-d512-f16.gguf")
TEXT = os.path.join(SHARED, "data/wikitext-2-raw/wiki.test.raw")
CHUNK, CHUNKS = 4096, 4

# Explicit settings only (never a bare codec=X), so every row keeps its meaning whatever the defaults become.
KIVI = ["page=16,group=32,residual=32", "page=32,group=32,residual=32,prerope=1", "page=128,group=32,residual=0",
        "page=128,group=64,residual=0", "page=128,group=64,residual=0,prerope=1", "page=128,group=64,residual=0,rotate=hadamard",
        "page=128,group=64,residual=0,prerope=1,rotate=hadamard", "page=128,group=64,residual=0,clip=1",
        "page=64,group=64,residual=0,rotate=hadamard", "page=128,group=64,residual=32,rotate=hadamard"]
PER_TOKEN = ["page=16,group=32", "page=16,group=64", "page=16,group=32,sym=1", "page=16,group=32,rotate=hadamard",
             "page=16,group=32,clip=1", "page=16,group=64,rotate=hadamard", "page=128,group=32"]
CANDIDATES = {"kivi2": KIVI, "kivi4": KIVI, "int2": PER_TOKEN, "int4": PER_TOKEN, "int8": PER_TOKEN[:3]}


def run(codec):
    out = os.path.join(RESULTS, "%s.json" % codec)
    cmd = [KVX, "eval", "-m", MODEL, "--tasks", "kld", "-f", TEXT, "-c", str(CHUNK),
           "--chunks", str(CHUNKS), "-t", "2", "-q", "--json", out]
    for s in CANDIDATES[codec]:
        cmd += ["--kv", "codec=%s,%s" % (codec, s)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


# The settings a bare codec=X gets (kv::DefaultsOf), as the canonical form of the candidate that names them.
DEFAULTS = {"kivi2": "codec=kivi2,page=128,group=64,residual=0,rotate=hadamard,prerope=1",
            "kivi4": "codec=kivi4,page=128,group=64,residual=0,rotate=hadamard,prerope=1",
            "int8": "codec=int8,page=16,group=32", "int4": "codec=int4,page=16,group=32,rotate=hadamard",
            "int2": "codec=int2,page=16,group=32,clip=1"}


def table():
    """The evidence table (kv_quant_report.py renders it into docs/kv-quantization.md)."""
    rows = ["| codec | `--kv` (explicit) | KV bytes at 4096 (vs f16) | KLD mean ± stderr | top-1 | |",
            "|---|---|---:|---|---:|---|"]
    for codec in CANDIDATES:
        path = os.path.join(RESULTS, "%s.json" % codec)
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        for r in d["results"]:
            k = r.get("kld")
            if r.get("baseline") or not k:
                continue
            mark = "**the default** (`codec=%s`)" % codec if r["canonical"] == DEFAULTS.get(codec) else ""
            rows.append("| %s | `%s` | %d (%.2f×) | %.4f ± %.4f | %.1f%% | %s |" % (
                codec, r["canonical"], r["kv"]["peak_bytes"], r["kv"]["compression_vs_f16"], k["mean"], k["mean_stderr"],
                100 * k["top1"], mark))
    return "\n".join(rows) + "\n"


def render():
    """docs/kv-quantization.md is rendered as a whole by kv_quant_report.py, which takes table() from here."""
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts/kv_quant_report.py"), "--render-only"], check=True)


if __name__ == "__main__":
    if "--run" in sys.argv:
        os.makedirs(RESULTS, exist_ok=True)
        for codec in [a for a in sys.argv[1:] if a != "--run"] or list(CANDIDATES):
            run(codec)
    render()
