#!/usr/bin/env python3
"""Renders the Quest microbenchmark table of docs/kv-quest.md from
docs/results/quest/bench.json (google-benchmark JSON of build/quest_bench).

  scripts/quest_report.py --run     # run build/quest_bench (threads 1), then render
  scripts/quest_report.py           # render from the committed JSON
  scripts/quest_report.py --check   # fail if the doc differs from a fresh render
"""
import json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/results/quest/bench.json")
DOC = os.path.join(ROOT, "docs/kv-quest.md")
BEGIN, END = "<!-- quest-bench:begin -->", "<!-- quest-bench:end -->"


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
    table = render(json.load(open(DATA)))
    doc = open(DOC).read()
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    new = doc[:a] + "\n" + table + "\n" + doc[b:]
    if "--check" in sys.argv:
        if new != doc:
            sys.exit("docs/kv-quest.md differs from scripts/quest_report.py's render")
        return
    open(DOC, "w").write(new)


if __name__ == "__main__":
    main()
