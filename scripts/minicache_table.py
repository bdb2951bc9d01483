#!/usr/bin/env python3
"""Prints the MiniCache table of docs/kv-merging.md from the kvx eval reports that scripts/minicache_eval.sh
writes (docs/results/merging/minicache-{included,excluded}/report.json): every number comes from them."""
import json, os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
print("| question | spec | KV bytes (peak) | vs f16 | bytes vs baseline | passkey | niah_multikey |")
print("|---|---|---:|---:|---:|---:|---:|")
for mode in ["included", "excluded"]:
    path = os.path.join(ROOT, "docs/results/merging/minicache-%s/report.json" % mode)
    if not os.path.exists(path):
        continue
    rep = json.load(open(path))
    res = rep["results"]
    base = res[0]["kv"]["peak_bytes"]
    for r in res:
        kv = r.get("kv", {})
        cells = []
        for t in ["passkey", "niah_multikey"]:
            x = r.get(t)
            cells.append("%d/%d" % (x["hits"], x["n"]) if x and x.get("ok", True) else "–")
        print("| %s%s | `%s` | %.2f MiB | %.2f× | %.2f | %s |" % (
            mode, "" if rep.get("complete") else " (incomplete)", r["spec"], kv.get("peak_bytes", 0) / 2**20,
            kv.get("compression_vs_f16", 0), kv.get("peak_bytes", 0) / base if base else 0, " | ".join(cells)))
