#!/usr/bin/env python3
"""Batched decode throughput: `kvx bench --seqs` beside llama.cpp's `llama-batched-bench`
on the same GGUF, in the same run. Writes the raw outputs to docs/results/batched/ and
renders the table into docs/benchmarks.md (between <!-- batched:begin --> and
<!-- batched:end -->; the README links it from its speed headline).

Usage:
  scripts/batched_report.py --model GGUF [--threads 2] [--llama-bin DIR]   measure, save, render
  scripts/batched_report.py --render                                       render from the saved data
  scripts/batched_report.py --check                                        fail if the documents differ
                                                                           from what the saved data renders
  scripts/batched_report.py --model GGUF --before OLD_KVX --after NEW_KVX [--rounds 3] [--ab-name ab]
      before/after: the two binaries alternate, round after round, on the same model (no llama.cpp);
      the raw runs go to docs/results/batched/NAME.json, the table between <!-- SECTION:begin -->
      and <!-- SECTION:end --> (AB_SECTIONS: ab -> batched-ab, the step's GEMMs and threading; attn_ab ->
      attn-ab, attention at depth): medians of the rounds and the median of the per-round ratios.
  --llama-bin DIR   a llama.cpp build's bin/ folder; kvx never builds or ships llama.cpp.
"""
import argparse, json, os, re, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/results/batched")
SEQS = "1,2,4,8,16,32,64"
DEPTHS = [0, 1024, 4096]
GEN = 16
# llama-batched-bench really prefills every sequence's context: 32 + 16 sequences of 4096 tokens
# are 200k prompt tokens, and its one KV buffer for all sequences makes each prompt attend over every
# cell (8 x 4096 ran for over 12 minutes on 2 cores, 1+2+4 x 4096 over 20 on the loaded VM), so at
# depth 4096 it runs one sequence, as scripts/bench_report.py does, and at 1024 up to 8.
LLAMA_SEQS = {0: SEQS, 1024: "1,2,4,8", 4096: "1"}
# The before/after runs (--ab-name) and the section of docs/benchmarks.md each renders into.
AB_SECTIONS = {"ab": "batched-ab", "attn_ab": "attn-ab"}


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("command failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def measure(args):
    """--rounds rounds, each one kvx bench run (every sequence count and depth) then llama-batched-bench at every
    depth; kvx.json and llama_batched_bench.json are rewritten after every round, so an interrupted run keeps its
    complete rounds."""
    os.makedirs(DATA, exist_ok=True)
    kvx = os.path.join(ROOT, "build/kvx")
    tmp = os.path.join(DATA, "kvx_round.json")
    kvx_runs, rows = [], []
    for rnd in range(args.rounds):
        if not args.skip_kvx:
            run([kvx, "bench", "-m", args.model, "-t", str(args.threads), "--kv", "codec=f16", "--depths", "0",
                 "--seqs", SEQS, "--seq-depths", ",".join(map(str, DEPTHS)), "-r", "1", "-n", str(GEN), "--json", tmp])
            r = json.load(open(tmp))
            r["loadavg"] = os.getloadavg()[0]
            kvx_runs.append(r)
            with open(os.path.join(DATA, "kvx.json"), "w") as f:
                json.dump({"rounds": kvx_runs}, f, indent=1)
                f.write("\n")
        for depth in DEPTHS if args.llama_bin else []:
            most = max(int(n) for n in LLAMA_SEQS[depth].split(","))
            # llama-batched-bench decodes after a prompt of npp tokens per sequence (npp >= 1).
            npp = max(depth, 1)
            ctx = most * (npp + GEN) + 64
            text = run([os.path.join(args.llama_bin, "llama-batched-bench"), "-m", args.model, "-t", str(args.threads),
                        "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(npp), "-ntg", str(GEN), "-npl", LLAMA_SEQS[depth],
                        "--output-format", "jsonl"])
            for line in text.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    row["depth"], row["round"] = depth, rnd
                    rows.append(row)
        with open(os.path.join(DATA, "llama_batched_bench.json"), "w") as f:
            json.dump({"model": os.path.basename(args.model), "threads": args.threads, "rows": rows}, f, indent=1)
            f.write("\n")
    if os.path.exists(tmp):
        os.remove(tmp)
    meta = {"model": os.path.basename(args.model), "threads": args.threads, "kv": "codec=f16", "gen_tokens": GEN,
            "rounds": args.rounds, "reps": 1}
    with open(os.path.join(DATA, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def kvx_bench_cmd(kvx, model, args, out):
    return [kvx, "bench", "-m", model, "-t", str(args.threads), "--kv", "codec=f16", "--depths", "0", "--seqs",
            args.ab_seqs, "--seq-depths", args.ab_depths, "-r", str(args.ab_reps), "-n", str(args.ab_gen), "--json", out]


def measure_ab(args):
    """Alternates the two binaries for --rounds rounds (before first in even rounds, after first in odd ones);
    one kvx bench run per binary and round. ab.json is
    rewritten after every round, so an interrupted run keeps its complete rounds."""
    os.makedirs(DATA, exist_ok=True)
    runs = {"before": [], "after": []}
    tmp = os.path.join(DATA, "ab_run.json")
    cmd = " ".join(kvx_bench_cmd("kvx", os.path.basename(args.model), args, "OUT"))
    script = "scripts/batched_report.py --model %s --before OLD_KVX --after NEW_KVX --rounds %d --ab-seqs %s " \
             "--ab-depths %s --ab-reps %d --ab-gen %d" % (os.path.basename(args.model), args.rounds, args.ab_seqs,
                                                          args.ab_depths, args.ab_reps, args.ab_gen)
    if args.ab_name != "ab":
        script += " --ab-name " + args.ab_name
    for rnd in range(args.rounds):
        # ABBA order: a load that drifts during a round favours neither binary.
        for side in ("before", "after") if rnd % 2 == 0 else ("after", "before"):
            run(kvx_bench_cmd(getattr(args, side), args.model, args, tmp))
            r = json.load(open(tmp))
            r["loadavg"] = os.getloadavg()[0]
            runs[side].append(r)
        with open(os.path.join(DATA, args.ab_name + ".json"), "w") as f:
            json.dump({"model": os.path.basename(args.model), "threads": args.threads, "command": cmd,
                       "script": script, "cpu": runs["after"][0].get("cpu", {}).get("brand", ""), "runs": runs},
                      f, indent=1)
            f.write("\n")
    os.remove(tmp)


def render_ab(name="ab"):
    path = os.path.join(DATA, name + ".json")
    if not os.path.exists(path):
        return "No before/after run saved yet (`scripts/batched_report.py --before ... --after ...`).\n"
    ab = json.load(open(path))
    before, after = ab["runs"]["before"], ab["runs"]["after"]
    med = statistics.median
    loads = [r["loadavg"] for r in before + after]
    script = ab.get("script", "scripts/batched_report.py --before OLD --after NEW")
    md = ["Measured by `%s` (raw runs in `docs/results/batched/%s.json`). " % (script, name) +
          "Before/after on %s, %d threads, CPU %s: `%s`, the two binaries alternating for %d rounds, in ABBA order "
          "(1-minute load average %.1f–%.1f on 2 vCPUs%s). Medians of the rounds; after / before is the median "
          "of the per-round ratios; %% of bound is the after binary's (one bound per run)." % (
              ab["model"], ab["threads"], ab["cpu"] or "?", ab["command"], len(after), min(loads), max(loads),
              ": an idle machine" if max(loads) < 2 else
              ": other engineers' builds ran; read the ratios, not the absolute figures"), "",
          "| measure | before tok/s | after tok/s | after / before | after % of bound |",
          "|---|---|---|---|---|"]

    def row(name, get, pct):
        b, a = [get(r) for r in before], [get(r) for r in after]
        md.append("| %s | %.1f | %.1f | %.2f | %.1f%% |" % (
            name, med(b), med(a), med([x / y for x, y in zip(a, b)]), med([pct(r) for r in after])))

    row("prefill %d" % after[0]["prefill"]["tokens"], lambda r: r["prefill"]["tok_s"],
        lambda r: r["prefill"]["pct_of_bound"])
    row("decode, one session, depth 0", lambda r: r["decode"][0]["tok_s"], lambda r: r["decode"][0]["pct_of_bound"])
    for i, b in enumerate(after[0]["batch"]):
        row("%d sequence%s, depth %d" % (b["seqs"], "" if b["seqs"] == 1 else "s", b["depth"]), lambda r, i=i: r["batch"][i]["total_tok_s"],
            lambda r, i=i: r["batch"][i]["pct_of_bound"])
    return "\n".join(md) + "\n"


def spread(values, fmt="%.1f"):
    """The median and, with several rounds, (min–max)."""
    m = fmt % statistics.median(values)
    return m if len(values) < 2 else "%s (%s–%s)" % (m, fmt % min(values), fmt % max(values))


def render():
    saved = json.load(open(os.path.join(DATA, "kvx.json")))
    rounds = saved.get("rounds", [saved])  # one run before rounds were kept
    ll = json.load(open(os.path.join(DATA, "llama_batched_bench.json")))
    meta = json.load(open(os.path.join(DATA, "meta.json")))
    llama = {}  # (depth, sequences) -> total tok/s per round
    for r in ll["rows"]:
        llama.setdefault((r["depth"], r["pl"]), {})[r.get("round", 0)] = r["speed_tg"]
    seqs = ",".join(str(b["seqs"]) for b in rounds[0]["batch"] if b["depth"] == rounds[0]["batch"][0]["depth"])
    depths = sorted({b["depth"] for b in rounds[0]["batch"]})
    llama_seqs = {d: ",".join(str(n) for (dd, n) in sorted(llama) if dd == d) for d in depths}
    loads = [r["loadavg"] for r in rounds if "loadavg" in r]
    bw = [r["bound"]["read_gbps"] for r in rounds]
    peak = [r["bound"]["matmul_peak_gops"] for r in rounds]
    md = ["Measured by `scripts/batched_report.py --rounds %d` (raw data in `docs/results/batched/`): %s, %d threads, "
          "f16 KV on both sides, %d decoded tokens per sequence after a context of `depth` tokens each, CPU %s. "
          "Each round runs kvx then llama.cpp; every cell is the median of the %d rounds (min–max beside it), "
          "kvx / llama.cpp the median of the per-round ratios. kvx: `kvx bench --seqs %s --seq-depths %s -r %d` "
          "(one batched engine step decodes one token of every sequence; contexts filled with random K/V); "
          "llama.cpp: `llama-batched-bench -npp depth -ntg %d -npl N` (its prompts really prefilled, into one shared "
          "KV buffer: %s). The bound is a step's roofline: the decode weights once plus every sequence's KV bytes at "
          "the measured bandwidth, or the tokens' ops at the measured peaks, whichever is slower; each round divides "
          "by its own probes (read bandwidth %s GB/s, int8 peak %s G ops/s over the rounds)%s." % (
              len(rounds), meta["model"], meta["threads"], meta["gen_tokens"],
              rounds[0].get("cpu", {}).get("brand", "?"), len(rounds), seqs, ",".join(map(str, depths)), meta.get("reps", 1),
              meta["gen_tokens"], "; ".join("N = %s at depth %d" % (llama_seqs[d], d) for d in depths if llama_seqs[d]),
              spread(bw), spread(peak, "%.0f"),
              "; 1-minute load average %.1f–%.1f" % (min(loads), max(loads)) if loads else ""), "",
          "| sequences | depth | kvx total tok/s | kvx per-sequence tok/s | bound tok/s (by) | kvx % of bound | "
          "llama.cpp total tok/s | kvx / llama.cpp |",
          "|---|---|---|---|---|---|---|---|"]
    for i, b in enumerate(rounds[0]["batch"]):
        per = [r["batch"][i] for r in rounds]
        lt = llama.get((b["depth"], b["seqs"]), {})
        ratios = [p["total_tok_s"] / lt[k] for k, p in enumerate(per) if lt.get(k)]
        md.append("| %d | %d | %s | %s | %s (%s) | %s%% | %s | %s |" % (
            b["seqs"], b["depth"], spread([p["total_tok_s"] for p in per]), spread([p["per_seq_tok_s"] for p in per]),
            spread([p["bound_tok_s"] for p in per]), b["bound_kind"], spread([p["pct_of_bound"] for p in per]),
            spread(list(lt.values())) if lt else "–", "%.2f" % statistics.median(ratios) if ratios else "–"))
    single = [d["tok_s"] for r in rounds for d in r["decode"] if d["depth"] == 0]
    if single:
        md += ["", "The single-sequence path in the same runs (`kvx bench --depths 0`, one session, no batching): "
               "%s tok/s at depth 0." % spread(single)]
    return "\n".join(md) + "\n"


def splice(path, body, name="batched", text=None):
    text = open(path).read() if text is None else text
    new, n = re.subn(r"(<!-- %s:begin -->\n).*?(<!-- %s:end -->)" % (name, name),
                     lambda m: m.group(1) + body + m.group(2), text, flags=re.S)
    if n != 1:
        sys.exit("%s has no <!-- %s:begin --> ... <!-- %s:end --> section" % (path, name, name))
    return text, new


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", default="")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--skip-kvx", action="store_true", help="measure llama.cpp only, keep the saved kvx run")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--before", help="before/after: the old kvx binary")
    ap.add_argument("--after", help="before/after: the new kvx binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ab-seqs", default="1,2,4,8,16,32,64", help="before/after: kvx bench --seqs")
    ap.add_argument("--ab-depths", default="0,1024,4096", help="before/after: kvx bench --seq-depths")
    ap.add_argument("--ab-reps", type=int, default=2, help="before/after: kvx bench -r")
    ap.add_argument("--ab-gen", type=int, default=GEN, help="before/after: kvx bench -n")
    ap.add_argument("--ab-name", default="ab", choices=sorted(AB_SECTIONS),
                    help="before/after: the saved run and the section it renders into (AB_SECTIONS)")
    args = ap.parse_args()
    if not (args.render or args.check):
        if not args.model:
            sys.exit("--model GGUF is required to measure (or --render / --check)")
        if bool(args.before) != bool(args.after):
            sys.exit("--before and --after go together (two kvx binaries)")
        if args.before:
            measure_ab(args)
        else:
            measure(args)
    stale = []
    for doc in ("docs/benchmarks.md",):
        path = os.path.join(ROOT, doc)
        old, new = splice(path, render())
        for name, section in AB_SECTIONS.items():
            _, new = splice(path, render_ab(name), section, new)
        if args.check:
            if old != new:
                stale.append(doc)
        else:
            open(path, "w").write(new)
    if stale:
        sys.exit("stale batched-throughput section in %s: run scripts/batched_report.py --render" % ", ".join(stale))


if __name__ == "__main__":
    main()
