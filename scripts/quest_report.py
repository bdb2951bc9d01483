#!/usr/bin/env python3
"""Renders the Quest tables of docs/kv-quest.md: the microbenchmark from docs/results/quest/bench.json
(google-benchmark JSON of build/quest_bench) and the 8k decode A/B from docs/results/quest/decode_ab_8k.jsonl
(scripts/quest_decode_ab.sh: one line per (round, binary, spec) with its kvx bench tok/s).

  scripts/quest_report.py --run     # run build/quest_bench (threads 1), then render
  scripts/quest_report.py           # render from the committed JSON
  scripts/quest_report.py --check   # fail if the doc differs from a fresh render
"""
import json, os, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/results/quest/bench.json")
DOC = os.path.join(ROOT, "docs/kv-quest.md")
BEGIN, END = "<!-- quest-bench:begin -->", "<!-- quest-bench:end -->"
AB = os.path.join(ROOT, "docs/results/quest/decode_ab_8k.jsonl")
AB_BEGIN, AB_END = "<!-- quest-decode:begin -->", "<!-- quest-decode:end -->"
AB_NAMES = {"base": "before", "new1": "after"}  # the two binaries quest_decode_ab.sh compared


def render_ab(lines):
    """Median tok/s per (binary, spec) and the median over rounds of its ratio to the same binary's f16."""
    runs = {}
    for r in lines:
        runs.setdefault((r["bin"], r["spec"]), {})[r["round"]] = r["tok_s"]
    loads = [r["load"] for r in lines if "load" in r]
    out = ["Decode at 8k context, `kvx bench` on smollm2-135m q8_0 (`scripts/quest_decode_ab.sh`: per round every "
           "(binary, spec) once, %d rounds, medians; ratios against f16 taken inside each round, then the median). "
           "Load average %.0f-%.0f on 2 CPUs while it ran: absolute tok/s are not meaningful, the ratios are "
           "indicative. `before` = the scalar selection on the calling thread, `after` = the selection inside the "
           "attention items. Data: `docs/results/quest/decode_ab_8k.jsonl`." % (
               len({r["round"] for r in lines}), min(loads or [0]), max(loads or [0])), "",
           "| binary | spec | tok/s (median) | vs f16 (median of per-round ratios; each round) |",
           "|---|---|---:|---:|"]
    for (b, spec), rounds in sorted(runs.items(), key=lambda x: (x[0][0], x[0][1] != "codec=f16", x[0][1])):
        f16 = runs.get((b, "codec=f16"), {})
        ratios = [rounds[k] / f16[k] for k in sorted(rounds) if k in f16]
        out.append("| %s | `%s` | %.1f | %.2f (%s) |" % (AB_NAMES.get(b, b), spec, statistics.median(rounds.values()),
                   statistics.median(ratios), " / ".join("%.2f" % x for x in ratios)))
    return "\n".join(out)


def splice(doc, begin, end, table):
    a, b = doc.index(begin) + len(begin), doc.index(end)
    return doc[:a] + "\n" + table + "\n" + doc[b:]


def render(data):
    rows = [b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    full = next(b for b in rows if "/budget:0/" in b["name"])
    ctx = data.get("context", {})
    out = [f"Measured {ctx.get('date', '?')} on {ctx.get('num_cpus', '?')} CPUs "
           f"(`build/quest_bench --benchmark_filter=threads:1`, a shared machine: times are indicative).", "",
           "| budget (tokens per kv head) | bytes read per token | vs all pages | time per token, 30 layers | memory held |",
           "|---:|---:|---:|---:|---:|"]
    for b in rows:
        budget = int(b["name"].split("/budget:")[1].split("/")[0])
        out.append(f"| {'all (no selection)' if budget == 0 else budget} | {b['read_bytes'] / 2**20:.1f} MiB | "
                   f"{b['read_bytes'] / full['read_bytes']:.2f} | {b['real_time']:.1f} {b['time_unit']} | "
                   f"{b['kv_bytes'] / 2**20:.1f} MiB |")
    return "\n".join(out)


def main():
    if "--run" in sys.argv:
        subprocess.run([os.path.join(ROOT, "build/quest_bench"), "--benchmark_filter=threads:1",
                        "--benchmark_min_time=0.5", "--benchmark_format=json", "--benchmark_out=" + DATA],
                       check=True, stdout=subprocess.DEVNULL)
    doc = open(DOC).read()
    new = splice(doc, BEGIN, END, render(json.load(open(DATA))))
    new = splice(new, AB_BEGIN, AB_END, render_ab([json.loads(l) for l in open(AB) if l.strip()]))
    if "--check" in sys.argv:
        if new != doc:
            sys.exit("docs/kv-quest.md differs from scripts/quest_report.py's render")
        return
    open(DOC, "w").write(new)


if __name__ == "__main__":
    main()
