#!/usr/bin/env python3
"""Runs kvx tune on the recall model at three KV budgets (4x, 6x and 10x smaller than f16 for 8 sessions of
4096 tokens) and renders the comparison table of docs/tune.md from the results it keeps in docs/results/tune/.

  scripts/tune_report.py --run [4x ...]  # run kvx tune (build/kvx) at every budget (or those named, in parallel), then render
  scripts/tune_report.py --bench         # decode speed at 8k of every budget's compared specs (kvx bench), then render
  scripts/tune_report.py           # render docs/tune.md from docs/results/tune/*.json
  scripts/tune_report.py --check   # fail if docs/tune.md or README.md's headline differs from a fresh render
"""
import json, os, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVX = os.environ.get("KVX_BIN", os.path.join(ROOT, "build/kvx"))  # a copy keeps a long run safe from rebuilds
DOC = os.path.join(ROOT, "docs/tune.md")
RESULTS = os.path.join(ROOT, "docs/results/tune")
SHARED = os.environ.get("KVX_SHARED", os.path.join(ROOT, "..", "shared"))
MODEL = os.path.join(SHARED, "models/recall/recall-llama-8L-d512-f16.gguf")
TEXT = os.path.join(SHARED, "data/wikitext-2-raw/wiki.test.raw")  # held out of the recall model's training
CTX = 4096
SESSIONS = 8  # a server's case: one session prefills at its peak beside the others' steady state
F16_BYTES = 4096 * CTX * SESSIONS  # recall: 4 KiB of f16 K+V per token
# Retrieval at --ctx (4096 tokens), 5 depths x 10 trials: n = 50 per spec (the n). The search at its
# defaults: the last rung at --ctx, 3 finalists.
RETRIEVAL = ["--tasks", "passkey", "--retrieval-length", "4096", "--retrieval-trials", "10", "--retrieval-compare"]
SEARCH = []
# The committed head tables (docs/kv-head-typing.md): duo on the copy task over the Jargon File, razor on random tokens.
HEADS = ["--duo-heads", "docs/results/head_typing/recall-duo.json", "--razor-heads", "docs/results/head_typing/recall-razor.json"]
BENCH_DEPTH = 8192
BENCH_ROUNDS = 9  # interleaved rounds of every spec; medians
THREADS = os.environ.get("KVX_TUNE_THREADS", "1")  # per budget; the budgets run side by side
TIME_BUDGET = os.environ.get("KVX_TUNE_TIME_BUDGET", "3600")  # seconds per budget (--time-budget)
BUDGETS = [("4x", F16_BYTES // 4), ("6x", F16_BYTES // 6), ("10x", F16_BYTES // 10)]
BEGIN, END = "<!-- tune:begin -->", "<!-- tune:end -->"
README = os.path.join(ROOT, "README.md")
HEADLINE = ("<!-- tune-headline:begin -->", "<!-- tune-headline:end -->")


def start(name, mem):
    """One budget's kvx tune, one thread (the budgets run side by side); its output goes to recall_NAME.log."""
    out = os.path.join(RESULTS, "recall_%s.json" % name)
    cmd = [KVX, "tune", "-m", MODEL, "--mem", str(mem), "--ctx", str(CTX), "--sessions", str(SESSIONS), "-f", TEXT,
           "-o", out, "--svg", os.path.join(RESULTS, "recall_%s.svg" % name), "-t", THREADS, "-q", "--time-budget", TIME_BUDGET] + SEARCH + RETRIEVAL + HEADS
    print("$", " ".join(cmd), flush=True)
    stale = os.path.join(RESULTS, "recall_%s.error" % name)
    if os.path.exists(stale):  # a previous run's error must not outlive this run's result
        os.remove(stale)
    log = open(os.path.join(RESULTS, "recall_%s.log" % name), "w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), time.time()


def finish(name, proc, t0):
    """Waits for one budget's run; keeps its wall and CPU time, and its error when nothing fits."""
    _, status, usage = os.wait4(proc.pid, 0)
    json.dump({"wall_s": time.time() - t0, "cpu_s": usage.ru_utime + usage.ru_stime},
              open(os.path.join(RESULTS, "recall_%s.time.json" % name), "w"))
    lines = open(os.path.join(RESULTS, "recall_%s.log" % name)).read().strip().splitlines()
    if status != 0 and lines:  # an impossible budget: keep its error, which names the smallest spec
        with open(os.path.join(RESULTS, "recall_%s.error" % name), "w") as f:
            f.write(lines[-1] + "\n")


ROLES = [("codec only", lambda c: c["family"] == "codec"), ("policy only", lambda c: c["family"] == "policy"),
         ("defaults", lambda c: c["defaults"])]


def compared_specs(d):
    """The chosen spec and the single-family specs tune compared it with, by role (without a finished retrieval
    check, the same rule tune uses: the lowest rung-0 KLD of each family)."""
    out = [("tuned", d["chosen"])]
    compared = (d.get("retrieval") or {}).get("compared")
    if compared is not None:
        return out + [(role, c) for role, c in compared.items()]
    return out + [(role, best_at_rung0(d["candidates"], pick)) for role, pick in ROLES]


def bench():
    """Decode tok/s at BENCH_DEPTH of f16 and every budget's compared specs: one kvx bench with every spec as a
    --kv, decoded in interleaved rounds (A, B, C, A, B, C ...), so each speed is a ratio to f16 inside one run."""
    specs = ["codec=f16"]
    for name, _ in BUDGETS:
        path = os.path.join(RESULTS, "recall_%s.json" % name)
        if os.path.exists(path):
            specs += [c["spec"] for _, c in compared_specs(json.load(open(path))) if c and c["spec"] not in specs]
    out_path = os.path.join(RESULTS, "bench_8k.json")
    cmd = [KVX, "bench", "-m", MODEL, "--depths", str(BENCH_DEPTH), "-t", "2", "-r", str(BENCH_ROUNDS), "--force",
           "--json", out_path] + [a for spec in specs for a in ("--kv", spec)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def speeds_of(path):
    """{spec: (median tok/s, median per-round ratio to f16)} from kvx bench's comparison JSON."""
    if not os.path.exists(path):
        return {}
    d = json.load(open(path))
    return {r["kv_spec"]: (r["tok_s"], r["vs_first"]) for r in d.get("decode", []) if "vs_first" in r}


def kld(m):
    return "%.4f ± %.4f" % (m["kld"], m["kld_stderr"]) if m and "error" not in m else "–"


def kld_at(m):
    """KLD with the chunks it was measured on."""
    return "%s (%d×%d)" % (kld(m), m["n_chunks"], m["chunk"]) if m and "error" not in m else "–"


def best_at_rung0(cands, pick):
    ok = [c for c in cands if pick(c) and c["search"] and "error" not in c["search"][0]]
    return min(ok, key=lambda c: (c["search"][0]["kld"], c["bytes"])) if ok else None


def retrieval(c):
    r = c.get("retrieval") if c else None
    if not r:
        return "–"
    return "%d/%d [%.2f, %.2f] %s" % (r["hits"], r["n"], r["lo95"], r["hi95"], r["verdict"])


def cpu_time(name):
    path = os.path.join(RESULTS, "recall_%s.time.json" % name)
    return " (%.0f s CPU)" % json.load(open(path))["cpu_s"] if os.path.exists(path) else ""


def speed(spec, speeds):
    if spec == "codec=f16":
        spec = "codec=f16,page=16"  # kvx bench prints specs canonical
    if spec not in speeds:
        return "–"
    return "%.1f (%.2f×)" % speeds[spec]


def paired(c):
    """The candidate's KLD minus the tuned spec's on the same positions (tune's paired t test on blocks of 32
    positions, at the deepest rung both reached), and what it says of the tuned spec."""
    v = c.get("vs_chosen") if c else None
    if not v:
        return "–"
    says = {"worse": "tuned better", "better": "tuned worse"}.get(v["verdict"], "tie")
    return "%+.5f [%+.5f, %+.5f] p = %.2g (%d×%d): **%s**" % (
        v["kld_diff"], v["lo95"], v["hi95"], v["p"], v["n_chunks"], v["chunk"], says)


def compared_rows(d, speeds):
    """The chosen spec and the best single-family specs it is compared with (tune's retrieval check)."""
    out = []
    for role, c in compared_specs(d):
        if not c:
            out.append("| | %s | none fits | | | | | | | |" % role)
            continue
        last = c["search"][-1]
        out.append("| | %s | `%s` | %d (%.2f×) | %s | %s | %s | %s | %s | %s |" % (
            role, c["spec"], c["bytes"], c["vs_f16"], kld_at(c["search"][0]), kld_at(last),
            kld(c.get("unseen")), "" if role == "tuned" else paired(c), retrieval(c), speed(c["spec"], speeds)))
    return out


def render():
    rows = ["| budget (vs f16) | fit / space | chosen `--kv` | bytes (vs f16) | KLD, search text | KLD, unseen text "
            "| best codec alone, rung 0 | best with a policy, rung 0 | chosen, rung 0 | time |",
            "|---|---:|---|---:|---|---|---|---|---|---:|"]
    notes = []
    for name, mem in BUDGETS:
        path = os.path.join(RESULTS, "recall_%s.json" % name)
        err = os.path.join(RESULTS, "recall_%s.error" % name)
        if os.path.exists(err):
            notes.append("At %s (%d bytes) nothing fits: `%s`" % (name, mem, open(err).read().strip()))
            continue
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        c = d["chosen"]
        last = c["search"][-1]
        codec = best_at_rung0(d["candidates"], lambda x: "policy=" not in x["spec"])
        policy = best_at_rung0(d["candidates"], lambda x: "policy=" in x["spec"])
        fmt = lambda x: "`%s` %s" % (x["spec"], kld(x["search"][0])) if x else "none fits"
        rows.append("| %s (%d B) | %d / %d | `%s`%s | %d (%.2f×) | %s (%d×%d) | %s | %s | %s | %s | %.0f s%s |" % (
            name, mem, d["fitting"], d["space_size"], c["spec"], " (per-layer descent)" if c["origin"] != "space" else "",
            c["bytes"], c["vs_f16"], kld(last), last["n_chunks"], last["chunk"], kld(c["unseen"]), fmt(codec),
            fmt(policy), kld(c["search"][0]), d["seconds"], cpu_time(name) + (", stopped: " + d["stop_reason"] if d["stopped"] else "")))
    text = "\n".join(rows) + "\n"
    speeds_path = os.path.join(RESULTS, "bench_8k.json")
    speeds = speeds_of(speeds_path)
    cmp = ["| budget | role | `--kv` | bytes (vs f16) | KLD, rung 0 | KLD, deepest rung reached | KLD, unseen text "
           "| KLD − tuned's, paired [95%%] | retrieval vs f16 (passkey) | decode tok/s at %d (vs f16) |" % BENCH_DEPTH,
           "|---|---|---|---:|---|---|---|---|---|---:|"]
    for name, mem in BUDGETS:
        path = os.path.join(RESULTS, "recall_%s.json" % name)
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        r = d.get("retrieval")
        if r:
            f = r["f16"]
            cmp.append("| %s | f16 | `codec=f16` (%d tokens, %s) | | | | | | %d/%d [%.2f, %.2f] | %s |" % (
                name, r["length"], ",".join(r["tasks"]), f["hits"], f["n"], f["lo95"], f["hi95"],
                speed("codec=f16", speeds)))
        else:  # the retrieval check did not finish (stopped): the compared specs by tune's rule, no retrieval
            cmp.append("| %s | f16 | `codec=f16` | | | | | | not measured%s | %s |" % (
                name, " (stopped: %s)" % d["stop_reason"] if d.get("stopped") else "", speed("codec=f16", speeds)))
        cmp += compared_rows(d, speeds)
    text += "\n" + "\n".join(cmp) + "\n"
    if notes:
        text += "\n" + "\n\n".join(notes) + "\n"
    return text


def render_headline():
    """README's summary: per budget the chosen spec, its bytes, KLD on unseen text, retrieval, and how it compares
    with the best single-family spec that fits (the paired KLD difference)."""
    rows = ["| budget | `kvx tune` chose | vs f16 | KLD, unseen text | passkey (n) | best single-family spec that fits: "
            "its KLD − tuned's, paired [95%] |", "|---|---|---:|---|---|---|"]
    for name, _ in BUDGETS:
        path = os.path.join(RESULTS, "recall_%s.json" % name)
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        c = d["chosen"]
        rival = None  # the single-family spec the tuned one beats by the least (or loses to)
        for _, x in compared_specs(d):
            v = x.get("vs_chosen") if x else None
            if v and (rival is None or v["kld_diff"] < rival[1]["kld_diff"]):
                rival = (x, v)
        vs = "none fits"
        if rival:
            x, v = rival
            vs = "`%s` (%.2f×): %+.4f [%+.4f, %+.4f], p = %.2g" % (x["spec"], x["vs_f16"], v["kld_diff"], v["lo95"],
                                                                  v["hi95"], v["p"])
        r = c.get("retrieval")
        rows.append("| %s | `%s` | %.2f× | %s | %s | %s |" % (
            name, c["spec"], c["vs_f16"], kld(c["unseen"]), "%d/%d" % (r["hits"], r["n"]) if r else "–", vs))
    return ("Measured by `scripts/tune_report.py --run` on the recall model (8 sessions × 4096 tokens, WikiText-2's "
            "test split, passkey at 4096 tokens; method, every compared spec and decode speeds: "
            "[docs/tune.md](docs/tune.md#measured-on-the-recall-model)).\n\n" + "\n".join(rows) + "\n")


def splice(doc, table, markers=(BEGIN, END)):
    a, b = doc.index(markers[0]) + len(markers[0]), doc.index(markers[1])
    return doc[:a] + "\n" + table + doc[b:]


def main():
    if "--run" in sys.argv:
        os.makedirs(RESULTS, exist_ok=True)
        only = [a for a in sys.argv[1:] if not a.startswith("--")]
        runs = [(name,) + start(name, mem) for name, mem in BUDGETS if not only or name in only]
        for name, proc, t0 in runs:
            finish(name, proc, t0)
    if "--bench" in sys.argv:
        bench()
    docs = [(DOC, lambda d: splice(d, render())), (README, lambda d: splice(d, render_headline(), HEADLINE))]
    stale = []
    for path, rendered in docs:
        doc = open(path).read()
        new = rendered(doc)
        if new != doc:
            stale.append(os.path.relpath(path, ROOT))
            if "--check" not in sys.argv:
                open(path, "w").write(new)
    if "--check" in sys.argv and stale:
        print("%s differ from scripts/tune_report.py's render of docs/results/tune/" % " and ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
