#!/usr/bin/env python3
"""Prints the results table of docs/kv-think.md from the kvx eval reports that scripts/think_eval.sh writes
(docs/results/think/think-{excluded,included}/report.json): every number comes from them."""
import json, os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
print("| question | spec | KV bytes (passkey peak) | bytes vs f16 baseline | passkey | ppl | KLD mean | top-1 |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for mode in ["excluded", "included"]:
    path = os.path.join(ROOT, "docs/results/think/think-%s/report.json" % mode)
    if not os.path.exists(path):
        continue
    rep = json.load(open(path))
    res = rep["results"]
    base = res[0].get("passkey", {}).get("kv", {}).get("peak_bytes", 0)
    for r in res:
        pk = r.get("passkey") or {}
        kv = pk.get("kv", {})
        ppl = r.get("ppl") or {}
        kld = r.get("kld") or {}
        print("| %s%s | `%s` | %.2f MiB | %.3f | %s | %s | %s | %s |" % (
            mode, "" if rep.get("complete") else " (incomplete)", r["spec"], kv.get("peak_bytes", 0) / 2**20,
            kv.get("peak_bytes", 0) / base if base else 0,
            "%d/%d" % (pk["hits"], pk["n"]) if pk.get("ok", False) else "–",
            "%.3f" % ppl["ppl"] if ppl.get("ok", False) else "–",
            "%.4f" % kld["mean"] if kld.get("ok", False) and "mean" in kld else "–",
            "%.3f" % kld["top1"] if kld.get("ok", False) and "top1" in kld else "–"))
