#!/usr/bin/env python3
"""Renders the results table of a KV method's doc page from the kvx eval reports its eval script writes
(every number comes from them) and splices it into the page between <!-- METHOD-table:begin --> and
<!-- METHOD-table:end -->.

  scripts/splice_table.py think              # docs/kv-think.md, from scripts/think_eval.sh's reports
  scripts/splice_table.py thinkq             # docs/kv-think.md, from scripts/thinkq_eval.sh's report
  scripts/splice_table.py minicache          # docs/kv-merging.md, from scripts/minicache_eval.sh's reports
  scripts/splice_table.py think --check      # fail if the page differs from a fresh render (a ctest)
  scripts/splice_table.py think --print      # print the table only
"""
import argparse, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reportlib import ROOT, Output  # noqa: E402


def task(name, cell):
    """A column of one task's result: `cell(result)` when the spec ran it without error, else a dash."""
    def render(r, base):
        x = r.get(name) or {}
        return cell(x) if x.get("ok", False) else "–"
    return render


def hits(name):
    return task(name, lambda x: "%d/%d" % (x["hits"], x["n"]))


def kld(field, fmt):
    return task("kld", lambda x: fmt % x[field] if field in x else "–")


def peak_bytes(kv_of):
    return lambda r, base: "%.2f MiB" % (kv_of(r).get("peak_bytes", 0) / 2**20)


def vs_baseline(kv_of, fmt):
    """The spec's peak bytes over the baseline's (the first result's)."""
    return lambda r, base: fmt % (kv_of(r).get("peak_bytes", 0) / base if base else 0)


def passkey_kv(r):
    return (r.get("passkey") or {}).get("kv", {})


def ppl_kv(r):
    return (r.get("ppl") or {}).get("kv", {})


def spec_kv(r):
    return r.get("kv", {})


# Per method: its page, its reports (one per question mode, in table order) and its columns
# (header, alignment, cell of a result given the baseline's peak bytes).
METHODS = {
    "think": {
        "doc": "docs/kv-think.md",
        "report": "docs/results/think/think-%s/report.json",
        "modes": ["excluded", "included"],
        "base_kv": passkey_kv,
        "columns": [
            ("KV bytes (passkey peak)", "---:", peak_bytes(passkey_kv)),
            ("bytes vs f16 baseline", "---:", vs_baseline(passkey_kv, "%.3f")),
            ("passkey", "---:", hits("passkey")),
            ("ppl", "---:", task("ppl", lambda x: "%.3f" % x["ppl"])),
            ("KLD mean", "---:", kld("mean", "%.4f")),
            ("top-1", "---:", kld("top1", "%.3f")),
        ],
    },
    "thinkq": {  # ThinK over quantized codecs: ppl/kld only, bytes at the end of each ppl chunk
        "doc": "docs/kv-think.md",
        "report": "docs/results/think/thinkq-%s/report.json",
        "modes": ["excluded"],
        "base_kv": ppl_kv,
        "columns": [
            ("KV bytes (end of chunk)", "---:", peak_bytes(ppl_kv)),
            ("bytes vs f16 baseline", "---:", vs_baseline(ppl_kv, "%.3f")),
            ("ppl", "---:", task("ppl", lambda x: "%.3f" % x["ppl"])),
            ("KLD mean", "---:", kld("mean", "%.4f")),
            ("top-1", "---:", kld("top1", "%.3f")),
        ],
    },
    "minicache": {
        "doc": "docs/kv-merging.md",
        "report": "docs/results/merging/minicache-%s/report.json",
        "modes": ["included", "excluded"],
        "base_kv": spec_kv,
        "columns": [
            ("KV bytes (peak)", "---:", peak_bytes(spec_kv)),
            ("vs f16", "---:", lambda r, base: "%.2f×" % spec_kv(r).get("compression_vs_f16", 0)),
            ("bytes vs baseline", "---:", vs_baseline(spec_kv, "%.2f")),
            ("passkey", "---:", hits("passkey")),
            ("niah_multikey", "---:", hits("niah_multikey")),
        ],
    },
}


def render(m):
    cols = m["columns"]
    out = ["| question | spec | %s |" % " | ".join(c[0] for c in cols),
           "|---|---|%s|" % "|".join(c[1] for c in cols)]
    for mode in m["modes"]:
        path = os.path.join(ROOT, m["report"] % mode)
        if not os.path.exists(path):
            continue
        rep = json.load(open(path))
        res = rep["results"]
        base = m["base_kv"](res[0]).get("peak_bytes", 0)
        for r in res:
            out.append("| %s%s | `%s` | %s |" % (mode, "" if rep.get("complete") else " (incomplete)", r["spec"],
                                                 " | ".join(c[2](r, base) for c in cols)))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("method", choices=sorted(METHODS))
    ap.add_argument("--check", action="store_true", help="fail if the page differs from a fresh render")
    ap.add_argument("--print", action="store_true", help="print the table, write nothing")
    args = ap.parse_args()
    m = METHODS[args.method]
    table = render(m)
    if args.print:
        sys.stdout.write(table)
        return
    doc = open(os.path.join(ROOT, m["doc"])).read()
    begin, end = "<!-- %s-table:begin -->" % args.method, "<!-- %s-table:end -->" % args.method
    if begin not in doc or end not in doc:
        sys.exit("%s has no %s ... %s markers" % (m["doc"], begin, end))
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    out = Output(args.check)
    out.write(m["doc"], head + begin + "\n" + table + end + tail)
    out.finish("splice_table.py " + args.method)


if __name__ == "__main__":
    main()
