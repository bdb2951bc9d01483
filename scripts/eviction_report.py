#!/usr/bin/env python3
"""KV eviction report (issue 21): every score-based policy x compression ratio x context length, with the
question excluded and included, on the recall model (../shared/models/recall), measured with `kvx eval`.

    scripts/eviction_report.py --run            # the full sweep (hours on 2 cores; run it in the background:
                                                #   nohup scripts/eviction_report.py --run > /tmp/eviction.log 2>&1 &)
    scripts/eviction_report.py --run --only snapkv --lengths 2048 --modes included   # one slice
    scripts/eviction_report.py --speed --llama-bin DIR   # decode speed, pool bytes and RSS at 8k with each policy
                                                # (kvx bench) beside llama.cpp's f16 / q8_0 / q4_0 KV, same GGUF
    scripts/eviction_report.py --render-only    # docs/kv-eviction.md, its SVGs and the README section
    scripts/eviction_report.py --check          # render in memory, fail if the committed documents differ (ctest)

Each `kvx eval` run (one method, one length, one question mode, every ratio as a --kv spec against the f16
baseline) writes its report.json into docs/results/eviction/ as it goes (kvx eval --json rewrites it after every
task), and the documents are re-rendered after every run from the complete runs, so an interrupted sweep keeps
every run it finished (an unfinished run is re-run whole).
Every number in the documents comes from those JSON files alone.
"""
import argparse, glob, json, os, subprocess, sys, time

from reportlib import ROOT, Output, rel

RESULTS = os.path.join(ROOT, "docs/results/eviction")
DOC = "docs/kv-eviction.md"
# Hand-written text per method (its deviations from the paper, investigations), spliced into its section
# after the paper/kvx lines: docs/kv-eviction-notes/<method>.md.
NOTES = os.path.join(ROOT, "docs/kv-eviction-notes")
MODEL = "models/recall/recall-llama-8L-d512-f16.gguf"
RATIOS = [0.25, 0.5, 0.75, 0.875]  # ratio 0 is the baseline (the full f16 cache) of every run
LENGTHS = [2048, 4096, 8192]
MODES = ["excluded", "included"]
TASKS = ["passkey", "needle", "niah_multikey"]
DEPTHS = "0,0.5,1"
# The "kld" mode: perplexity and KLD against the full f16 cache on the model's held-out text. Each chunk's
# first KLD_CONTEXT is prefilled and compressed once, the rest is scored token by token (kvx eval
# --kld-context), so the scored tokens read the compressed cache; the spec is sized for that context.
KLD_MODE = "kld"
KLD_TEXT = "golden/recall_val.txt"
KLD_CONTEXT = 0.75
KLD_CHUNKS = 2

# key -> (policy spec at ratio r, what the paper does, what kvx implements / where it differs)
METHODS = {
    "streamingllm": (
        lambda r, n: "codec=f16;policy=streamingllm,sinks=4,window=%d" % max(1, round((1 - r) * n) - 4),
        "Xiao et al. 2023: keep 4 attention sinks and a window of recent tokens; the paper numbers positions by "
        "slot in the cache.",
        "Sinks + window per head, whole pages freed as the window moves; original positions kept. The ratio is "
        "turned into a window of (1 - ratio) x length - 4 tokens."),
    "streamingllm-repack": (
        lambda r, n: "codec=f16,prerope=1;policy=streamingllm,sinks=4,window=%d,positions=repack"
                     % max(1, round((1 - r) * n) - 4),
        "The paper's position mode: positions within the cache.",
        "positions=repack renumbers the k kept entries to n-k..n-1 (RoPE is relative, so queries see in-cache "
        "distances exactly); needs pre-RoPE keys (prerope=1), rejected otherwise."),
    "h2o": (
        lambda r, n: "codec=f16;policy=h2o,ratio=%g,mode=once" % r,
        "Zhang et al. 2023: accumulated attention (column sums over every query) plus recent tokens, evicting "
        "at every decode step.",
        "Per-query-head sums reduced by the GQA mean; window = half the kept entries; the sweep uses mode=once "
        "(compress at the measured moment; mode=continuous evicts after every step, prefill chunks included). "
        "Its sums need every prompt query's probabilities: the attention items write them into score matrices "
        "kept across calls, and the recorder adds a prompt's contiguous chain with one vector add per entry; "
        "a 4072-token prefill runs at 789 tok/s against 1317 without a policy (it was 185 vs 1239 when the "
        "matrices were filled with -inf on the calling thread each call; `kvx run` on the recall model, one run "
        "each, the sweep running beside it). It cannot share a prefill across specs (kvx eval's prefill cache)."),
    "scissorhands": (
        lambda r, n: "codec=f16;policy=scissorhands,ratio=%g,mode=once" % r,
        "Liu et al. 2023: drop tokens repeatedly below average attention over a history window.",
        "Low-hit counts over a ~32-query sliding window (exponential stand-in for a ring), GQA min, ties by "
        "attention; every step instead of every m steps when continuous."),
    "tova": (
        lambda r, n: "codec=f16;policy=tova,ratio=%g,mode=once" % r,
        "Oren et al. 2024: drop what the current query attends to least, averaged over the layer's heads.",
        "Last query only, layer-averaged (all kv heads keep the same tokens); one-shot top-k as kvpress."),
    "snapkv": (
        lambda r, n: "codec=f16;policy=snapkv,ratio=%g" % r,
        "Li et al. 2024: votes of the last w prompt queries, pooled, top entries + the window, once after "
        "prefill.",
        "w 32, avg-pool kernel 5 (no zero padding), GQA mean after pooling, 4 sinks kept."),
    "snapkv-maxpool": (
        lambda r, n: "codec=f16;policy=snapkv,ratio=%g,kernel=15,pool=max" % r,
        "SnapKV with max pooling (KVCache-Factory's choice) and a wider kernel.",
        "kernel=15,pool=max: keeps the neighbours of every voted entry (multi-token values survive whole)."),
    "pyramidkv": (
        lambda r, n: "codec=f16;policy=pyramidkv,ratio=%g" % r,
        "Cai et al. 2024: SnapKV selection with budgets falling linearly with depth (beta 20).",
        "The reference's min/max formula and fallbacks, total kept exactly. Reading the results: below ratio 0.5 "
        "the reference falls back to uniform budgets (n < 2(C - w)), so PyramidKV is SnapKV there (the same KLD at "
        "0.25); from 0.5 the pyramid starts and, on this 8-layer model, starves the top layers (1536 prefilled "
        "entries at ratio 0.5: layers keep 1463, 1265, ... down to 73), which is where its KLD jumps past SnapKV's "
        "(Perplexity and KLD, below). The pyramid is a prior about deep models' attention; "
        "this one's upper layers still need breadth."),
    "cake": (
        lambda r, n: "codec=f16;policy=cake,ratio=%g" % r,
        "Qin et al. 2025: layer budgets from window attention entropy x variance, cascaded during prefill; "
        "token indicator mean + gamma var.",
        "tau1 = tau2 = 1, gamma 200; one-shot after prefill (no cascade: the peak is the full prompt)."),
    "adakv": (
        lambda r, n: "codec=f16;policy=adakv,base=snapkv,ratio=%g" % r,
        "Feng et al. 2024: the layer's budget taken jointly across heads by score, floor alpha 0.2.",
        "Per kv head (GQA reduced first) over any base scorer (base=); heads keep different token counts."),
    "kvmerger": (
        lambda r, n: "codec=f16;policy=kvmerger,ratio=%g,mode=once" % r,
        "Wang et al. 2024 (KVMerger) / D2O: evicted entries are merged into their most similar kept neighbour "
        "(Gaussian-kernel / cosine weights) instead of dropped.",
        "H2O's accumulated attention picks the evicted; fate=merge folds each into its most similar kept entry of "
        "the same head above a similarity threshold, else drops it (docs/kv-merging.md)."),
    "duo": (
        lambda r, n: "codec=f16;policy=duo,heads=%s,retrieval=0.0625,sinks=4,window=%d,mode=once" % (
            HEADS % "duo", streaming_window(r, n)),
        "Xiao et al. 2024 (DuoAttention): retrieval heads keep everything, streaming heads keep sinks + a "
        "window; heads typed by a trained gate.",
        "Heads typed by `kvx calibrate-heads --method duo` (docs/kv-head-typing.md); one retrieval head of 16; the "
        "streaming window is sized so the cache keeps (1 - ratio) of the entries."),
    "razor": (
        lambda r, n: "codec=f16;policy=razor,heads=%s,retrieval=0.0625,sinks=4,window=%d,window_fraction=0,"
                     "mode=once" % (HEADS % "razor", streaming_window(r, n)),
        "Tang et al. 2024 (RazorAttention): retrieval heads (echo/induction scores) keep everything, the others "
        "sinks + a window.",
        "Heads typed by `kvx calibrate-heads --method razor`; as duo above (no compensation token)."),
    "quest": (
        lambda r, n: "codec=f16;policy=quest,budget=%d" % max(64, round((1 - r) * n)),
        "Tang et al. 2024 (Quest): per-page key min/max; each decode query reads only its top pages.",
        "Selection, not eviction: the budget is (1 - ratio) x length tokens read per head; the cache keeps every "
        "entry (bytes vs f16 stay at 1: less reading, same memory)."),
    "knorm": (
        lambda r, n: "codec=f16;policy=knorm,ratio=%g" % r,
        "Devoto et al. 2024 (kvpress KnormPress): keep the keys with the lowest L2 norm.",
        "Norm of the stored key; no observer (fast kernels stay on); no sinks or window."),
    "mikv": (
        lambda r, n: "codec=f16;policy=mikv,ratio=%g,mode=once" % r,
        "Yang et al. 2024 (MiKV): H2O importance plus a recent window; the evicted are kept at 2-4 bits "
        "instead of dropped (\"no token left behind\"), the important at high precision.",
        "fate=demote: the evicted move into int2 pages (group 32) of their own chain and stay attended; the "
        "ratio is the fraction demoted, so the bytes saved are about 0.8 x ratio of f16, not the ratio; no "
        "per-channel key balancer (docs/kv-merging.md). The demoted pages are written before compaction frees "
        "their sources, so the budget derived from the context holds that headroom "
        "(KVPolicy::CompressionHeadroomBytes); before it, MiKV at ratio >= 0.25 failed with \"KV budget "
        "exhausted\" when the prompt filled the pool (a – cell); every run that failed so was "
        "re-run with it."),
    "mikv-kivi2": (
        lambda r, n: "codec=f16;policy=mikv,ratio=%g,mode=once,demote=kivi2" % r,
        "MiKV as above, with the paper's outlier handling approximated: its per-channel key balancer divides key "
        "channels by s_c before the low-bit quantization so that outlier channels stop dominating a token's "
        "group.",
        "demote=kivi2 instead of int2: keys quantized per channel over a demoted page (values per token), which "
        "gives each key channel its own scale, the problem the balancer solves, at about the same bytes. "
        "Per-token int2 keys without the balancer score below dropping the same entries (mikv vs h2o in the "
        "KLD table); this row shows what per-channel keys recover."),
    "think": (
        lambda r, n: "codec=f16;policy=think,lambda=%g" % r,
        "Xu et al. 2024 (ThinK): per head, keep the key channels with the largest |Qw[:,c]| |K[:,c]| over the "
        "last 32 prompt queries; older keys lose the rest, recent and new tokens keep every channel.",
        "The ratio is lambda, the fraction of key CHANNELS pruned (every token stays): pages older than the last "
        "32 entries are rewritten with the kept channels only (values whole), so the bytes saved are about "
        "ratio / 2 of f16, not the ratio; GQA mean of the query term; single channels (keys are post-RoPE) "
        "(docs/kv-think.md)."),
    "snapkv+think": (
        lambda r, n: "codec=f16" + (";policy=snapkv,ratio=%g" % r if r > 0 else "") + ";policy=think,lambda=0.4",
        "kvpress ComposedPress: SnapKV evicts tokens, then ThinK prunes 40% of the key channels of what is kept.",
        "snapkv above at the ratio, then think lambda=0.4 on the kept entries; ratio 0 is think alone "
        "(docs/kv-think.md)."),
    "random": (
        lambda r, n: "codec=f16;policy=random,ratio=%g" % r,
        "The floor: seeded random eviction.",
        "Hash of (seed, layer, head, position); no sinks or window."),
    # Codec + policy: the combinations only kvx can run (eviction on quantized pages). Ratio 0 is the codec
    # alone (these runs add it before the ratios), so each curve starts at the codec's own point.
    "kivi4+snapkv-maxpool": (
        lambda r, n: "codec=kivi4,page=32" + ("" if r == 0 else ";policy=snapkv,ratio=%g,kernel=15,pool=max" % r),
        "KIVI (Liu et al. 2024) 4-bit keys per channel / values per token, then SnapKV on the quantized pages.",
        "The kivi4 codec (docs/kv-quantization.md) with snapkv-maxpool above: the policy evicts quantized "
        "entries and compaction re-packs the quantized pages."),
    "kivi2+snapkv-maxpool": (
        lambda r, n: "codec=kivi2,page=32" + ("" if r == 0 else ";policy=snapkv,ratio=%g,kernel=15,pool=max" % r),
        "KIVI 2-bit, then SnapKV.",
        "As kivi4+snapkv-maxpool at 2 bits."),
    "int8+snapkv-maxpool": (
        lambda r, n: "codec=int8" + ("" if r == 0 else ";policy=snapkv,ratio=%g,kernel=15,pool=max" % r),
        "Per-token int8 KV, then SnapKV.",
        "kvx's int8 codec with snapkv-maxpool."),
    "int4+mikv": (
        lambda r, n: "codec=int4" + ("" if r == 0 else ";policy=mikv,ratio=%g,mode=once" % r),
        "Per-token int4 KV (llama.cpp q4_0's counterpart), then MiKV: the important entries stay at 4 bits, "
        "the evicted are demoted to 2 bits.",
        "kvx's int4 codec with mikv above (demotion codec int2)."),
    "kivi4+mikv": (
        lambda r, n: "codec=kivi4,page=32" + ("" if r == 0 else ";policy=mikv,ratio=%g,mode=once,demote=kivi2" % r),
        "KIVI-4, then MiKV demoting the evicted to KIVI-2.",
        "The kivi4 codec with mikv, demotion codec kivi2 (keys per channel, values per token at 2 bits)."),
}


def method_ratios(method):
    """The ratios one run measures after its baseline (codec combinations start with the codec alone)."""
    return ([0.0] if "+" in method else []) + RATIOS


# Decode speed with a policy (issue 21, "memory and speed are real"): kvx bench at SPEED_DEPTH on the
# smollm2-135m shape (random weights: speed depends on the bytes read, not on what they mean). A spec with
# policies is filled by a real forward pass and compressed once (eval/speed_bench.cc FillDepth); f16 and quest
# keep every entry.
SPEED = os.path.join(RESULTS, "speed", "speed.json")
SPEED_DEPTH = 8192
SPEED_SPECS = ["codec=f16", "codec=f16;policy=snapkv,ratio=0.5", "codec=f16;policy=snapkv,ratio=0.75",
               "codec=f16;policy=snapkv,ratio=0.875", "codec=kivi4,page=32;policy=snapkv,ratio=0.5",
               "codec=f16;policy=quest,budget=1024", "codec=f16;policy=quest,budget=512",
               "codec=f16;policy=think,lambda=0.5",
               # the serving capacity winner (docs/serving.md): typed heads, continuous, on KIVI-4; its head table
               # was calibrated on this model shape
               "codec=kivi4,page=64,group=64,prerope=1;policy=duo,heads=docs/results/serving/capacity-heads-duo.json,"
               "retrieval=0.0625,sinks=64,window=512,mode=continuous"]
# llama.cpp KV types, each with its flags: f16 both without and with flash attention (its fastest f16 decode);
# llama.cpp quantizes V only with flash attention.
LLAMA_KV = {"f16": [], "f16 -fa": ["-fa"], "q8_0 -fa": ["-fa"], "q4_0 -fa": ["-fa"]}


def run_speed(args):
    kvx = os.path.abspath(args.kvx)
    model = args.speed_model
    if not os.path.exists(model):
        subprocess.run([kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", model], check=True)
    data = {"generated": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads, "depth": SPEED_DEPTH,
            "rounds": args.rounds, "model": "smollm2-135m q8_0 (kvx gen-model, random weights)",
            "kvx": {s: [] for s in SPEED_SPECS}, "llama_cpp": {t: [] for t in LLAMA_KV} if args.llama_bin else {}}
    if args.llama_bin and not os.path.exists(os.path.join(args.llama_bin, "llama-batched-bench")):
        sys.exit("--llama-bin %s has no llama-batched-bench" % args.llama_bin)
    tmp = "/tmp/kvx-eviction-speed.json"
    # Rounds: every configuration once per round, so a slow minute of the shared machine lands on all of them.
    for i in range(args.rounds):
        for spec in SPEED_SPECS:
            print(time.strftime("%H:%M:%S"), "round", i, spec, flush=True)
            subprocess.run([kvx, "bench", "-m", model, "-t", args.threads, "--kv", spec, "--depths", str(SPEED_DEPTH),
                            "-r", "1", "-n", "32", "-p", "64", "--json", tmp], check=True, stdout=subprocess.DEVNULL,
                           cwd=ROOT)  # specs name head tables relative to the repository
            d = json.load(open(tmp))["decode"][0]
            data["kvx"][spec].append({"tok_s": d["tok_s"], "kv_bytes": d["kv_bytes"], "rss_bytes": d["rss_bytes"],
                                      "loadavg": os.getloadavg()[0]})
        for t in data["llama_cpp"]:
            cmd = [os.path.join(args.llama_bin, "llama-batched-bench"), "-m", model, "-t", args.threads,
                   "-c", str(SPEED_DEPTH + 64), "-b", str(SPEED_DEPTH), "-ub", "512", "-npp", str(SPEED_DEPTH),
                   "-ntg", "32", "-npl", "1", "-ctk", t.split()[0], "-ctv", t.split()[0], "--output-format", "jsonl"]
            cmd += LLAMA_KV[t]
            r = subprocess.run(cmd, capture_output=True, text=True)
            rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
            if r.returncode != 0 or not rows:
                sys.exit("llama-batched-bench failed (%s):\n%s" % (" ".join(cmd), r.stderr[-2000:]))
            data["llama_cpp"][t].append({"tok_s": rows[0]["speed_tg"]})
        # Written after every round: a failure keeps the rounds measured.
        os.makedirs(os.path.dirname(SPEED), exist_ok=True)
        with open(SPEED, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return None if not n else xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def speed_section():
    if not os.path.exists(SPEED):
        return ["## Decode speed and memory with a policy", "", "Not measured yet: "
                "`scripts/eviction_report.py --speed --llama-bin <llama.cpp>/build/bin`.", ""]
    d = json.load(open(SPEED))
    mib = 1024.0 * 1024.0
    f16 = median([r["tok_s"] for r in d["kvx"].get("codec=f16", [])]) or 0
    lines = ["## Decode speed and memory with a policy", "",
             "`scripts/eviction_report.py --speed` on %s (%s), %s threads, %d-token context, %d rounds (every "
             "configuration once per round; medians, min–max in brackets). kvx: `kvx bench --depths %d -n 32`; a spec "
             "with a policy fills the context with a real forward pass, compresses once, then decodes over what "
             "was kept. KV MiB is the pool's bytes in use during the decode, RSS the whole process's resident set "
             "then (weights included). llama.cpp: `llama-batched-bench -npp %d -ntg 32` (`-fa`: flash attention, "
             "which llama.cpp needs to quantize V), same GGUF. Measured %s on a shared 2-core VM." % (
                 d["model"], "same GGUF for both", d["threads"], d["depth"],
                 max(len(runs) for runs in d["kvx"].values()), d["depth"], d["depth"],
                 d["generated"]), "",
             "| engine | KV | decode tok/s | vs kvx f16 | KV MiB | RSS MiB |", "|---|---|---:|---:|---:|---:|"]
    for spec, runs in d["kvx"].items():
        if not runs:
            continue
        t = [r["tok_s"] for r in runs]
        lines.append("| kvx | `%s` | %.1f (%.1f–%.1f) | %.2f× | %.1f | %.0f |" % (
            spec, median(t), min(t), max(t), median(t) / f16 if f16 else 0,
            median([r["kv_bytes"] for r in runs]) / mib, median([r["rss_bytes"] for r in runs]) / mib))
    for t, runs in d.get("llama_cpp", {}).items():
        if not runs:
            continue
        v = [r["tok_s"] for r in runs]
        # runs measured before the f16 -fa row name the quantized types bare (they always ran with -fa)
        label = t if " " in t or t == "f16" else t + " -fa"
        lines.append("| llama.cpp | `-ctk/-ctv %s` | %.1f (%.1f–%.1f) | %.2f× | – | – |" % (
            label, median(v), min(v), max(v), median(v) / f16 if f16 else 0))
    return lines + [""]


HEADS = "docs/results/head_typing/recall-%s.json"  # relative: kvx eval runs in the repository's root


def streaming_window(r, n, retrieval=0.0625, sinks=4):
    """The streaming heads' window that makes the whole cache keep (1 - r) x n entries, with a share
    `retrieval` of the heads keeping all n: retrieval x n + (1 - retrieval) x (sinks + w) = (1 - r) x n."""
    return max(16, round(((1 - r) - retrieval) * n / (1 - retrieval)) - sinks)


def result_path(method, length, mode):
    return os.path.join(RESULTS, "%s_%d_%s.json" % (method, length, mode))


def run(args):
    kvx = os.path.abspath(args.kvx)
    model = os.path.join(args.shared, MODEL)
    methods = args.only.split(",") if args.only else list(METHODS)
    lengths = [int(x) for x in args.lengths.split(",")]
    for mode in args.modes.split(","):
        for length in lengths:
            for m in methods:
                out = result_path(m, length, mode)
                if os.path.exists(out) and not args.force:
                    try:
                        if json.load(open(out)).get("complete"):
                            continue
                    except ValueError:
                        pass
                if mode == KLD_MODE:
                    specs = [METHODS[m][0](r, round(KLD_CONTEXT * length)) for r in method_ratios(m)]
                    cmd = [kvx, "eval", "-m", model, "--baseline", "codec=f16", "--tasks", "ppl,kld",
                           "-f", os.path.join(args.shared, KLD_TEXT), "-c", str(length), "--chunk", str(length),
                           "--chunks", str(KLD_CHUNKS), "--kld-context", str(KLD_CONTEXT), "--compress", "excluded",
                           "-t", args.threads, "--json", out]
                else:
                    specs = [METHODS[m][0](r, length) for r in method_ratios(m)]
                    cmd = [kvx, "eval", "-m", model, "--baseline", "codec=f16", "--tasks", ",".join(TASKS),
                           "-c", str(length), "--lengths", str(length), "--depths", DEPTHS,
                           "--passkey-trials", str(args.trials), "--ruler-trials", str(args.trials),
                           "--compress", mode, "-t", args.threads, "--data", os.path.join(args.shared, "data"),
                           "--json", out]
                for s in specs:
                    cmd += ["--kv", s]
                print(time.strftime("%H:%M:%S"), m, length, mode, flush=True)
                subprocess.run(cmd, check=False, cwd=ROOT)
                render(Output(False))


def load():
    data = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        name = os.path.basename(path)[:-5]
        parts = name.rsplit("_", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        method, length, mode = parts
        try:
            report = json.load(open(path))
        except ValueError:  # being rewritten by a running sweep
            continue
        # A run shows once complete: an unfinished one is re-run whole by the next --run anyway.
        if report.get("complete"):
            data[(method, int(length), mode)] = report
    return data


def cell_scores(report, method):
    """[(spec, ratio, {task: score}, bytes fraction vs the baseline)] of one run. The first row is the
    baseline, the full f16 cache: ratio 0, or None for a codec combination (whose ratio 0 is the codec)."""
    ratios = method_ratios(method)
    res = report.get("results", [])
    if not res:
        return []
    base_bytes = res[0].get("kv", {}).get("peak_bytes", 0)
    rows = []
    for i, s in enumerate(res):
        scores = {}
        for t in TASKS:
            r = s.get(t)
            if r and r.get("ok", True) and r.get("n", 0) > 0:
                scores[t] = r.get("score", 0.0)
            elif r and not r.get("ok", True):
                scores[t] = None
        b = s.get("kv", {}).get("peak_bytes", 0)
        if i == 0:
            ratio = None if ratios[0] == 0 else 0.0
        else:
            ratio = ratios[i - 1] if i - 1 < len(ratios) else None
        rows.append((s.get("spec", ""), ratio, scores, b / base_bytes if base_bytes else None))
    return rows


def live_fractions(report):
    """Per spec of a run: live entries over the slots of the pages held (kvx eval's kv.live_fraction, at the
    peak-bytes sequence), None in reports written before it was measured."""
    out = []
    for s in report.get("results", []):
        kvs = [t["kv"] for t in (s.get(x) for x in TASKS + ["kld"]) if t and "kv" in t]
        kv = max(kvs, key=lambda k: k.get("peak_bytes", 0)) if kvs else s.get("kv", {})
        out.append(kv.get("live_fraction"))
    return out


def kld_cells(report, method):
    """[(ratio, mean KLD, perplexity, bytes fraction vs the baseline)] of one kld-mode run; the first row
    is the baseline (the full f16 cache: KLD 0)."""
    ratios = method_ratios(method)
    res = report.get("results", [])
    if not res:
        return []
    # bytes from ppl's measure: the baseline has no kld result (KLD 0 against itself)
    base_bytes = (res[0].get("ppl") or {}).get("kv", {}).get("peak_bytes", 0)
    rows = []
    for i, s in enumerate(res):
        k, p = s.get("kld") or {}, s.get("ppl") or {}
        if i == 0:
            ratio = None if ratios[0] == 0 else 0.0
        else:
            ratio = ratios[i - 1] if i - 1 < len(ratios) else None
        b = p.get("kv", {}).get("peak_bytes", 0)
        kld = 0.0 if i == 0 else (k.get("mean") if k.get("ok") else None)
        rows.append((ratio, kld, p.get("ppl") if p.get("ok") else None,
                     b / base_bytes if base_bytes else None))
    return rows


def fmt_kld(x):
    return "–" if x is None else "%.4f" % x


def fmt(x, pct=True):
    if x is None:
        return "–"
    return "%.0f%%" % (100 * x) if pct else "%.2f" % x


def svg_curves(title, series):
    """score vs ratio, one polyline per method: series = {method: [(ratio, score)]}."""
    W, H, L, B = 520, 300, 50, 40
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
              "#bcbd22", "#17becf", "#000000", "#aa3377"]
    x = lambda r: L + r * (W - L - 130)
    y = lambda s: H - B - s * (H - B - 30)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (W, H), '<text x="%d" y="16" font-size="13">%s</text>' % (L, title)]
    for t in [0, 0.25, 0.5, 0.75, 1.0]:
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y(t), x(1), y(t)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%d%%</text>' % (L - 4, y(t) + 4, 100 * t))
    for r in [0] + RATIOS:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x(r), H - B + 14, r))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">ratio removed</text>' % (x(0.5), H - 6))
    for i, (m, pts) in enumerate(sorted(series.items())):
        c = colors[i % len(colors)]
        pts = [(r, s) for r, s in pts if s is not None]
        if not pts:
            continue
        out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>'
                   % (c, " ".join("%.1f,%.1f" % (x(r), y(s)) for r, s in pts)))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (x(1) + 8, 40 + 14 * i, c, m))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def pareto_points(data, n, mode, task="passkey"):
    """[(bytes fraction, score, method, ratio)] of every measured spec at (n, mode), the f16 baseline once."""
    pts, base = [], None
    for (m, nn, md), rep in sorted(data.items()):
        if nn != n or md != mode:
            continue
        for i, (_, r, sc, frac) in enumerate(cell_scores(rep, m)):
            if frac is None or sc.get(task) is None:
                continue
            if i == 0:
                base = base or (frac, sc[task], "f16", 0.0)
            elif r is not None:
                pts.append((frac, sc[task], m, r))
    return ([base] if base else []) + pts


def frontier(pts):
    """The points no other point beats on both axes (fewer bytes and a higher score), by bytes."""
    best, out = -1.0, []
    for p in sorted(pts, key=lambda p: (p[0], -p[1])):
        if p[1] > best:
            out.append(p)
            best = p[1]
    return out


def svg_pareto(title, pts):
    """passkey score vs bytes held, a dot per spec coloured by method, the frontier as a staircase."""
    W, H, L, B, R = 560, 320, 50, 40, 170
    x = lambda f: L + min(f, 1.05) / 1.05 * (W - L - R)
    y = lambda s: H - B - s * (H - B - 30)
    methods = sorted({p[2] for p in pts})
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
              "#bcbd22", "#17becf", "#000000", "#aa3377", "#66ccee", "#228833", "#ccbb44", "#ee6677",
              "#4477aa", "#994455", "#997700", "#6699cc"]
    col = {m: colors[i % len(colors)] for i, m in enumerate(methods)}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (W, H), '<text x="%d" y="16" font-size="13">%s</text>' % (L, title)]
    for t in [0, 0.25, 0.5, 0.75, 1.0]:
        out.append('<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>' % (L, y(t), x(1.05), y(t)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%d%%</text>' % (L - 4, y(t) + 4, 100 * t))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x(t), H - B + 14, t))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">KV bytes held vs f16</text>' % (x(0.5), H - 6))
    f = frontier(pts)
    if f:
        steps = []
        for i, p in enumerate(f):
            if i:
                steps.append("%.1f,%.1f" % (x(p[0]), y(f[i - 1][1])))
            steps.append("%.1f,%.1f" % (x(p[0]), y(p[1])))
        out.append('<polyline fill="none" stroke="#999" stroke-dasharray="4,3" points="%s"/>' % " ".join(steps))
    for p in pts:
        out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x(p[0]), y(p[1]), col[p[2]]))
    for i, m in enumerate(methods):
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - R + 10, 40 + 13 * i, col[m], m))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def kld_section(data):
    """One table per chunk length: mean KLD against the full f16 cache by method and ratio (bytes held)."""
    lines = []
    for n in LENGTHS:
        runs = sorted((m, rep) for (m, nn, md), rep in data.items() if nn == n and md == KLD_MODE)
        if not runs:
            continue
        if not lines:
            lines = ["## Perplexity and KLD", "",
                     "`kvx eval --tasks ppl,kld` on the recall model's held-out text (`../shared/%s`), %d chunks; "
                     "each chunk's first %d%% is prefilled and compressed once (question excluded: there is no "
                     "question), the rest is scored token by token against the full f16 cache, so every scored "
                     "token reads the compressed cache. Cells: mean KLD (bytes held vs f16)." % (
                         KLD_TEXT, KLD_CHUNKS, round(100 * KLD_CONTEXT)), ""]
        lines += ["### chunks of %d tokens (%d compressed, %d scored)" % (
                      n, round(KLD_CONTEXT * n), n - round(KLD_CONTEXT * n) - 1), "",
                  "| method | " + " | ".join("r=%g" % r for r in [0] + RATIOS) + " |",
                  "|---|" + "---:|" * (1 + len(RATIOS))]
        for m, rep in runs:
            # one cell per ratio column: a codec combination's r=0 is the codec alone (its f16 baseline,
            # KLD 0, is left out), a policy's r=0 is the f16 baseline
            lines.append("| %s | %s |" % (m, " | ".join("%s (%s)" % (fmt_kld(k), fmt(f))
                                                         for r, k, _, f in kld_cells(rep, m) if r is not None)))
        lines.append("")
    return lines


def render(out):
    data = load()
    lines = ["# KV eviction: score-based policies on the recall model", "",
             "Rendered by `scripts/eviction_report.py` from `docs/results/eviction/*.json` (never typed). "
             "Each run: `kvx eval` on `../shared/models/recall` (baseline: the full f16 cache = ratio 0), tasks "
             "%s at depths %s, the cache compressed once with the question **excluded** (after the context: the "
             "cache could serve any question) or **included** (after the whole prompt). `bytes` is the pool's "
             "bytes at the end of a sequence over the baseline's (what the pool really holds, compaction "
             "included). `live slots`: the live entries over the slots of the pages held, at that sequence (fragmentation: "
             "a policy's `compact` threshold packs tables whose live fraction falls under it; – in runs measured "
             "before kvx eval reported it). Scores: passkey and niah_multikey exact, needle ROUGE-1 F1." % (", ".join(TASKS), DEPTHS),
             "", "Reproduce / extend: `nohup scripts/eviction_report.py --run > /tmp/eviction.log 2>&1 &` "
             "(hours on 2 cores), then commit `docs/results/eviction/` and the rendered files. The specs of a "
             "method share each prompt's prefill where their policies allow (`kvx eval --prefill-cache`, identical "
             "results, docs/eval.md): at 8192 tokens a SnapKV or TOVA run takes about a minute, H2O's, which "
             "cannot share, over twenty.", "",
             "Shared contexts (SCBench's protocols: one context compressed once, then several questions against "
             "it, or a conversation): [scbench.md](scbench.md).", ""]
    # The resolution of a cell, from the runs themselves: prompts per task = trials per depth x depths.
    per_cell = sorted({len(r["settings"]["passkey"]["depths"]) * r["settings"]["passkey"]["trials"]
                       for (m, n, mode), r in data.items() if mode != KLD_MODE and "passkey" in r.get("settings", {})})
    if per_cell:
        lines += ["**Resolution.** Each task's cell is %s prompt%s (one per depth, `--trials` per depth), so a "
                  "score moves in steps of %s: a difference of one prompt between two methods is noise, not a "
                  "ranking. The perplexity and KLD table (below) scores every token after the compressed part of "
                  "each chunk (hundreds per chunk) and separates methods far more finely." %
                  (" or ".join(map(str, per_cell)), "" if per_cell == [1] else "s",
                   " or ".join("%.0f%%" % (100.0 / k) for k in per_cell)), ""]
    measured = sorted({(m, n, mode) for (m, n, mode) in data})
    if not measured:
        lines += ["**No results yet.**", ""]
    summary = ["## Passkey by ratio, every method", "", "Passkey accuracy by ratio removed (bytes vs f16 in "
               "brackets); each method's section below has every task.", ""]
    header = "| method | length | question | " + " | ".join("r=%g" % r for r in [0] + RATIOS) + " |"
    summary += [header, "|" + "---|" * (3 + 1 + len(RATIOS))]
    for m, (spec_fn, paper, kvx) in METHODS.items():
        lines += ["## %s" % m, "", "**Paper.** " + paper, "", "**kvx.** " + kvx, ""]
        note = os.path.join(NOTES, m + ".md")
        if os.path.exists(note):
            with open(note) as f:
                lines += [f.read().rstrip("\n"), ""]
        lines += ["**Spec at ratio r, length n** (e.g. r = 0.5, n = 4096): `%s`" % spec_fn(0.5, 4096), ""]
        rows = [(n, mode) for (mm, n, mode) in measured if mm == m and mode != KLD_MODE]
        kld_rows = [n for (mm, n, mode) in measured if mm == m and mode == KLD_MODE]
        if not rows and not kld_rows:
            lines += ["Not measured yet.", ""]
            continue
        if rows:
            lines += ["| length | question | ratio | " + " | ".join(TASKS) + " | bytes vs f16 | live slots |",
                      "|---:|---|---:|" + "---:|" * len(TASKS) + "---:|---:|"]
        for n, mode in rows:
            live = live_fractions(data[(m, n, mode)])
            for i, (spec, ratio, scores, frac) in enumerate(cell_scores(data[(m, n, mode)], m)):
                lines.append("| %d | %s | %s | %s | %s | %s |" % (n, mode, "–" if ratio is None else "%g" % ratio,
                             " | ".join(fmt(scores.get(t)) for t in TASKS), fmt(frac),
                             fmt(live[i] if i < len(live) else None)))
            # one cell per ratio column, as in the KLD tables: a codec combination's r=0 is the codec alone
            # (its f16 baseline row is left out), a policy's r=0 is the f16 baseline
            cs = cell_scores(data[(m, n, mode)], m)
            summary.append("| %s | %d | %s | %s |" % (m, n, mode, " | ".join(
                "%s (%s)" % (fmt(s.get("passkey")), fmt(f)) for _, r, s, f in cs if r is not None)))
        lines.append("")
        if kld_rows:
            lines += ["| chunk | ratio | perplexity | mean KLD | bytes vs f16 | live slots |",
                      "|---:|---:|---:|---:|---:|---:|"]
            for n in kld_rows:
                live = live_fractions(data[(m, n, KLD_MODE)])
                for i, (ratio, kld, ppl, frac) in enumerate(kld_cells(data[(m, n, KLD_MODE)], m)):
                    lines.append("| %d | %s | %s | %s | %s | %s |" % (n, "–" if ratio is None else "%g" % ratio,
                                 fmt(ppl, False), fmt_kld(kld), fmt(frac), fmt(live[i] if i < len(live) else None)))
            lines.append("")
    # Curves: passkey score vs ratio, per (length, mode).
    plots = []
    for n in LENGTHS:
        for mode in MODES:
            series = {}
            for (m, nn, md), rep in data.items():
                if nn == n and md == mode:
                    series[m] = [(r, s.get("passkey")) for _, r, s, _ in cell_scores(rep, m) if r is not None]
            if series:
                name = "eviction-passkey-%d-%s.svg" % (n, mode)
                out.write("docs/" + name, svg_curves("passkey, %d tokens, question %s" % (n, mode), series))
                plots.append(name)
    if plots:
        lines += ["## Score vs ratio", ""] + ["![%s](%s)" % (p, p) for p in plots] + [""]
    # Pareto: quality vs bytes over every method and codec combination, per (length, question mode).
    pareto = []
    for n in LENGTHS:
        for mode in MODES:
            pts = pareto_points(data, n, mode)
            if len(pts) < 2:
                continue
            name = "eviction-pareto-%d-%s.svg" % (n, mode)
            out.write("docs/" + name, svg_pareto("passkey vs KV bytes, %d tokens, question %s" % (n, mode), pts))
            pareto += ["### %d tokens, question %s" % (n, mode), "", "![%s](%s)" % (name, name), "",
                       "The frontier (no other spec holds fewer bytes with a higher passkey score):", "",
                       "| spec | ratio | bytes vs f16 | passkey |", "|---|---:|---:|---:|"]
            pareto += ["| %s | %g | %s | %s |" % (m, r, fmt(fr), fmt(sc)) for fr, sc, m, r in frontier(pts)] + [""]
    if pareto:
        lines += ["## Pareto: passkey vs KV bytes, every method and codec", "",
                  "One dot per measured spec; bytes are the pool's own count against the full f16 cache, so a "
                  "codec and a policy multiply. Combinations (`kivi2+snapkv-maxpool` ...) are eviction on "
                  "quantized pages.", ""] + pareto
    lines += kld_section(data)
    lines += speed_section()
    # The passkey summary goes before the per-method sections (after the intro).
    first_method = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    lines[first_method:first_method] = summary + [""] if measured else []
    out.write(DOC, "\n".join(lines).rstrip("\n") + "\n")
    out.readme_block("kv-eviction", "\n".join(readme_headline(data)))


def readme_headline(data, n=min(LENGTHS), ratios=(0.5, 0.75), passkey_at=(4096, "included")):
    """The README's eviction table: every method ranked by its mean KLD at the first ratio (the finest
    separation the sweep has, kld_section), with the bytes it held and its passkey score at `passkey_at`."""
    rows = []
    for m in METHODS:
        rep = data.get((m, n, KLD_MODE))
        if rep is None:
            continue
        kld = {r: (k, f) for r, k, _, f in kld_cells(rep, m) if r is not None}
        pk = data.get((m,) + passkey_at)
        passkey = {r: s.get("passkey") for _, r, s, _ in cell_scores(pk, m)} if pk else {}
        if all(r in kld and kld[r][0] is not None for r in ratios):
            rows.append((kld[ratios[0]][0], m, kld, passkey))
    if not rows:
        return ["Eviction: no sweep results committed yet; run `scripts/eviction_report.py --run` "
                "(see [docs/kv-eviction.md](docs/kv-eviction.md))."]
    out = ["Every method of the eviction sweep (eviction, merging, demotion, head typing, Quest, ThinK, and "
           "policies on quantized pages) on the recall model, ranked by mean KL divergence from the full f16 "
           "cache at ratio %g (chunks of %d tokens, %d%% of each compressed once, the rest "
           "scored; bytes held vs f16 in brackets), with passkey accuracy at %d tokens (question %s). "
           "Per-method pages, every task, length and ratio, the Pareto charts and decode speed: "
           "[docs/kv-eviction.md](docs/kv-eviction.md) (rendered by `scripts/eviction_report.py`)." % (
               ratios[0], n, round(100 * KLD_CONTEXT), passkey_at[0], passkey_at[1]), "",
           "| method | " + " | ".join("KLD, r=%g" % r for r in ratios) + " | " +
           " | ".join("passkey, r=%g" % r for r in ratios) + " |", "|---|" + "---:|" * (2 * len(ratios))]
    for _, m, kld, passkey in sorted(rows, key=lambda row: row[0]):
        out.append("| %s | %s | %s |" % (m, " | ".join("%s (%s)" % (fmt_kld(kld[r][0]), fmt(kld[r][1])) for r in ratios),
                                        " | ".join(fmt(passkey.get(r)) for r in ratios)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"))
    ap.add_argument("--shared", default=os.path.normpath(os.path.join(ROOT, "../shared")))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--run", action="store_true", help="run the sweep (skips runs already complete)")
    ap.add_argument("--force", action="store_true", help="re-run complete runs too")
    ap.add_argument("--only", default="", help="comma-separated methods (default: all)")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--modes", default=",".join(MODES + [KLD_MODE]),
                    help="excluded, included (the retrieval tasks) and kld (perplexity and KLD)")
    ap.add_argument("--trials", type=int, default=1, help="prompts per (length, depth) cell")
    ap.add_argument("--speed", action="store_true", help="measure decode speed with each policy at 8k (kvx bench)")
    ap.add_argument("--speed-model", default="/tmp/kvx-bench-models/smollm2-135m-q8_0.gguf")
    ap.add_argument("--llama-bin", default="", help="llama.cpp build's bin/ (llama-batched-bench) for --speed")
    ap.add_argument("--rounds", type=int, default=3, help="--speed rounds")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.speed:
        run_speed(args)
    if args.run:
        if not os.path.exists(os.path.join(args.shared, MODEL)):
            sys.exit("the recall model is missing: %s" % os.path.join(args.shared, MODEL))
        run(args)
    out = Output(args.check)
    render(out)
    out.finish("eviction report")


if __name__ == "__main__":
    main()
