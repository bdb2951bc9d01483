#!/usr/bin/env python3
"""SCBench's shared-context protocols (issue 37) on the recall model: docs/scbench.md.

    scripts/scbench_report.py --run                 # every protocol x length (tens of minutes on 2 cores; run it
                                                    #   in the background: nohup nice scripts/scbench_report.py
                                                    #   --run > /tmp/scbench.log 2>&1 &)
    scripts/scbench_report.py --run --protocols multi-turn --lengths 2048 --contexts 12   # one slice
    scripts/scbench_report.py --run --protocols multi-turn --lengths 4096 --contexts 6 --methods duo,quest,think
    scripts/scbench_report.py --batch               # kvx batch: N questions on one context, compress-once
                                                    #   policy, with and without the compressed cache
    scripts/scbench_report.py --render-only         # docs/scbench.md from docs/results/scbench/*.json
    scripts/scbench_report.py --check               # render in memory, fail if docs/scbench.md differs

Each run is one `kvx eval --protocol P --lengths L` over every method (the full f16 cache first) and writes
docs/results/scbench/P-L.json (kvx eval --json) plus P-L.meta.json (the command and its wall time); the document is
rendered from those files alone.
"""
import argparse, glob, json, os, re, statistics, subprocess, sys, tempfile, time

import eviction_report
from reportlib import ROOT, Output, rel, sub_command_paths

RESULTS = os.path.join(ROOT, "docs/results/scbench")
DOC = "docs/scbench.md"
MODEL = "models/recall/recall-llama-8L-d512-f16.gguf"
PROTOCOLS = ["multi-query", "multi-turn"]
LENGTHS = [2048, 4096]
RATIO = 0.5
# name -> spec at ratio r for a context of n tokens (the full f16 cache is kvx eval's --baseline).
METHODS = {
    "streamingllm": lambda r, n: "codec=f16;policy=streamingllm,sinks=4,window=%d" % max(1, round((1 - r) * n) - 4),
    "snapkv-maxpool": lambda r, n: "codec=f16;policy=snapkv,ratio=%g,kernel=15,pool=max" % r,
    "h2o (continuous)": lambda r, n: "codec=f16;policy=h2o,ratio=%g" % r,
    "adakv": lambda r, n: "codec=f16;policy=adakv,base=snapkv,ratio=%g" % r,
    "pyramidkv": lambda r, n: "codec=f16;policy=pyramidkv,ratio=%g" % r,
    # the leaders of the passkey sweep (docs/kv-eviction.md), with the sweep's own specs
    "duo": lambda r, n: eviction_report.METHODS["duo"][0](r, n),
    "quest": lambda r, n: eviction_report.METHODS["quest"][0](r, n),
    "think": lambda r, n: eviction_report.METHODS["think"][0](r, n),
}


def shared(path):
    return os.path.join(os.environ.get("KVX_SHARED", os.path.join(ROOT, "../shared")), path)


def run(args):
    os.makedirs(RESULTS, exist_ok=True)
    for protocol in args.protocols:
        for length in args.lengths:
            base = os.path.join(RESULTS, "%s-%d%s" % (protocol, length, "-" + args.suffix if args.suffix else ""))
            cmd = [args.kvx, "eval", "-m", shared(MODEL), "--baseline", "codec=f16",
                   "--protocol", protocol, "--lengths", str(length), "--contexts", str(args.contexts),
                   "--questions", "4", "--data", shared("data"), "-t", str(args.threads), "--json", base + ".json"]
            for name in args.methods.split(",") if args.methods else METHODS:
                cmd += ["--kv", METHODS[name](RATIO, length)]
            t0 = time.time()
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)  # head tables are named relative to the repository
            meta = {"command": sub_command_paths(" ".join(cmd)), "seconds": round(time.time() - t0, 1),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg": os.getloadavg()[0]}
            with open(base + ".meta.json", "w") as f:
                json.dump(meta, f, indent=1)
                f.write("\n")


def batch(args):
    """kvx batch with N questions on one essay context: --compress-at prompt (each request compresses its own view
    of the cached whole prefix) vs prefix (compressed once, forked), and the prefix cache off (--no-grouping with
    cache none: every request computes and compresses everything)."""
    essays = sorted(f for f in glob.glob(shared("data/paul_graham_essays/*.txt")) if "LICENSE" not in os.path.basename(f))
    text = " ".join(open(f).read() for f in essays)
    context = " ".join(text.split())[: 4 * args.batch_context]  # ~4 characters per token
    spec = METHODS["snapkv-maxpool"](RATIO, args.batch_context)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra, cache in [("no reuse", ["--no-grouping"], "none"), ("compress-at prompt", [], "default"),
                                   ("compress-at prefix", ["--compress-at", "prefix"], "default")]:
            jsonl = os.path.join(tmp, "q.jsonl")
            with open(jsonl, "w") as f:
                for i in range(args.batch_questions):
                    f.write(json.dumps({"prompt": context + "\nQuestion %d: what is this text about? Answer:" % i,
                                        "max_tokens": 16, "cache": cache}) + "\n")
            cmd = [os.path.join(ROOT, "build/kvx"), "batch", jsonl, "-m", shared(MODEL), "--kv", spec, "-c",
                   str(args.batch_context + 512), "--parallel", str(args.batch_questions), "-t", str(args.threads),
                   "-o", os.path.join(tmp, "out.jsonl")] + extra
            walls, summary = [], ""
            for _ in range(args.repeats):
                t0 = time.time()
                p = subprocess.run(cmd, check=True, capture_output=True, text=True)
                walls.append(time.time() - t0)
                summary = p.stderr.strip().splitlines()[-1]
            walls.sort()
            rows.append({"mode": mode, "command": sub_command_paths(" ".join(cmd)).replace(jsonl, "QUESTIONS.jsonl"),
                         "wall_seconds_median": round(walls[len(walls) // 2], 2), "runs": len(walls),
                         "summary": summary})
            print(rows[-1], flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "batch.json"), "w") as f:
        json.dump({"questions": args.batch_questions, "context_tokens_about": args.batch_context, "spec": spec,
                   "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f, indent=1)
        f.write("\n")


def method_name(spec, length):
    if spec == "codec=f16":
        return "full cache (f16)"
    for name, make in METHODS.items():
        if make(RATIO, length) == spec:
            return name
    return spec


def runs():
    """(path, kvx eval report) of every protocol run, by name."""
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        if not path.endswith(".meta.json") and os.path.basename(path) != "batch.json":
            yield path, json.load(open(path))


def not_measured():
    """Per protocol and length: the methods no run measured yet and what running them costs (with the full cache
    beside them, on as many contexts as the cell's runs used) at the measured seconds per context and spec."""
    cells, pace = {}, {}
    for _, data in runs():
        length = data["rows"][0]["length"]
        cell = cells.setdefault((data["protocol"], length), {"methods": set(), "contexts": 0})
        for w in data["work"]:
            cell["methods"].add(method_name(w["spec"], length))
            cell["contexts"] = max(cell["contexts"], w["contexts"])
            pace.setdefault(data["protocol"], []).append(1000.0 * w["seconds"] / w["contexts"] / length)
    rows, total = [], 0.0
    for protocol in PROTOCOLS:
        for length in LENGTHS:
            cell = cells.get((protocol, length), {"methods": set(), "contexts": 0})
            missing = [m for m in METHODS if m not in cell["methods"]]
            if not missing:
                continue
            contexts = cell["contexts"] or max([c["contexts"] for (_, n), c in cells.items() if n == length] or [12])
            seconds = (len(missing) + 1) * contexts * statistics.median(pace.get(protocol) or [0]) * length / 1000
            total += seconds
            subset = " --methods '%s' --suffix more" % ",".join(missing) if cell["methods"] else ""
            rows.append("| %s | %d | %d | %s | `scripts/scbench_report.py --run --protocols %s --lengths %d "
                        "--contexts %d%s` | %.0f min |" % (protocol, length, contexts, ", ".join(missing), protocol,
                                                          length, contexts, subset, seconds / 60))
    lines = ["## Not measured yet", ""]
    if rows:
        lines += ["Methods no run measured yet, per protocol and length, on as many contexts as that cell's runs "
                  "(cost: the methods and the full cache beside them at the median seconds per context and spec of "
                  "the finished runs of the protocol, per 1000 tokens of length; the loaded shared VM's pace):", "",
                  "| protocol | length | contexts | methods missing | command | cost |", "|---|---:|---:|---|---|---:|"]
        lines += rows + ["| | | | | total | ≈ %.1f h |" % (total / 3600), ""]
    return lines + ["- More contexts: every cell has %s contexts (each interval shrinks as 1/sqrt(n)); "
                    "`--contexts 24` doubles to quadruples each run's cost." % "–".join(
                        str(n) for n in sorted({c["contexts"] for c in cells.values()}))]


def render(out):
    lines = ["# SCBench's shared-context protocols on the recall model", "",
             "Rendered by `scripts/scbench_report.py` from `docs/results/scbench/*.json` (never typed). What the "
             "protocols are and how kvx runs them: [eval/scbench.h](../src/eval/scbench.h) and "
             "[docs/eval.md](eval.md#scbenchs-shared-context-protocols---protocol-multi-query--multi-turn); the compressed cache they use: "
             "[engine/compressed_cache.h](../src/engine/compressed_cache.h).", "",
             "Each context is RULER's niah_multikey haystack (Paul Graham essays, 4 needles \"One of the special "
             "magic numbers for KEY is: VALUE.\", distinct keys), prefilled and compressed **once** with the question "
             "excluded (ratio %g: half the context's entries removed), then 4 questions, one per key, in an order "
             "shuffled per context. **multi-query**: each question a copy-on-write fork of that one compressed cache; "
             "**multi-turn**: one conversation, each answer (the model's own) joins the context before the next "
             "question. Cells: exact-match rate, Wilson 95%% interval, hits/n (n = contexts)." % RATIO, "",
             "**Caveat.** The recall model is weak at multi-key retrieval even with the full cache (RULER "
             "niah_multikey ~25-35%% in kvx eval: it confuses the four needles), so every rate here is low and the "
             "intervals are wide; read rows against the full cache's row, not as absolute scores. In multi-query "
             "every question index faces the same compressed cache (the question was excluded from the compression "
             "and the order is shuffled), so a method's columns differ by noise only; a method that loses the "
             "needles loses them for every question. In multi-turn the context grows by each answer, and continuous "
             "policies keep evicting as it grows.", ""]
    for path, data in runs():
        meta_path = path[:-5] + ".meta.json"
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        rows = data["rows"]
        length = rows[0]["length"] if rows else 0
        nq = max(r["question"] for r in rows) + 1 if rows else 0
        label = "turn" if data["protocol"] == "multi-turn" else "question"
        # a second run of one protocol and length (more methods on the same contexts) is named by its file's suffix
        suffix = os.path.basename(path)[:-5].split("-%d" % length, 1)[-1].lstrip("-")
        lines += ["## %s, %d tokens%s" % (data["protocol"], length, ", " + suffix if suffix else ""), ""]
        if meta:
            command = re.sub(r"\S*/shared/data\b", "../shared/data", meta["command"])
            lines += ["`%s` (%s s wall, %s; the machine shared with other builds, load average %s)" % (
                command, meta["seconds"], meta["date"],
                "%.0f at the end" % meta["loadavg"] if "loadavg" in meta else "above 20"), ""]
        lines += ["| method | " + " | ".join("%s %d" % (label, q + 1) for q in range(nq)) + " |",
                  "|---|" + "---:|" * nq]
        by_spec = {}
        for r in rows:
            by_spec.setdefault(r["spec"], {})[r["question"]] = r
        for spec, cells in by_spec.items():
            text = []
            for q in range(nq):
                c = cells[q]
                text.append("%.0f%% [%.0f, %.0f] %d/%d" % (100.0 * c["hits"] / max(c["n"], 1), 100 * c["lo"],
                                                           100 * c["hi"], c["hits"], c["n"]))
            lines.append("| %s | %s |" % (method_name(spec, length), " | ".join(text)))
        lines += ["", "| method | contexts | compressions | compressed-cache hits | prefix-cache hit tokens | "
                  "prompt tokens computed | seconds |", "|---|---:|---:|---:|---:|---:|---:|"]
        for w in data["work"]:
            lines.append("| %s | %d | %d | %d | %d | %d | %.0f |" % (
                method_name(w["spec"], length), w["contexts"], w["compressions"], w["compressed_hits"],
                w["prefix_hit_tokens"], w["prompt_tokens_computed"], w["seconds"]))
        lines.append("")
    batch_path = os.path.join(RESULTS, "batch.json")
    if os.path.exists(batch_path):
        b = json.load(open(batch_path))
        lines += ["## kvx batch: %d questions on one context, compress-once policy" % b["questions"], "",
                  "`%s`, a context of about %d tokens (%s). Wall time: median of the runs, the machine loaded by "
                  "other builds; the summary line is kvx batch's own (last run)." % (
                      b["spec"], b["context_tokens_about"], b["date"]), "",
                  "| mode | prompt tokens computed | compressions | wall s (median) | vs no reuse | runs | kvx batch summary |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        base = b["rows"][0]["wall_seconds_median"]
        for r in b["rows"]:
            computed = re.search(r"(\d+) computed", r["summary"]).group(1)
            compressions = re.search(r"(\d+) compressions", r["summary"]).group(1)
            lines.append("| %s | %s | %s | %.2f | %.2fx | %d | %s |" % (
                r["mode"], computed, compressions, r["wall_seconds_median"], r["wall_seconds_median"] / base,
                r["runs"], r["summary"].replace("|", "/")))
        commands = [re.sub(r"/tmp/\S+/out\.jsonl", "OUT.jsonl", r["command"]) for r in b["rows"]]
        lines += ["", "Commands (`scripts/scbench_report.py --batch`): " + "; ".join("`%s`" % c for c in commands), ""]
    lines += not_measured()
    lines += ["- SCBench's query-aware variant (compress with the first question included, then ask the others "
              "against that cache), where the literature sees later questions fail: kvx compresses with the question "
              "excluded, so every question faces the same cache.",
              "- A model that solves multi-key retrieval with the full cache: the recall model's floor hides "
              "differences between the better methods.", ""]
    out.write(DOC, "\n".join(lines).rstrip("\n") + "\n")
    out.finish("scbench")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"), help="--run: the kvx binary")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--batch", action="store_true")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--protocols", nargs="+", default=PROTOCOLS)
    ap.add_argument("--lengths", nargs="+", type=int, default=LENGTHS)
    ap.add_argument("--contexts", type=int, default=24)
    ap.add_argument("--methods", default="", help="--run: comma-separated methods (default: all of %s)" % ", ".join(METHODS))
    ap.add_argument("--suffix", default="", help="--run: name the results P-L-SUFFIX.json (a second run of a protocol "
                    "and length, e.g. the methods missing from the first)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-questions", type=int, default=8)
    ap.add_argument("--batch-context", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.run:
        run(args)
    if args.batch:
        batch(args)
    render(Output(args.check))


if __name__ == "__main__":
    main()
