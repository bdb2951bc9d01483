#!/usr/bin/env python3
"""Renders the decode-speed tables of docs/kv-think.md from the A/B data that scripts/think_decode_ab.sh writes:
docs/results/think/decode_ab_8k.jsonl (kvx bench, one line per (round, binary, spec)) and
docs/results/think/attention_ab_8k.jsonl (kv_bench decode attention, one line per (round, binary, benchmark)).

  scripts/think_speed_report.py           # render into docs/kv-think.md
  scripts/think_speed_report.py --check   # fail if the doc differs from a fresh render
"""
import json, os, statistics, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs/kv-think.md")
BENCH = os.path.join(ROOT, "docs/results/think/decode_ab_8k.jsonl")
KERNEL = os.path.join(ROOT, "docs/results/think/attention_ab_8k.jsonl")
BEGIN, END = "<!-- think-speed:begin -->", "<!-- think-speed:end -->"
ORDER = {"before": 0, "after": 1}
KERNEL_NAMES = {"f16": "f16, all 64 key channels", "f16_keep32": "32 of 64 key channels kept (λ = 0.5)",
                "f16_keep20": "20 of 64 key channels kept (λ ≈ 0.69)"}


def load(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def ratios(runs, base):
    """Per-round ratios runs[k] / base[k] over the rounds both have."""
    return [runs[k] / base[k] for k in sorted(runs) if k in base]


def f16_reference(runs, key):
    """Per round, the mean of every binary's f16 run with `key` (the rest of the configuration): f16 caches run
    the same code in both binaries (bit-identical outputs), so both runs measure the same thing and their mean
    is a steadier reference on a shared machine than either alone."""
    ref = {}
    for (b, *rest), rounds in runs.items():
        if tuple(rest) != key:
            continue
        for k, x in rounds.items():
            ref.setdefault(k, []).append(x)
    return {k: sum(v) / len(v) for k, v in ref.items()}


def after_over_before(runs, b, key, time=False):
    """For the after binary: the median over rounds of its speed over the before binary's in the same round and
    configuration (speed: tok/s, or 1 / time); empty for the before binary."""
    if b != "after" or ("before",) + key not in runs:
        return ""
    a, p = runs[("after",) + key], runs[("before",) + key]
    rs = [(p[k] / a[k]) if time else (a[k] / p[k]) for k in sorted(a) if k in p]
    return "%.2f" % statistics.median(rs)


def render_bench(lines):
    runs = {}
    kv = {}
    for r in lines:
        runs.setdefault((r["bin"], r["spec"]), {})[r["round"]] = r["tok_s"]
        kv[(r["bin"], r["spec"])] = r["kv_bytes"]
    loads = [r["load"] for r in lines]
    out = ["**Whole decode** (`kvx bench -t 2 --depths 8192 -n 32 -p 64` on the smollm2-135m shape, q8_0 weights from "
           "`kvx gen-model`: the flags of `scripts/eviction_report.py --speed`; a spec with a policy fills the context "
           "with a real forward pass, compresses once, then decodes over what was kept). %d interleaved rounds, "
           "medians. Speed vs f16: per round, this run's tok/s over the mean of the round's two f16 runs (f16 caches run "
           "the same code in both binaries), then the median over rounds; after / before: per round, the after binary's "
           "tok/s over the before binary's for the same spec, then the median. Load average "
           "%.1f-%.1f on 2 CPUs while it ran (a sweep at nice 19 and other builds): absolute tok/s are not "
           "meaningful, the ratios are indicative." % (len({r["round"] for r in lines}), min(loads), max(loads)), "",
           "| binary | spec | decode tok/s (median) | speed vs f16 (median; each round) | after / before | KV MiB |",
           "|---|---|---:|---:|---:|---:|"]
    ref = f16_reference(runs, ("codec=f16",))
    for (b, spec), rounds in sorted(runs.items(), key=lambda x: (ORDER.get(x[0][0], 9), x[0][1] != "codec=f16",
                                                                   x[0][1])):
        rs = ratios(rounds, ref)
        out.append("| %s | `%s` | %.1f | %.2f (%s) | %s | %.1f |" % (
            b, spec, statistics.median(rounds.values()), statistics.median(rs), " / ".join("%.2f" % x for x in rs),
            after_over_before(runs, b, (spec,)), kv[(b, spec)] / 2**20))
    return out


def render_kernel(lines):
    runs = {}
    kv = {}
    for r in lines:
        parts = r["name"].split("/")
        cache, threads = parts[1], parts[3].split(":")[1]
        runs.setdefault((r["bin"], threads, cache), {})[r["round"]] = r["real_ms"]
        kv[cache] = r["kv_bytes"]
    out = ["**Attention alone** (`kv_bench --benchmark_filter='AllLayers(Pruned)?/f16(_keep32|_keep20)?/ctx:8192/'`: "
           "one decode step's attention over every layer of a smollm2-shaped 8k cache, 30 layers × 3 kv heads × 9 "
           "query heads, head_dim 64, pages of 16; the pruned caches keep the last 32 entries of each table whole). "
           "Same rounds as above; milliseconds per step (wall time), medians (min–max). Speed vs f16: per round, the "
           "mean f16 time of both binaries (same thread count) over this time, then the median over rounds: "
           "above 1 is faster; 1 / (KV bytes vs f16) is what a kernel bound by reading the cache would reach.", "",
           "| binary | threads | cache | ms per step | speed vs f16 | after / before | KV bytes vs f16 |",
           "|---|---:|---|---:|---:|---:|---:|"]
    for (b, threads, cache), rounds in sorted(runs.items(), key=lambda x: (x[0][1], ORDER.get(x[0][0], 9),
                                                                           x[0][2] != "f16", x[0][2])):
        ref = f16_reference(runs, (threads, "f16"))
        rs = [ref[k] / rounds[k] for k in sorted(rounds) if k in ref]  # > 1 is faster, as tok/s above
        v = list(rounds.values())
        out.append("| %s | %s | %s | %.2f (%.2f–%.2f) | %.2f | %s | %.3f |" % (
            b, threads, KERNEL_NAMES.get(cache, cache), statistics.median(v), min(v), max(v), statistics.median(rs),
            after_over_before(runs, b, (threads, cache), time=True), kv[cache] / kv["f16"]))
    return out


def render():
    return "\n".join(render_bench(load(BENCH)) + [""] + render_kernel(load(KERNEL)))


def main():
    doc = open(DOC).read()
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    new = doc[:a] + "\n" + render() + "\n" + doc[b:]
    if "--check" in sys.argv:
        if new != doc:
            sys.exit("docs/kv-think.md differs from scripts/think_speed_report.py's render")
        return
    open(DOC, "w").write(new)


if __name__ == "__main__":
    main()
