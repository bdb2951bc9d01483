#!/usr/bin/env python3
"""Runs kvx tune on the recall model at three KV budgets (4x, 6x and 10x smaller than f16 for 8 sessions of
4096 tokens) and renders the comparison table of docs/tune.md from the results it keeps in docs/results/tune/.

  scripts/tune_report.py --run [4x ...]  # run kvx tune (build/kvx) at every budget (or those named), then render
  scripts/tune_report.py           # render docs/tune.md from docs/results/tune/*.json
  scripts/tune_report.py --check   # fail if docs/tune.md differs from a fresh render
"""
import json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs/tune.md")
RESULTS = os.path.join(ROOT, "docs/results/tune")
SHARED = os.environ.get("KVX_SHARED", os.path.join(ROOT, "..", "shared"))
MODEL = os.path.join(SHARED, "models/recall/recall-llama-8L-d512-f16.gguf")
TEXT = os.path.join(SHARED, "data/wikitext-2-raw/wiki.test.raw")  # held out of the recall model's training
CTX = 4096
SESSIONS = 8  # a server's case: one session prefills at its peak beside the others' steady state
F16_BYTES = 4096 * CTX * SESSIONS  # recall: 4 KiB of f16 K+V per token
RETRIEVAL = ["--tasks", "passkey", "--retrieval-length", "2048", "--retrieval-trials", "4"]  # n = 5 depths x 4 (cost: docs/tune.md)
BUDGETS = [("4x", F16_BYTES // 4), ("6x", F16_BYTES // 6), ("10x", F16_BYTES // 10)]
BEGIN, END = "<!-- tune:begin -->", "<!-- tune:end -->"


def run(name, mem):
    out = os.path.join(RESULTS, "recall_%s.json" % name)
    cmd = [os.path.join(ROOT, "build/kvx"), "tune", "-m", MODEL, "--mem", str(mem), "--ctx", str(CTX), "--sessions", str(SESSIONS), "-f", TEXT,
           "-o", out, "--svg", os.path.join(RESULTS, "recall_%s.svg" % name), "-t", "2", "-q", "--time-budget", "1800"] + RETRIEVAL
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    stale = os.path.join(RESULTS, "recall_%s.error" % name)
    if os.path.exists(stale):  # a previous run's error must not outlive this run's result
        os.remove(stale)
    if p.returncode != 0:  # an impossible budget: keep its error, which names the smallest spec
        with open(os.path.join(RESULTS, "recall_%s.error" % name), "w") as f:
            f.write(p.stderr.strip().splitlines()[-1] + "\n")
    sys.stdout.write(p.stdout)


def kld(m):
    return "%.4f ± %.4f" % (m["kld"], m["kld_stderr"]) if m and "error" not in m else "–"


def best_at_rung0(cands, pick):
    ok = [c for c in cands if pick(c) and c["search"] and "error" not in c["search"][0]]
    return min(ok, key=lambda c: (c["search"][0]["kld"], c["bytes"])) if ok else None


def retrieval(c):
    r = c.get("retrieval") if c else None
    if not r:
        return "–"
    return "%d/%d [%.2f, %.2f] %s" % (r["hits"], r["n"], r["lo95"], r["hi95"], r["verdict"])


def compared_rows(d):
    """The chosen spec and the best single-family specs it is compared with (tune's retrieval check)."""
    rows = [("tuned", d["chosen"])]
    for role, c in (d.get("retrieval") or {}).get("compared", {}).items():
        rows.append((role, c))
    out = []
    for role, c in rows:
        if not c:
            out.append("| | %s | none fits | | | | |" % role)
            continue
        out.append("| | %s | `%s` | %d (%.2f×) | %s | %s | %s |" % (
            role, c["spec"], c["bytes"], c["vs_f16"], kld(c["search"][0]), kld(c.get("unseen")), retrieval(c)))
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
            fmt(policy), kld(c["search"][0]), d["seconds"], ", stopped: " + d["stop_reason"] if d["stopped"] else ""))
    text = "\n".join(rows) + "\n"
    cmp = ["| budget | role | `--kv` | bytes (vs f16) | KLD, rung 0 (1×512) | KLD, unseen text | retrieval vs f16 (passkey) |",
           "|---|---|---|---:|---|---|---|"]
    for name, mem in BUDGETS:
        path = os.path.join(RESULTS, "recall_%s.json" % name)
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        if not d.get("retrieval"):
            cmp.append("| %s | | not measured with retrieval | | | | |" % name)
            continue
        r = d["retrieval"]
        f = r["f16"]
        cmp.append("| %s | f16 | `codec=f16` (%d tokens, %s) | | | | %d/%d [%.2f, %.2f] |" % (
            name, r["length"], ",".join(r["tasks"]), f["hits"], f["n"], f["lo95"], f["hi95"]))
        cmp += compared_rows(d)
    text += "\n" + "\n".join(cmp) + "\n"
    if notes:
        text += "\n" + "\n\n".join(notes) + "\n"
    return text


def splice(doc, table):
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:a] + "\n" + table + doc[b:]


def main():
    if "--run" in sys.argv:
        os.makedirs(RESULTS, exist_ok=True)
        only = [a for a in sys.argv[1:] if not a.startswith("--")]
        for name, mem in BUDGETS:
            if not only or name in only:
                run(name, mem)
    doc = open(DOC).read()
    new = splice(doc, render())
    if "--check" in sys.argv:
        if new != doc:
            print("docs/tune.md differs from scripts/tune_report.py's render of docs/results/tune/", file=sys.stderr)
            return 1
        return 0
    open(DOC, "w").write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
