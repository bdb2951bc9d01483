#!/usr/bin/env python3
"""KV-cache quantization report: see scripts/kv_quant_report.sh for usage.

Measures every codec configuration in SPECS on the real models in
../shared/models with `kvx inspect` (exact bytes/token) and `kvx eval`
(baseline codec=f16: perplexity, mean KLD, top-1 agreement, copy accuracy),
compares kvx's int8/int4 caches with llama.cpp's q8_0/q4_0 perplexities
(../shared/golden/perplexity_kvquant.json) on the probe model, optionally runs
`kvx bench` on synthetic model shapes, and writes docs/kv-quantization.md plus
the README's headline (the recommended settings) between the kv-quant markers.

Every number in the documents is rendered from the raw JSON in docs/results/kv_quant/
(the llama.cpp reference perplexities are copied into llama_ppl.json when measured), so
`--render-only` rebuilds them without ../shared and `--check` (a ctest) fails when the
committed documents differ from that render.
"""
import argparse, json, os, re, statistics, subprocess, sys, time

from reportlib import ROOT, Output, rel, sub_command_paths
import codec_defaults

RESULTS = os.path.join(ROOT, "docs/results/kv_quant")

# (model key, gguf, eval text, context, chunks, quick chunks)
MODELS = [
    ("stories260K", "models/stories260K/stories260K-F32.gguf", "golden/stories_eval.txt", 512, 40, 4),
    ("tinystories656K", "models/tinystories656K/TinyStories-656K-F32.gguf", "golden/stories_eval.txt", 512, 40, 4),
    ("probe", "models/probe/probe-llama-6L-d256-f32.gguf", "golden/probe_val.txt", 2048, 16, 3),
    # The model that can retrieve (../shared/models/recall): d 64 heads with real outlier channels.
    ("recall", "models/recall/recall-llama-8L-d512-f16.gguf", "golden/recall_val.txt", 2048, 2, 1),
]

# (label, spec, method). The first is the baseline.
BEST4 = "codec=kivi4,page=256,group=64,prerope=1,residual=0"
BEST2 = "codec=kivi2,page=128,group=64,prerope=1"
BEST2_R0 = BEST2 + ",residual=0"
INT2 = "codec=int2,clip=0"
SPECS = [
    ("f16", "codec=f16", "baseline"),
    ("int8", "codec=int8", "per-token int8, scale + zero point per 32 channels"),
    ("int8 sym (≈ q8_0)", "codec=int8,sym=1", "llama.cpp q8_0 counterpart: scale only"),
    ("int4", "codec=int4,rotate=none", "per-token int4, scale + zero point per 32 channels"),
    ("int4 sym (≈ q4_0)", "codec=int4,sym=1,rotate=none", "llama.cpp q4_0 counterpart: scale only"),
    ("int4 + Hadamard", "codec=int4,group=64,sym=1,rotate=hadamard", "QuaRot: rotate, then per-token 4-bit"),
    ("KIVI-4 (G=R=32)", "codec=kivi4,page=32", "KIVI paper setting"),
    ("KIVI-4 + pre-RoPE (G=R=32)", "codec=kivi4,page=32,prerope=1", "KVQuant's pre-RoPE keys"),
    ("KIVI-4 + pre-RoPE, G=256, R=0", BEST4, "best 4-bit"),
    ("int2", INT2, "plain per-token int2 (the 2-bit reference)"),
    ("int2 + MSE clip", "codec=int2,clip=1", "range search per group"),
    ("int2 + Hadamard", "codec=int2,rotate=hadamard", "RotateKV-style rotation"),
    ("int2 + 1% outliers", "codec=int2,outliers=0.01,clip=0", "KVQuant dense-and-sparse"),
    ("KIVI-2 (G=R=32)", "codec=kivi2,page=32", "KIVI paper setting"),
    ("KIVI-2 + pre-RoPE (G=R=32)", "codec=kivi2,page=32,prerope=1", "KVQuant's pre-RoPE keys"),
    ("KIVI-2 + pre-RoPE, G=128, R=0", BEST2_R0, "no residual window"),
    ("KIVI-2 + pre-RoPE, G=128, R=32", BEST2, "best 2-bit"),
    ("… R=0 + 1% outliers", BEST2_R0 + ",outliers=0.01", "dense-and-sparse"),
    ("KIVI-2 + pre-RoPE + sink page", "codec=kivi2,page=32,prerope=1,sinks=1", "attention sink kept in f16"),
    ("… R=0, layer 0 at k8v4", BEST2_R0 + ",bits.0=k8v4", "KVTuner-style per-layer bits"),
    ("KIVI k4v2 + pre-RoPE", "codec=kivi4,page=128,group=64,prerope=1,residual=0,bits=k4v2", "keys need more bits"),
]
QUICK = {"codec=f16", "codec=int8", "codec=int4,rotate=none", INT2, BEST4, BEST2, BEST2_R0}

# kvx perplexity on probe_val against llama.cpp's quantized KV caches.
LLAMA_PPL = [  # (ctx, kvx spec, llama.cpp kv_cache label or None)
    (512, "codec=f16", "f16/f16"),
    (512, "codec=int8,sym=1", "q8_0/q8_0"),
    (512, "codec=int8", "q8_0/q8_0"),
    (512, "codec=int4,sym=1,rotate=none", "q4_0/q4_0"),
    (512, "codec=int4,rotate=none", "q4_0/q4_0"),
    (512, BEST4, "q4_0/q4_0"),
    (1024, "codec=f16", "f16/f16"),
    (1024, "codec=int8,sym=1", "q8_0/q8_0"),
]

SPEED_SHAPES = ["smollm2-135m", "qwen2.5-0.5b"]
FAST4 = "codec=kivi4,page=128,group=64,sym=1"  # the recommended fastest 4-bit cache (no pre-RoPE)
SPEED_SPECS = ["codec=f16", "codec=int8", "codec=int4,rotate=none", FAST4, BEST4, "codec=kivi2,page=128,group=64", BEST2]
# A speed goal is judged on the median of at least this many runs of one report.
MIN_RUNS = 3


def run(cmd, timeout=None):
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit("command failed (%d): %s\n%s%s" % (out.returncode, " ".join(cmd), out.stdout[-2000:], out.stderr[-2000:]))
    print("  %.0fs  %s" % (time.time() - t0, " ".join(cmd)), flush=True)
    return out.stdout


def save(name, data):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump(data, f, indent=1)


def load(name):
    path = os.path.join(RESULTS, name)
    return json.load(open(path)) if os.path.exists(path) else None


def measure(args, specs):
    for key, gguf, text, ctx, chunks, quick_chunks in MODELS:
        if args.models and key not in args.models:
            continue
        model = os.path.join(args.shared, gguf)
        print("== %s" % key, flush=True)
        # Exact bytes per token (asymptotic: packed pages) from kvx inspect.
        out = run([args.kvx, "inspect", model] + sum([["--kv", s] for _, s, _ in specs], []))
        bytes_per_token = {}
        for line in out.splitlines():
            m = re.match(r"\s+(codec=\S+)\s+(\d+)\s+([0-9.]+)x\s+([0-9.]+)\s*$", line)
            if m:
                bytes_per_token[m.group(1)] = int(m.group(2))
        json_path = os.path.join(RESULTS, key + ".eval.json")
        os.makedirs(RESULTS, exist_ok=True)
        cmd = [args.kvx, "eval", "-m", model, "--baseline", specs[0][1], "--tasks", "ppl,kld,copy",
               "-f", os.path.join(args.shared, text), "-c", str(ctx),
               "--chunks", str(quick_chunks if args.quick else chunks), "--copy-trials", "2" if args.quick else "5",
               "-t", str(args.threads), "-q", "--json", json_path]
        for _, s, _ in specs[1:]:
            cmd += ["--kv", s]
        run(cmd)
        save(key + ".json", {"model": key, "ctx": ctx, "text": text, "bytes_per_token": bytes_per_token,
                             "eval": json.load(open(json_path)), "command": sub_command_paths(" ".join(cmd))})

    # llama.cpp comparison on the probe model.
    if args.models and "probe" not in args.models:
        return
    probe = os.path.join(args.shared, MODELS[2][1])
    text = os.path.join(args.shared, "golden/probe_val.txt")
    rows = []
    for ctx, spec, _ in LLAMA_PPL:
        cmd = [args.kvx, "perplexity", "-m", probe, "-f", text, "-c", str(ctx), "-t", str(args.threads), "--kv", spec]
        if args.quick:
            cmd += ["--chunks", "8"]
        out = run(cmd)
        m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        rows.append({"ctx": ctx, "spec": spec, "ppl": float(m.group(1)), "pm": float(m.group(2)),
                     "command": sub_command_paths(" ".join(cmd)), "quick": args.quick})
    save("llama_ppl.json", {"generated": time.strftime("%Y-%m-%d"), "rows": rows,
                            "llama_cpp": llama_reference(args.shared)})


def llama_reference(shared):
    """llama.cpp's probe_val perplexities by (ctx, KV cache), copied from ../shared/golden with their
    commands, so the documents render without the shared folder."""
    golden = json.load(open(os.path.join(shared, "golden/perplexity_kvquant.json")))
    golden += [g for g in json.load(open(os.path.join(shared, "golden/perplexity.json")))
               if g.get("model") == "probe" and g.get("text") == "probe_val" and g.get("kv_cache") == "f16/f16"]
    return [{"ctx": g["ctx"], "kv_cache": g["kv_cache"], "ppl": g["ppl"], "command": g["command"]}
            for g in golden if g.get("model") == "probe" and g.get("text") == "probe_val" and "ppl" in g]


def measure_speed(args):
    """`kvx bench` of every (shape, spec), args.speed_runs times, the specs interleaved so that a slow
    phase of the (shared) machine hits all of them alike; each run keeps its own bandwidth reading."""
    rows = {}
    for shape in SPEED_SHAPES:
        gguf = "/tmp/kvx-%s-q8_0.gguf" % shape
        if not os.path.exists(gguf):
            run([args.kvx, "gen-model", "--shape", shape, "--type", "q8_0", "-o", gguf])
    for i in range(args.speed_runs):
        for shape in SPEED_SHAPES:
            gguf = "/tmp/kvx-%s-q8_0.gguf" % shape
            for spec in SPEED_SPECS:
                path = "/tmp/kvx-bench.json"
                cmd = [args.kvx, "bench", "-m", gguf, "-t", str(args.threads), "--depths", "0,4096,8192", "--kv", spec,
                       "-n", "16", "-r", "3", "--json", path]
                run(cmd)
                b = json.load(open(path))
                row = rows.setdefault((shape, spec), {"shape": shape, "spec": spec,
                                                      "kv_bytes_per_token": b["kv_bytes_per_token"],
                                                      "command": sub_command_paths(" ".join(cmd)), "runs": []})
                row["runs"].append({"decode": [{k: d[k] for k in ("depth", "tok_s", "kv_bytes", "pct_of_bound")}
                                               for d in b["decode"]],
                                    "bandwidth_gbps": b["bandwidth"]["read_gbps"], "loadavg": os.getloadavg()[0]})
    save("speed.json", {"generated": time.strftime("%Y-%m-%d"), "runs": args.speed_runs, "rows": list(rows.values())})


# ---------------------------------------------------------------- rendering

def fmt(x, digits=4):
    return "–" if x is None else ("%.*g" % (digits, x))


def result_rows(model_data):
    """One dict per spec: label, spec, bytes/token, compressions, ppl, kld, top1, copy."""
    ev = model_data["eval"]
    f16_dense = ev["model"]["f16_bytes_per_token"]
    bpt = model_data["bytes_per_token"]
    f16_kvx = bpt.get("codec=f16")
    rows = []
    by_spec = {r["spec"]: r for r in ev["results"]}
    for label, spec, method in SPECS:
        r = by_spec.get(spec)
        if r is None:
            continue
        row = {"label": label, "spec": spec, "method": method, "bpt": bpt.get(spec)}
        row["x_kvx"] = f16_kvx / row["bpt"] if row["bpt"] else None
        row["x_dense"] = f16_dense / row["bpt"] if row["bpt"] else None
        # Peak of the perplexity task (full-length sequences); the overall peak
        # also sees the copy task's shorter sequences and their f16 staging pages.
        row["x_measured"] = (r.get("ppl") or {}).get("kv", r.get("kv", {})).get("compression_vs_f16")
        row["ppl"] = r.get("ppl", {}).get("ppl")
        row["ppl_pm"] = r.get("ppl", {}).get("ppl_stderr")
        kld = r.get("kld") or {}
        row["kld"] = kld.get("mean")
        row["top1"] = kld.get("top1")
        copy = r.get("copy") or {}
        row["copy"] = copy_accuracy(copy)
        rows.append(row)
    return rows


def copy_accuracy(copy):
    """{source: accuracy} of the copy task ("random", "text"), or None."""
    if not copy or not copy.get("ok", True):
        return None
    return {src["source"]: src["accuracy"] for src in copy.get("sources", []) if "accuracy" in src} or None


def model_table(model_data):
    lines = ["| config | `--kv` | B/token | × vs f16 (kvx) | × vs dense f16 | × measured @ctx | PPL | KLD mean | top-1 | copy random / text |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result_rows(model_data):
        lines.append("| %s | `%s` | %s | %s | %s | %s | %s ± %s | %s | %s | %s |" % (
            r["label"], r["spec"], r["bpt"] if r["bpt"] else "–", fmt(r["x_kvx"], 3), fmt(r["x_dense"], 3),
            fmt(r["x_measured"], 3), fmt(r["ppl"], 6), fmt(r["ppl_pm"], 3), fmt(r["kld"], 3),
            "–" if r["top1"] is None else "%.2f%%" % (100 * r["top1"]),
            "–" if r["copy"] is None else " / ".join("%.1f%%" % (100 * r["copy"][k]) for k in ("random", "text")
                                                       if k in r["copy"])))
    return "\n".join(lines)


def measured_x(r):
    return "%.2f×" % r["x_measured"] if r["x_measured"] else "–"


def goals(models):
    """Goal verdicts. Compression is judged on MEASURED bytes (the pool's peak during the perplexity
    task against a dense f16 cache of the same tokens), the asymptotic ratios shown beside; speed on
    the median of repeated runs of one report, with their spread."""
    probe = next((m for m in models if m["model"] == "probe"), None)
    if probe is None:
        return "(probe results missing)"
    rows = {r["spec"]: r for r in result_rows(probe)}
    out = ["| goal | configuration | measured | met |", "|---|---|---|:-:|"]
    for spec in ("codec=int8", "codec=int8,sym=1"):
        r = rows.get(spec)
        if r and r["top1"] is not None:
            out.append("| int8 top-1 agreement ≥ 99.5%% vs f16 | `%s` | %.2f%% | %s |" % (
                spec, 100 * r["top1"], "yes" if r["top1"] >= 0.995 else "no"))
    r = rows.get(BEST4)
    if r and r["top1"] is not None and r["x_measured"]:
        ok = r["x_measured"] >= 3.5 and r["top1"] >= 0.98
        out.append("| best 4-bit ≥ 3.5× smaller (measured), top-1 ≥ 98%% | `%s` | measured %s (asymptotic: %.2f× vs "
                   "kvx f16, %.2f× vs dense f16); top-1 %.2f%% | %s |" % (
                       BEST4, measured_x(r), r["x_kvx"], r["x_dense"], 100 * r["top1"], "yes" if ok else "no"))
    base = rows.get(INT2)
    for spec in (BEST2, BEST2_R0):
        r = rows.get(spec)
        if r and base and r["kld"] is not None and base["kld"] and r["x_measured"]:
            ok = r["x_measured"] >= 6 and r["kld"] <= 0.5 * base["kld"]
            out.append("| best 2-bit ≥ 6× smaller (measured), KLD ≤ ½ int2's (`%s`) | `%s` | measured %s (asymptotic: "
                       "%.2f× / %.2f×); KLD %.4g = %.2f × int2's %.4g | %s |" % (INT2,
                           spec, measured_x(r), r["x_kvx"], r["x_dense"], r["kld"], r["kld"] / base["kld"],
                           base["kld"], "yes" if ok else "no"))
    # Speed: the recommended fast 4-bit cache against f16 at depth 8192, per shape, on the per-run
    # ratios (the specs of one run are measured minutes apart, so a slow phase hits both).
    speed = speed_rows()
    for shape in sorted({r["shape"] for r in speed}):
        ratios = run_ratios(speed, shape, FAST4, 8192)
        if not ratios:
            continue
        med = statistics.median(ratios)
        verdict = ("yes" if med > 1.0 else "no") if len(ratios) >= MIN_RUNS else "not judged (< %d runs)" % MIN_RUNS
        out.append("| 4-bit decode at depth 8192 faster than f16 (%s shape) | `%s` | %s of f16's tok/s | %s |" % (
            shape, FAST4, spread_x(ratios), verdict))
    return "\n".join(out)


def spread_x(values):
    if len(values) == 1:
        return "%.2f× (1 run)" % values[0]
    return "%.2f× median (%.2f–%.2f×, %d runs)" % (statistics.median(values), min(values), max(values), len(values))


def recommended(models):
    """The recommended settings, with their numbers from the probe model's rows and the speed runs."""
    probe = next((m for m in models if m["model"] == "probe"), None)
    rows = {r["spec"]: r for r in result_rows(probe)} if probe else {}

    def quality(spec):
        r = rows.get(spec)
        if not r:
            return "not measured"
        return "%s smaller measured at %d tokens (%.2f× asymptotically), top-1 %.2f%%" % (
            measured_x(r), probe["ctx"], r["x_dense"], 100 * r["top1"])
    speed = speed_rows()
    fast = "; ".join("%s: %s of f16 at depth 8192" % (shape, spread_x(run_ratios(speed, shape, FAST4, 8192)))
                     for shape in sorted({r["shape"] for r in speed}) if run_ratios(speed, shape, FAST4, 8192))
    lines = ["| want | `--kv` | probe model, vs f16 |", "|---|---|---|",
             "| closest to f16 at half the bytes | `codec=int8` | %s |" % quality("codec=int8"),
             "| the llama.cpp `q8_0` / `q4_0` counterparts | `codec=int8,sym=1` / `codec=int4,sym=1,rotate=none` | %s / %s |" % (
                 quality("codec=int8,sym=1"), quality("codec=int4,sym=1,rotate=none")),
             "| best 4-bit | `%s` | %s |" % (BEST4, quality(BEST4)),
             "| best 2-bit (plus a fixed f16 residual window) | `%s` | %s |" % (BEST2, quality(BEST2)),
             "| best 2-bit, no window | `%s` | %s |" % (BEST2_R0, quality(BEST2_R0)),
             "| fast 4-bit decode (no pre-RoPE) | `%s` | %s |" % (FAST4, fast or "speed not measured")]
    return "\n".join(lines)


def prerope_kld(models):
    probe = next((m for m in models if m["model"] == "probe"), None)
    rows = {r["spec"]: r for r in result_rows(probe)} if probe else {}
    a, b = rows.get("codec=kivi2,page=32"), rows.get("codec=kivi2,page=32,prerope=1")
    if not (a and b and a["kld"] and b["kld"]):
        return "(not measured)"
    return "KIVI-2's KLD %.4g → %.4g, %.2f× on the probe model" % (a["kld"], b["kld"], b["kld"] / a["kld"])


def llama_data():
    """(kvx rows, llama.cpp reference rows, generated date) from llama_ppl.json."""
    data = load("llama_ppl.json")
    if not data:
        return [], [], None
    return data["rows"], data["llama_cpp"], data.get("generated")


def llama_table():
    rows, golden, _ = llama_data()
    if not rows:
        return "(not measured)"
    ref = {(g["ctx"], g["kv_cache"]): g["ppl"] for g in golden}
    own_f16 = {r["ctx"]: r["ppl"] for r in rows if r["spec"] == "codec=f16"}
    lines = ["| ctx | kvx `--kv` | kvx PPL | Δ vs kvx f16 | llama.cpp cache | llama.cpp PPL | Δ vs llama.cpp f16 |",
             "|---:|---|---:|---:|---|---:|---:|"]
    label = {"codec=int8,sym=1": "q8_0/q8_0", "codec=int8": "q8_0/q8_0", "codec=int4,sym=1,rotate=none": "q4_0/q4_0",
             "codec=int4,rotate=none": "q4_0/q4_0", BEST4: "q4_0/q4_0", "codec=f16": "f16/f16"}
    for r in rows:
        lc = label.get(r["spec"])
        lp = ref.get((r["ctx"], lc))
        lf = ref.get((r["ctx"], "f16/f16"))
        lines.append("| %d | `%s` | %.4f ± %.4f | %+.4f | %s | %s | %s |" % (
            r["ctx"], r["spec"], r["ppl"], r["pm"], r["ppl"] - own_f16.get(r["ctx"], r["ppl"]), lc or "–",
            "%.4f" % lp if lp else "–", "%+.4f" % (lp - lf) if lp and lf else "–"))
    f16_diffs = [abs(own_f16[c] - ref[(c, "f16/f16")]) / ref[(c, "f16/f16")] for c in own_f16 if (c, "f16/f16") in ref]
    note = ""
    if f16_diffs:
        note += ("\n\nkvx's f16 cache is within %.4f%% of llama.cpp's f16 perplexity at every context here, so the "
                 "Δ columns compare the same thing." % (100 * max(f16_diffs)))
    if any(r.get("quick") for r in rows):
        note += "\n\n(quick run: 8 chunks only; llama.cpp's numbers use the whole file)"
    return "\n".join(lines) + note


def speed_rows():
    """speed.json's rows, each with a list of runs (the first format had one run per row)."""
    data = load("speed.json") or []
    rows = data["rows"] if isinstance(data, dict) else data
    out = []
    for r in rows:
        runs = r.get("runs") or [{"decode": r["decode"], "bandwidth_gbps": r["bandwidth_gbps"]}]
        out.append(dict(r, runs=runs))
    return out


def decode_at(run_, depth):
    return next((d for d in run_["decode"] if d["depth"] == depth), None)


def run_ratios(speed, shape, spec, depth):
    """tok/s of spec over f16's at depth, per run (runs are paired by their index)."""
    by = {r["spec"]: r for r in speed if r["shape"] == shape}
    if spec not in by or "codec=f16" not in by:
        return []
    return [decode_at(a, depth)["tok_s"] / decode_at(b, depth)["tok_s"]
            for a, b in zip(by[spec]["runs"], by["codec=f16"]["runs"])]


def speed_table():
    speed = speed_rows()
    if not speed:
        return "(not measured: run with --speed)"
    med = lambda r, depth, key: statistics.median(decode_at(x, depth)[key] for x in r["runs"])
    lines = ["| shape | `--kv` | KV B/token | decode tok/s @0 | @4096 | @8192 (spread) | × f16 @8192 | KV MiB @8192 | "
             "% of bound @8192 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in speed:
        at8 = [decode_at(x, 8192)["tok_s"] for x in r["runs"]]
        ratios = run_ratios(speed, r["shape"], r["spec"], 8192)
        lines.append("| %s | `%s` | %d | %.1f | %.1f | %.1f (%.1f–%.1f) | %.2f | %.1f | %.0f%% |" % (
            r["shape"], r["spec"], r["kv_bytes_per_token"], med(r, 0, "tok_s"), med(r, 4096, "tok_s"),
            statistics.median(at8), min(at8), max(at8), statistics.median(ratios) if ratios else float("nan"),
            decode_at(r["runs"][0], 8192)["kv_bytes"] / 2**20, med(r, 8192, "pct_of_bound")))
    n = min(len(r["runs"]) for r in speed)
    bws = [x["bandwidth_gbps"] for r in speed for x in r["runs"]]
    loads = [x["loadavg"] for r in speed for x in r["runs"] if "loadavg" in x]
    note = ("Medians of %d run%s per row (each `kvx bench -r 3`, the rows of one run measured one after the other); "
            "\"× f16\" is the median of the per-run ratios to f16 on the same shape. The runs' 256 MiB read-bandwidth "
            "readings ranged %.1f–%.1f GB/s%s." % (
                n, "" if n == 1 else "s", min(bws), max(bws),
                ", the 1-minute load average %.1f–%.1f on 2 cores" % (min(loads), max(loads)) if loads else ""))
    return "\n".join(lines) + "\n\n" + note


def speed_summary():
    """One sentence per shape: every cache's median decode speed at depth 8192 relative to f16."""
    speed = speed_rows()
    if not speed:
        return "(not measured)"
    out = []
    for shape in sorted({r["shape"] for r in speed}):
        parts = ["`%s` %.2f×" % (r["spec"], statistics.median(run_ratios(speed, shape, r["spec"], 8192)))
                 for r in speed if r["shape"] == shape and r["spec"] != "codec=f16"]
        out.append("On the %s shape at depth 8192, relative to f16: %s." % (shape, ", ".join(parts)))
    return " ".join(out)


def eval_date(models):
    dates = sorted({m["eval"]["created_utc"][:10] for m in models if m["eval"].get("created_utc")})
    return " and ".join(dates) if dates else "(unknown)"


def render(out):
    models = [m for m in (load(k + ".json") for k, *_ in MODELS) if m]
    template = open(os.path.join(ROOT, "scripts/kv_quant_doc.md.in")).read()
    sections = []
    for m in models:
        ev = m["eval"]
        sections.append("### %s (head_dim %d, %d layers × %d kv heads; ctx %d, `%s`)\n\n%s\n\nCommand: `%s`" % (
            m["model"], ev["model"]["head_dim"], ev["model"]["n_layers"], ev["model"]["n_kv_heads"], m["ctx"],
            m["text"], model_table(m), sub_command_paths(m["command"])))
    speed = load("speed.json")
    doc = template.replace("@MODEL_TABLES@", "\n\n".join(sections) or "(not measured)")
    doc = doc.replace("@GOALS@", goals(models))
    doc = doc.replace("@RECOMMENDED@", recommended(models))
    doc = doc.replace("@PREROPE_KLD@", prerope_kld(models))
    doc = doc.replace("@LLAMA@", llama_table())
    doc = doc.replace("@LLAMA_DATE@", llama_data()[2] or "(unknown)")
    doc = doc.replace("@SPEED@", speed_table())
    doc = doc.replace("@SPEED_SUMMARY@", speed_summary())
    doc = doc.replace("@SPEED_DATE@", speed.get("generated", "(unknown)") if isinstance(speed, dict) else "(unknown)")
    doc = doc.replace("@DATE@", eval_date(models))
    doc = doc.replace("@CODEC_DEFAULTS@", codec_defaults.table())
    left = re.findall(r"@[A-Z_]+@", doc)
    if left:
        sys.exit("kv_quant_doc.md.in: unknown placeholders %s" % ", ".join(sorted(set(left))))
    out.write("docs/kv-quantization.md", doc)
    # README: the recommended settings (every table, goal and note stays in docs/kv-quantization.md).
    readme_block = ("Recommended settings on the probe model, ctx 2048 (measured by `scripts/kv_quant_report.sh`; every "
                    "model, the goals, the comparison with llama.cpp's q8_0/q4_0 caches and how each method works: "
                    "[docs/kv-quantization.md](docs/kv-quantization.md)):\n\n" + recommended(models))
    out.readme_block("kv-quant", readme_block)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"))
    ap.add_argument("--shared", default=os.path.normpath(os.path.join(ROOT, "../shared")))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--quick", action="store_true", help="few chunks and specs (smoke test)")
    ap.add_argument("--models", default="", help="comma-separated model keys to measure (default: all; the "
                    "llama.cpp comparison runs with probe)")
    ap.add_argument("--speed", action="store_true", help="also run kvx bench on synthetic shapes")
    ap.add_argument("--speed-runs", type=int, default=5, help="kvx bench runs of every (shape, spec)")
    ap.add_argument("--render-only", action="store_true", help="render the documents from the committed JSON")
    ap.add_argument("--check", action="store_true", help="render in memory and fail on any difference")
    ap.add_argument("--speed-only", action="store_true", help="re-measure only the kvx bench table, then render")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(args.models) - {key for key, *_ in MODELS})
    if unknown:
        sys.exit("--models: unknown %s; the models are %s" % (", ".join(unknown), ", ".join(k for k, *_ in MODELS)))
    if args.speed_only:
        measure_speed(args)
    elif not (args.render_only or args.check):
        specs = [s for s in SPECS if not args.quick or s[1] in QUICK]
        measure(args, specs)
        if args.speed:
            measure_speed(args)
    out = Output(args.check)
    render(out)
    out.finish("kv_quant_report")


if __name__ == "__main__":
    main()
