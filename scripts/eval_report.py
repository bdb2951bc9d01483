#!/usr/bin/env python3
"""Regenerates the kvx eval reports in docs/results/eval-<model>/ and the
results section of docs/eval.md, from data only.

Every number in those documents is rendered from the report.json committed
beside it: `kvx eval --render` draws report.md and the SVGs from a
report.json (byte for byte what the run wrote), and this script writes the
results section of docs/eval.md (between the eval-results markers) from the
same JSON files. Nothing there is typed by hand.

  scripts/eval_report.py [model ...]   run kvx eval on the models (default:
                                       all), then render everything
  scripts/eval_report.py --render-only re-render from the committed JSON
  scripts/eval_report.py --check       render into a temporary folder and
                                       compare with the committed documents;
                                       exit 1 on any difference (a ctest runs
                                       this: tests/eval_docs_test.cc)

Models (../shared/models, see its README for what each can do):
  tinystories656K, stories260K  every task but the RULER ones (they need
           more than these models' 512-token context), full defaults
  probe    ppl, kld, copy, passkey at context 2048 (8 ppl chunks, 4 copy
           sequences per distance, 1 passkey per cell; no induction heads,
           so lines, needle and the RULER tasks are left out)
  recall   passkey and the RULER tasks (niah_*, vt) at 2k, 4k and 8k tokens,
           depths 0, .5, 1, one prompt per cell (7 tasks x 9 prompts x 5
           caches, ~1.5M tokens: 20 minutes on 2 idle cores, hours on 2
           cores shared by four engineers), the specs f16, int8, kivi4, kivi2
           at page 32 against the f32 baseline
"""
import argparse, difflib, json, os, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs/results")
EVAL_MD = os.path.join(ROOT, "docs/eval.md")
BEGIN, END = "<!-- eval-results:begin -->", "<!-- eval-results:end -->"

SMALL_SPECS = ["codec=f16", "codec=int8", "codec=int4,rotate=none", "codec=int2,clip=0", "codec=kivi4,page=32", "codec=kivi2,page=32"]
# The RULER tasks need more than these models' 512 tokens (vt's prompt
# without noise is 616 tokens on TinyStories-656K), and they cannot retrieve.
SMALL_TASKS = "ppl,kld,copy,passkey,lines,needle"
RECALL_SPECS = ["codec=f16,page=32", "codec=int8,page=32", "codec=kivi4,page=32", "codec=kivi2,page=32"]
MODELS = {
    "tinystories656K": ("models/tinystories656K/TinyStories-656K-F32.gguf", SMALL_SPECS,
                        ["--tasks", SMALL_TASKS, "-f", "{shared}/golden/stories_eval.txt", "--copy-trials", "20"]),
    "stories260K": ("models/stories260K/stories260K-F32.gguf", SMALL_SPECS,
                    ["--tasks", SMALL_TASKS, "-f", "{shared}/golden/stories_eval.txt", "--copy-trials", "20"]),
    "probe": ("models/probe/probe-llama-6L-d256-f32.gguf", SMALL_SPECS,
              ["--tasks", "ppl,kld,copy,passkey", "-f", "{shared}/golden/probe_val.txt", "--chunks", "8",
               "--copy-trials", "4", "--passkey-trials", "1"]),
    "recall": ("models/recall/recall-llama-8L-d512-f16.gguf", RECALL_SPECS,
               ["--tasks", "passkey,ruler", "-c", "8192", "--lengths", "2048,4096,8192",
                "--depths", "0,0.5,1", "--passkey-trials", "1", "--ruler-trials", "1"]),
}
RETRIEVAL = ["passkey", "lines", "needle", "niah_word", "niah_number", "niah_uuid", "niah_multikey",
             "niah_multivalue", "vt"]
RULER = RETRIEVAL[3:]


def command(name, kvx, shared, threads, out_dir):
    gguf, specs, args = MODELS[name]
    cmd = [kvx, "eval", "-m", os.path.join(shared, gguf), "--data", os.path.join(shared, "data"), "-t", str(threads),
           "-q", "--report", out_dir]
    for s in specs:
        cmd += ["--kv", s]
    return cmd + [a.format(shared=shared) for a in args]


def run_models(names, kvx, shared, threads):
    # Run from the repository root with relative paths, so the reports name
    # ../shared/... rather than this machine's folders.
    for name in names:
        out = os.path.relpath(os.path.join(RESULTS, "eval-" + name), ROOT)
        if os.path.isdir(os.path.join(ROOT, out)):
            shutil.rmtree(os.path.join(ROOT, out))
        cmd = command(name, os.path.relpath(kvx, ROOT), os.path.relpath(shared, ROOT), threads, out)
        print("==", " ".join(cmd), flush=True)
        subprocess.run(["nice", "-n", "10"] + cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


def render_dir(kvx, json_path, out_dir):
    subprocess.run([kvx, "eval", "--render", json_path, "--report", out_dir, "-q"], check=True)


def load_reports():
    reports = {}
    for name in MODELS:
        p = os.path.join(RESULTS, "eval-" + name, "report.json")
        if os.path.exists(p):
            with open(p) as f:
                reports[name] = json.load(f)
    return reports


# ---- the results section of docs/eval.md, from the JSON ----

def pct(v, digits=1):
    return "%.*f%%" % (digits, 100.0 * v)


def by_spec(report):
    return {r["canonical"]: r for r in report["results"]}


def base_of(report):
    return next(r for r in report["results"] if r["baseline"])


def headline(task, t):
    return t["score"] if task in RULER or task == "needle" else t["accuracy"]


def fmt(task, v):
    return "%.3f" % v if task == "needle" else pct(v)


def ppl_sentence(name, rep):
    res = by_spec(rep)
    base = base_of(rep)
    f16 = next((r for c, r in res.items() if c.startswith("codec=f16")), None)
    if "ppl" not in base:
        return ""
    s = "%s: f32 cache %.4f" % (name, base["ppl"]["ppl"])
    if f16 and "ppl" in f16:
        s += ", f16 %.4f" % f16["ppl"]["ppl"]
    return s + " (c = %d, `%s`)" % (rep["settings"]["n_ctx"], os.path.basename(rep["settings"]["text"]))


def copy_sentence(name, rep):
    base = base_of(rep)
    if "copy" not in base:
        return ""
    src = {s["source"]: s for s in base["copy"]["sources"]}
    rnd, txt = src.get("random"), src.get("text")
    parts = []
    if rnd:
        ratio = rnd["accuracy"] / rnd["chance"] if rnd["chance"] else 0
        verdict = "no copying" if ratio < 2 else "%.0f× chance" % ratio
        parts.append("random spans **%s** top-1 on the repeat against chance %s (%s; %s on their first occurrence)"
                     % (pct(rnd["accuracy"], 2), pct(rnd["chance"], 3), verdict, pct(rnd["first_accuracy"], 2)))
    if txt:
        gain = [d for d in txt["by_distance"] if d["accuracy"] > d["first_accuracy"]]
        loss = [d for d in txt["by_distance"] if d["accuracy"] <= d["first_accuracy"]]
        s = "text spans **%s** against %s on the first occurrence" % (pct(txt["accuracy"]), pct(txt["first_accuracy"]))
        if gain and loss:
            s += "; the repeat gains at distance %s and not at %s" % (
                ", ".join("%d (%s vs %s)" % (d["distance"], pct(d["accuracy"]), pct(d["first_accuracy"])) for d in gain),
                ", ".join("%d (%s vs %s)" % (d["distance"], pct(d["accuracy"]), pct(d["first_accuracy"])) for d in loss))
        elif not gain:
            s += "; no gain at any distance"
        parts.append(s)
    n = base["copy"]["sources"][0]["n_scored"] if base["copy"]["sources"] else 0
    return "%s (%d scored tokens per source): %s." % (name, n, "; ".join(parts))


def small_retrieval_sentence(reports):
    best, where = 0.0, []
    needle = []
    for name, rep in reports.items():
        if name == "recall":
            continue
        for r in rep["results"]:
            for task in RETRIEVAL:
                if task not in r or not r[task]["ok"]:
                    continue
                if task == "needle":
                    needle.append(r[task]["score"])
                    continue
                best = max(best, max([headline(task, c) for c in r[task]["cells"]] + [0.0]))
                where.append(name)
    tasks = sorted({t for name, rep in reports.items() if name != "recall" for t in rep["settings"]["tasks"]
                    if t in RETRIEVAL and t != "needle"}, key=RETRIEVAL.index)
    s = "* **%s** on the three small models: the best cell of any spec scores %s" % (", ".join(tasks), pct(best))
    if needle:
        s += "; needle's mean ROUGE-1 F1 stays within %.3f–%.3f (function words only)" % (min(needle), max(needle))
    return s + (". They only show here that the pipeline runs and that compression creates no spurious hits."
                if best == 0 else ".")


def recall_section(rep):
    st = rep["settings"]
    specs = rep["results"]
    base = base_of(rep)
    tasks = [t for t in RETRIEVAL if t in st["tasks"] and all(t in r for r in specs)]  # all done
    n_ruler = next((base[t]["n"] for t in tasks if t in RULER), 0)
    lines = []
    lines.append("### Retrieval on the recall model (RULER-style tasks beside passkey)")
    lines.append("")
    lines.append("[`results/eval-recall`](results/eval-recall/report.md): `%s` (trained to retrieve; see "
                 "`../shared/models/recall/README.md`), lengths %s, depths %s, prompts per cell: %d for passkey, %d "
                 "for each RULER task; seed %d, against the `%s` baseline. Each cell: the score over all cells, then (after ·) on "
                 "the cells the baseline solves (every trial a hit); the first row gives how many cells that is. "
                 "niah_multivalue and vt score the share of values found (RULER's partial credit); the others are "
                 "exact match. Each RULER task has %d prompts per spec, so one prompt moves its score by %s: read "
                 "differences of one prompt as noise." % (os.path.basename(rep["model"]["path"]), ", ".join(map(str, st["passkey"]["lengths"])),
                                   ", ".join("%g" % d for d in st["passkey"]["depths"]), st["passkey"]["trials"],
                                   st["ruler"]["trials"], st["seed"], st["baseline"], n_ruler, pct(1.0 / max(1, n_ruler))))
    lines.append("")
    lines.append("| spec | KV bytes (peak) | vs f16 | " + " | ".join(tasks) + " |")
    lines.append("|---|---:|---:|" + "---:|" * len(tasks))
    row = "| cells the baseline solves | | |"
    for t in tasks:
        bs = base[t]["baseline_solved"]
        row += " %d/%d (%s) |" % (bs["solved"], bs["cells"], pct(bs["share"], 0))
    lines.append(row)
    for r in specs:
        row = "| `%s`%s | %.1f MiB | %.2f× |" % (r["canonical"], " (baseline)" if r["baseline"] else "",
                                                r["kv"]["peak_bytes"] / 2**20, r["kv"]["compression_vs_f16"])
        for t in tasks:
            x = r[t]
            if not x["ok"]:
                row += " error |"
                continue
            bs = x.get("baseline_solved", {})
            on = (bs["score"] if t in RULER else bs["accuracy"]) if bs.get("n") else None
            row += " %s · %s |" % (fmt(t, headline(t, x)), fmt(t, on) if on is not None else "–")
        lines.append(row)
    lines.append("")
    # Findings, each computed from the table above.
    notes = []
    for r in specs:
        if r["baseline"]:
            continue
        drops = []
        for t in tasks:
            bs = r[t].get("baseline_solved", {})
            if r[t]["ok"] and bs.get("n"):
                on = bs["score"] if t in RULER else bs["accuracy"]
                if on < 0.9:
                    drops.append("%s %s" % (t, pct(on)))
        name = "`%s`" % r["canonical"]
        if drops:
            notes.append("%s keeps less than 90%% on the cells the baseline solves in %s" % (name, ", ".join(drops)))
        else:
            notes.append("%s keeps at least 90%% on the solved cells of every task" % name)
    lines.append("* " + ";\n* ".join(notes) + ".")
    if "passkey" in tasks:
        # Issue 23's question: does passkey tell the caches apart as well as
        # needles in natural text do?
        def on_solved(r, t):
            bs = r[t].get("baseline_solved", {})
            return (bs["score"] if t in RULER else bs["accuracy"]) if bs.get("n") else None
        blind = []
        for r in specs:
            pk = on_solved(r, "passkey")
            worse = [t for t in tasks if t in RULER and on_solved(r, t) is not None and on_solved(r, t) < 0.9]
            if not r["baseline"] and pk is not None and pk >= 0.9 and worse:
                blind.append("`%s` keeps passkey at %s (%s on the solved cells) while %s" % (
                    r["canonical"], pct(headline("passkey", r["passkey"])), pct(pk),
                    ", ".join("%s falls from %s to %s" % (t, pct(headline(t, base[t])), pct(headline(t, r[t])))
                              for t in worse)))
        if blind:
            lines.append("* Passkey cannot see what the needles in natural text see: " + "; ".join(blind) + ".")
    unsolved = [t for t in tasks if base[t]["baseline_solved"]["solved"] == 0]
    if unsolved:
        lines.append("* The baseline solves no cell of %s: on this model those tasks measure nothing about the "
                     "cache (read them as floors)." % ", ".join(unsolved))
    lines.append("")
    lines.append("Reproduce: `%s`." % reproduce(rep, "docs/results/eval-recall"))
    return lines


def reproduce(rep, out_dir):
    """The kvx eval command behind a report, from its recorded settings."""
    st = rep["settings"]
    cmd = ["build/kvx", "eval", "-m", rep["model"]["path"], "--data", st["data_dir"]]
    for s in st["specs"]:
        cmd += ["--kv", s]
    cmd += ["--baseline", st["baseline"]] if st["baseline"] != "codec=f32" else []
    cmd += ["--tasks", ",".join(st["tasks"]), "-c", str(st["n_ctx"])]
    if any(t in st["tasks"] for t in ["passkey", "needle"] + RULER):
        cmd += ["--lengths", ",".join(map(str, st["passkey"]["lengths"])),
                "--depths", ",".join("%g" % d for d in st["passkey"]["depths"])]
    if "passkey" in st["tasks"]:
        cmd += ["--passkey-trials", str(st["passkey"]["trials"])]
    if any(t in st["tasks"] for t in RULER):
        cmd += ["--ruler-trials", str(st["ruler"]["trials"])]
        cmd += ["--ruler-gen", str(st["ruler"]["gen"])] if st["ruler"]["gen"] else []
    cmd += ["--seed", str(st["seed"])] if st["seed"] != 42 else []
    return " ".join(cmd + ["-t", "2", "--report", out_dir])


def results_section(reports):
    L = []
    L.append("Generated by `scripts/eval_report.py` from the `report.json` files in [`results/`](results/) (the "
             "reports themselves are rendered from the same files by `kvx eval --render`; `--check` verifies both "
             "in the test suite). Reports: " +
             ", ".join("[`results/eval-%s`](results/eval-%s/report.md)" % (n, n) for n in reports) + ".")
    L.append("")
    small = {n: r for n, r in reports.items() if n != "recall"}
    if small:
        L.append("### The three small models")
        L.append("")
        ppl = [s for s in (ppl_sentence(n, r) for n, r in small.items()) if s]
        if ppl:
            L.append("* **ppl / kld** separate the codecs on all three (tables in the reports). Baseline "
                     "perplexities: " + "; ".join(ppl) + ". llama.cpp's own runs on the same files are compared in "
                     "[`results/golden_perplexity.md`](results/golden_perplexity.md).")
        copies = [s for s in (copy_sentence(n, r) for n, r in small.items()) if s]
        if copies:
            rnd = [s["accuracy"] for r in small.values() if "copy" in base_of(r)
                   for s in base_of(r)["copy"]["sources"] if s["source"] == "random"]
            verdict = ""
            if rnd and max(rnd) < 0.01:
                verdict = (" None of them copies random spans (at most %s top-1 on a repeat), so on these models the "
                           "probe measures little beyond noise; on a model that copies (any real LLM) it separates "
                           "caches that keep distant tokens from those that do not." % pct(max(rnd), 2))
            L.append("* **copy** (f32 baseline): " + " ".join(copies) + verdict)
        L.append(small_retrieval_sentence(small))
        L.append("")
    if "recall" in reports:
        L += recall_section(reports["recall"])
    return "\n".join(L).rstrip() + "\n"


def splice(doc, section):
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:a] + "\n" + section + doc[b:]


# ---- modes ----

def compare_dirs(want, got):
    bad = []
    for name in sorted(set(os.listdir(want)) | set(os.listdir(got))):
        p, q = os.path.join(want, name), os.path.join(got, name)
        if not os.path.exists(p) or not os.path.exists(q):
            bad.append("%s: %s" % (name, "not rendered" if not os.path.exists(q) else "rendered but not committed"))
            continue
        with open(p, "rb") as f, open(q, "rb") as g:
            a, b = f.read(), g.read()
        if a != b:
            diff = list(difflib.unified_diff(a.decode(errors="replace").splitlines(),
                                             b.decode(errors="replace").splitlines(), "committed", "rendered",
                                             n=0, lineterm=""))[:12]
            bad.append("%s differs:\n    %s" % (name, "\n    ".join(diff)))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="models to run (default: all): " + ", ".join(MODELS))
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"))
    ap.add_argument("--shared", default=os.environ.get("KVX_SHARED", os.path.join(ROOT, "../shared")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--render-only", action="store_true", help="render from the committed JSON, run nothing")
    ap.add_argument("--check", action="store_true", help="compare a fresh rendering with the committed documents")
    args = ap.parse_args()
    for m in args.models:
        if m not in MODELS:
            sys.exit("eval_report.py: unknown model '%s' (%s)" % (m, ", ".join(MODELS)))
    if not os.path.exists(args.kvx):
        sys.exit("eval_report.py: %s not found (scripts/build.sh builds it)" % args.kvx)
    if not args.render_only and not args.check:
        run_models(args.models or list(MODELS), os.path.abspath(args.kvx), os.path.abspath(args.shared), args.threads)
    reports = load_reports()
    if not reports:
        sys.exit("eval_report.py: no docs/results/eval-*/report.json")
    with open(EVAL_MD) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        sys.exit("eval_report.py: docs/eval.md lacks the %s / %s markers" % (BEGIN, END))
    new_doc = splice(doc, results_section(reports))
    if args.check:
        bad = []
        with tempfile.TemporaryDirectory() as tmp:
            for name in reports:
                src = os.path.join(RESULTS, "eval-" + name)
                out = os.path.join(tmp, "eval-" + name)
                render_dir(args.kvx, os.path.join(src, "report.json"), out)
                bad += ["docs/results/eval-%s/%s" % (name, b) for b in compare_dirs(src, out)]
        if new_doc != doc:
            diff = difflib.unified_diff(doc.splitlines(), new_doc.splitlines(), "committed", "rendered", n=0,
                                        lineterm="")
            bad.append("docs/eval.md results section differs:\n    " + "\n    ".join(list(diff)[:12]))
        if bad:
            print("eval_report.py --check: the committed documents are not what the committed JSON renders to "
                  "(run scripts/eval_report.py --render-only):\n  " + "\n  ".join(bad))
            sys.exit(1)
        print("eval_report.py --check: %d reports and docs/eval.md match their JSON" % len(reports))
        return
    for name in reports:
        # Render beside, then replace the folder's files, so that no plot of
        # an earlier run stays behind.
        d = os.path.join(RESULTS, "eval-" + name)
        with tempfile.TemporaryDirectory() as tmp:
            render_dir(args.kvx, os.path.join(d, "report.json"), tmp)
            for f in os.listdir(d):
                os.remove(os.path.join(d, f))
            for f in os.listdir(tmp):
                shutil.copy(os.path.join(tmp, f), os.path.join(d, f))
    with open(EVAL_MD, "w") as f:
        f.write(new_doc)
    print("rendered %s and docs/eval.md" % ", ".join("eval-" + n for n in reports))


if __name__ == "__main__":
    main()
