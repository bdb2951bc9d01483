#!/usr/bin/env python3
"""KV eviction report (issues 21, 37): every eviction, selection, merging and demotion method x compression ratio
on the recall model (../shared/models/recall), measured with `kvx eval`, with intervals and paired verdicts.

    scripts/eviction_report.py --sweep          # passkey, 50 prompts per cell, 2k and 4k (hours on 2 loaded cores;
                                                #   nohup nice -n 5 scripts/eviction_report.py --sweep > /tmp/s.log 2>&1 &)
    scripts/eviction_report.py --kld            # long-context KLD: 4096 and 7935 tokens compressed, 256 scored
    scripts/eviction_report.py --sweep --only snapkv,h2o --lengths 2048   # one slice
    scripts/eviction_report.py --kld --ratios 0 # only the runs whose ratios are all listed (0: the codecs alone)
    scripts/eviction_report.py --speed --llama-bin DIR   # decode speed, pool bytes and RSS at 8k with each policy
                                                # (kvx bench) beside llama.cpp's f16 / q8_0 / q4_0 KV, same GGUF
    scripts/eviction_report.py --render-only    # docs/kv-eviction.md, its SVGs and the README section
    scripts/eviction_report.py --check          # render in memory, fail if the committed documents differ (ctest)

Each `kvx eval` run (one length and ratio, every method's spec beside one baseline whose prefill they share, see
sweep_runs) writes its report.json into docs/results/eviction/ as it goes (kvx eval --json rewrites it after every
task of every spec), and a run already complete is skipped, so an interrupted sweep keeps every run it finished
(an unfinished run is re-run whole; the render shows the finished specs of any run). The wall time of every run
goes to docs/results/eviction/sweep-times.jsonl. Every number in the documents comes from those files alone.

This file plans and runs the measurements and reads their results (load); eviction_render.py turns the results
into the documents.
"""
import argparse, glob, json, os, subprocess, sys, time

from reportlib import ROOT, Output

RESULTS = os.path.join(ROOT, "docs/results/eviction")
MODEL = "models/recall/recall-llama-8L-d512-f16.gguf"
RATIOS = [0.25, 0.5, 0.75, 0.875]  # ratio 0 is the baseline (the full f16 cache) of every run
# The long-context KLD runs' text: the recall model's held-out text.
KLD_TEXT = "golden/recall_val.txt"

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
        lambda r, n: "codec=int4,rotate=none" + ("" if r == 0 else ";policy=mikv,ratio=%g,mode=once" % r),
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


HEADS = "docs/results/head_typing/recall-%s.json"  # relative: kvx eval runs in the repository's root


def streaming_window(r, n, retrieval=0.0625, sinks=4):
    """The streaming heads' window that makes the whole cache keep (1 - r) x n entries, with a share
    `retrieval` of the heads keeping all n: retrieval x n + (1 - retrieval) x (sinks + w) = (1 - r) x n."""
    return max(16, round(((1 - r) - retrieval) * n / (1 - retrieval)) - sinks)


# The sweep (issue 37): cells of SWEEP_PROMPTS passkey prompts, one per depth spread evenly over [0, 1], each
# with its own seeded key, so every method is scored on the same prompts and paired tests apply. Runs are grouped
# so that prefills are shared (kvx eval --prefill-cache):
#   "shared": every f16 method whose policy reads only the pages and the prompt's last queries, at one ratio,
#             beside the f16 baseline whose prefill they take (-b SHARED_BATCH: each re-runs only the prompt's
#             last two 128-token calls);
#   "full":   H2O's accumulated attention and its descendants need the whole prefill (-b 512), one ratio;
#   a codec:  the methods on other pages (kivi4, kivi2, int8, int4, pre-RoPE f16) at every ratio, with the codec
#             alone as the run's baseline (their ratio-0 point), whose prefill the policies take; they are
#             paired with the f16 baseline of the "shared" run at the same length (same prompts, same seed).
# Priority order (an interrupted sweep keeps the most useful cells): 2k before 4k, the README's ratios first.
SWEEP_PROMPTS = 50
SWEEP_LENGTHS = [2048, 4096]
SWEEP_RATIOS = [0.5, 0.75, 0.25, 0.875]
RATIO_BATCHES = [[0.5], [0.75, 0.25, 0.875]]
SWEEP_MODE = "excluded"
SHARED_BATCH = 128
FULL_PREFILL = ["h2o", "scissorhands", "kvmerger", "mikv", "mikv-kivi2"]
# Rows that are floors are not run at longer lengths: a method at or below FLOOR_RATE at a ratio at a shorter
# length (on this model retrieval only gets harder with distance: it retrieves ~5k tokens back) would spend a
# full cell's compute to confirm a near-zero rate. The render lists what was dropped so.
FLOOR_RATE = 0.2
# Long-context KLD: KLD_CONTEXTS tokens of held-out text prefilled and compressed once, the next KLD_SCORED
# tokens scored token by token against the full f16 cache; the longest context ends its chunk at the trained
# 8192.
KLD_CONTEXTS = [4096, 8192 - 257]
KLD_SCORED = 256
KLD_LONG_CHUNKS = {4096: 2, 8192 - 257: 1}
KLD_BATCH = 7


# The papers' versions of kvx's deviations, as options (issue 37, "deviations on the record"): method -> (what the
# option restores, kvx's spec at ratio r and length n, the paper's). Each pair runs in one kvx eval run per measure
# (passkey at PAPER_LENGTH with the full-prefill batch, KLD at PAPER_CONTEXT), so the passkey pair is compared
# prompt by prompt (exact McNemar) and the KLD pair on the same scored tokens.
PAPER_VARIANTS = {
    "scissorhands": (
        "the history window as a ring of the last 32 queries (`ring=1`) instead of the exponential blend; both "
        "continuous (in once mode the window is the prompt's last 32 queries either way)",
        lambda r, n: "codec=f16;policy=scissorhands,ratio=%g" % r,
        lambda r, n: "codec=f16;policy=scissorhands,ratio=%g,ring=1" % r),
    "kvmerger": (
        "D2O's EMA similarity threshold (`merge_ema=0.9`: merge only the evicted at least as similar to their "
        "pivot as the running mean; β 0.9 is an assumption) instead of merging every evicted entry",
        lambda r, n: METHODS["kvmerger"][0](r, n),
        lambda r, n: METHODS["kvmerger"][0](r, n) + ",merge_ema=0.9"),
}
PAPER_RATIO = 0.5
PAPER_LENGTH = 2048
PAPER_CONTEXT = 4096


def paper_runs():
    """The KLD run, then the passkey run, each with every variant pair beside one f16 baseline."""
    specs = lambda n: [(m, PAPER_RATIO, make(PAPER_RATIO, n)) for m, (_, kvx, paper) in PAPER_VARIANTS.items()
                       for make in (kvx, paper)]
    return [("kld", PAPER_CONTEXT, [PAPER_RATIO], "paper", "codec=f16", specs(PAPER_CONTEXT)),
            ("passkey", PAPER_LENGTH, [PAPER_RATIO], "paper", "codec=f16", specs(PAPER_LENGTH))]


def sweep_depths():
    return ",".join("%.4g" % (i / (SWEEP_PROMPTS - 1)) for i in range(SWEEP_PROMPTS))


def page_group(method):
    """The pages a method's specs write: "f16", or the codec of a combination, or "prerope"."""
    spec = METHODS[method][0](0.5, 4096)
    if "prerope=1" in spec:
        return "prerope"
    return method.split("+")[0] if "+" in method and method.split("+")[0] in ("kivi4", "kivi2", "int8", "int4") \
        else "f16"


def group_baseline(group):
    return {"f16": "codec=f16", "prerope": "codec=f16,prerope=1", "kivi4": "codec=kivi4,page=32",
            "kivi2": "codec=kivi2,page=32", "int8": "codec=int8", "int4": "codec=int4,rotate=none"}[group]


def sweep_path(kind, length, ratios, group):
    return os.path.join(RESULTS, "%s_%d_%s_%s.json" % (kind, length, "all" if ratios is None else "r" + "-".join(
        "%g" % r for r in ratios), group))


def sweep_runs(args):
    """(kind, length, ratios or None, group, baseline, [(method, ratio, spec)]) in priority order: per length, the
    f16 methods at the README's ratio (RATIO_BATCHES[0]) in one run, the other ratios in a second run (one baseline
    for all of them), then the full-prefill methods likewise, then one run per other codec at every ratio."""
    methods = args.only.split(",") if args.only else list(METHODS)
    f16 = [m for m in methods if page_group(m) == "f16"]
    others = sorted({page_group(m) for m in methods} - {"f16"})
    dropped = floors()
    out = []
    for length in [int(x) for x in (args.lengths or ",".join(map(str, SWEEP_LENGTHS))).split(",")]:
        for group, members in (("shared", [m for m in f16 if m not in FULL_PREFILL]),
                               ("full", [m for m in f16 if m in FULL_PREFILL])):
            for ratios in RATIO_BATCHES:
                specs = [(m, r, METHODS[m][0](r, length)) for r in ratios for m in members
                         if (m, r, length) not in dropped]
                out.append(("passkey", length, ratios, group, "codec=f16", specs))
        for g in others:
            specs = [(m, r, METHODS[m][0](r, length)) for m in methods if page_group(m) == g for r in SWEEP_RATIOS
                     if (m, r, length) not in dropped]
            out.append(("passkey", length, None, g, group_baseline(g), specs))
    return [r for r in out if r[5]]


def floors():
    """{(method, ratio, length)} left out as floors: the method's passkey rate at that ratio is at most FLOOR_RATE
    at a shorter length."""
    out = set()
    for (m, r, n), c in load()["passkey"].items():
        if r > 0 and c["hits"] <= FLOOR_RATE * c["n"]:
            out |= {(m, r, longer) for longer in SWEEP_LENGTHS if longer > n}
    return out


def kld_runs(args):
    """Per ratio (the README's first) and context: the methods in batches of KLD_BATCH per run, since a run's
    ppl/kld results arrive only when its whole pass ends; then the codecs alone (the combinations' ratio 0)."""
    methods = args.only.split(",") if args.only else list(METHODS)
    contexts = [int(x) for x in args.lengths.split(",")] if args.lengths else KLD_CONTEXTS
    out = []
    for ratio in SWEEP_RATIOS:
        for ctx in contexts:
            for i in range(0, len(methods), KLD_BATCH):
                out.append(("kld", ctx, [ratio], "g%d" % (i // KLD_BATCH + 1), "codec=f16",
                            [(m, ratio, METHODS[m][0](ratio, ctx)) for m in methods[i:i + KLD_BATCH]]))
    codecs = {}
    for m in methods:
        if page_group(m) not in ("f16", "prerope"):
            codecs.setdefault(METHODS[m][0](0, 4096), m)
    for ctx in contexts:
        out.append(("kld", ctx, [0], "codecs", "codec=f16", [(m, 0, s) for s, m in codecs.items()]))
    return out


def finished_specs(kind, length):
    """Specs finished in complete runs of this kind and length, whatever their file's batch."""
    done = set()
    for path in glob.glob(os.path.join(RESULTS, "%s_%d_*.json" % (kind, length))):
        try:
            report = json.load(open(path))
        except ValueError:
            continue
        if report.get("complete"):
            done |= {s["spec"] for s in report.get("results", []) if s.get("done")}
    return done


def sweep_command(args, kind, length, group, baseline, specs, out):
    kvx = os.path.abspath(args.kvx)
    model = os.path.join(args.shared, MODEL)
    if kind == "kld":
        cmd = [kvx, "eval", "-m", model, "--baseline", baseline, "--tasks", "ppl,kld",
               "-f", os.path.join(args.shared, KLD_TEXT), "-c", str(length + KLD_SCORED + 1),
               "--chunks", str(KLD_LONG_CHUNKS[length])]
        if args.kld_fraction:  # binaries before --kld-score: the same context as a share of the chunk
            cmd += ["--chunk", str(length + KLD_SCORED + 1),
                    "--kld-context", "%.10g" % (length / (length + KLD_SCORED + 1.0))]
        else:
            cmd += ["--kld-context", str(length), "--kld-score", str(KLD_SCORED)]
        cmd += ["--compress", "excluded"]
    else:
        cmd = [kvx, "eval", "-m", model, "--baseline", baseline, "--tasks", "passkey", "-c", str(length),
               "--lengths", str(length), "--depths", sweep_depths(), "--passkey-trials", "1",
               "--compress", SWEEP_MODE, "--data", os.path.join(args.shared, "data"),
               "-b", str(SHARED_BATCH if group == "shared" else 512)]
    cmd += ["-t", args.threads, "-q", "--json", out]
    for _, _, s in specs:
        cmd += ["--kv", s]
    return cmd


def run_sweep(args, runs):
    log = os.path.join(RESULTS, "sweep-times.jsonl")
    if args.ratios:
        wanted = {float(r) for r in args.ratios.split(",")}
        runs = [run for run in runs if set(SWEEP_RATIOS if run[2] is None else run[2]) <= wanted]
    for kind, length, ratios, group, baseline, specs in runs:
        out = sweep_path(kind, length, ratios, group)
        if not args.force and {s for _, _, s in specs} <= finished_specs(kind, length):
            continue
        print(time.strftime("%H:%M:%S"), kind, length, ratios, group, len(specs), "specs", flush=True)
        t0 = time.time()
        subprocess.run(sweep_command(args, kind, length, group, baseline, specs, out), check=False, cwd=ROOT)
        with open(log, "a") as f:
            f.write(json.dumps({"kind": kind, "length": length, "ratios": ratios, "group": group,
                                "specs": len(specs), "seconds": round(time.time() - t0, 1),
                                "loadavg": os.getloadavg()[0], "finished": time.strftime("%Y-%m-%d %H:%M")}) + "\n")


def spec_index():
    """spec string -> [(method, ratio)], for every method, ratio and length the sweeps use (the codecs alone,
    ratio 0, serve two combinations)."""
    idx = {}
    for m in METHODS:
        for n in SWEEP_LENGTHS + KLD_CONTEXTS:
            for r in method_ratios(m):
                idx.setdefault((METHODS[m][0](r, n), n), []).append((m, r))
    return idx


def load():
    """{"passkey": {(method, ratio, length): cell}, "kld": {(method, ratio, context): cell}, "base": {length:
    f16 baseline cell}}. A passkey cell: n, hits, prompts {id: hit}, bytes (peak, vs the f16 baseline), live
    slots; a KLD cell: mean, stderr, scored tokens, chunks, perplexity, bytes. Only finished specs count."""
    idx = spec_index()
    data = {"passkey": {}, "kld": {}, "base": {}, "f16_bytes": {}}
    files = sorted(glob.glob(os.path.join(RESULTS, "passkey_*.json")) + glob.glob(os.path.join(RESULTS, "kld_*.json")))
    for path in files:
        try:
            report = json.load(open(path))
        except ValueError:  # being rewritten by a running sweep
            continue
        kind, n = os.path.basename(path).split("_")[:2]
        n = int(n)
        res = report.get("results", [])
        for i, s in enumerate(res):
            if kind == "passkey":
                t = s.get("passkey")
                if not t or not t.get("ok", True) or t.get("n", 0) == 0 or not s.get("done"):
                    continue
                cell = {"n": t["n"], "hits": t["hits"], "prompts": {p["id"]: p["hit"] for p in t.get("prompts", [])},
                        "peak": t["kv"]["peak_bytes"], "live": t["kv"].get("live_fraction"),
                        "seconds": t.get("seconds", 0), "reused": s.get("prefill_reused", 0)}
                if i == 0 and s["spec"] == "codec=f16":
                    data["base"][n] = cell
                    data["f16_bytes"][n] = cell["peak"]
            else:
                k, p = s.get("kld"), s.get("ppl") or {}
                if i == 0 and s["spec"] == "codec=f16":
                    data["f16_bytes"][("kld", n)] = p.get("kv", {}).get("peak_bytes")
                    continue
                if not s.get("done") or not k or not k.get("ok"):
                    continue
                cell = {"mean": k["mean"], "stderr": k["mean_stderr"], "p99": k["p99"], "top1": k["top1"],
                        "scored": k["n_positions"], "chunks": p.get("n_chunks"), "ppl": p.get("ppl"),
                        "peak": p.get("kv", {}).get("peak_bytes"), "live": k["kv"].get("live_fraction")}
            for m, r in idx.get((s["spec"], n), []):
                if i == 0 and r == 0 and kind == "passkey" and s["spec"] == "codec=f16":
                    continue  # the f16 baseline is no method's cell
                data[kind][(m, r, n)] = cell
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"))
    ap.add_argument("--shared", default=os.path.normpath(os.path.join(ROOT, "../shared")))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--sweep", action="store_true", help="the passkey sweep, %d prompts per cell" % SWEEP_PROMPTS)
    ap.add_argument("--kld", action="store_true", help="long-context KLD at %s tokens" % KLD_CONTEXTS)
    ap.add_argument("--paper", action="store_true", help="the papers' versions of the deviations against kvx's "
                    "(KLD at %d, passkey at %d)" % (PAPER_CONTEXT, PAPER_LENGTH))
    ap.add_argument("--kld-fraction", action="store_true", help="--kld: give the context as a share of the chunk "
                    "(kvx binaries without --kld-score)")
    ap.add_argument("--force", action="store_true", help="re-run complete runs too")
    ap.add_argument("--only", default="", help="comma-separated methods (default: all)")
    ap.add_argument("--lengths", default="", help="--sweep: default %s; --kld: contexts, default %s" % (
        SWEEP_LENGTHS, KLD_CONTEXTS))
    ap.add_argument("--ratios", default="", help="comma-separated: only the runs whose every ratio is listed (a "
                    "codec group measures %s; 0 is --kld's codecs alone)" % SWEEP_RATIOS)
    ap.add_argument("--speed", action="store_true", help="measure decode speed with each policy at 8k (kvx bench)")
    ap.add_argument("--speed-model", default="/tmp/kvx-bench-models/smollm2-135m-q8_0.gguf")
    ap.add_argument("--llama-bin", default="", help="llama.cpp build's bin/ (llama-batched-bench) for --speed")
    ap.add_argument("--rounds", type=int, default=3, help="--speed rounds")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.speed:
        run_speed(args)
    if args.sweep or args.kld or args.paper:
        if not os.path.exists(os.path.join(args.shared, MODEL)):
            sys.exit("the recall model is missing: %s" % os.path.join(args.shared, MODEL))
    if args.sweep:
        run_sweep(args, sweep_runs(args))
    if args.kld:
        run_sweep(args, kld_runs(args))
    if args.paper:
        run_sweep(args, paper_runs())
    import eviction_render  # here, not at the top: it imports this file's definitions
    out = Output(args.check)
    eviction_render.render(out)
    out.finish("eviction report")


if __name__ == "__main__":
    sys.modules["eviction_report"] = sys.modules[__name__]  # eviction_render's import finds this run, not a 2nd copy
    main()
