#!/usr/bin/env python3
"""Observed / unobserved prefill time (issue 40), alternating specs and binaries.

Runs `kvx bench --depths 0 -n 1 -p 512 -r 3 --profile --kv SPEC --json OUT` for
every (binary, spec) in turn, for --rounds rounds (the binaries alternate
inside each spec, the specs inside each round), and appends each run's JSON to
--out as it goes (a partial run is not lost). Then prints, per binary and
observed spec, the median over rounds of observed / unobserved prefill time
(the unobserved run of the same round and binary, same -c) and the profile's
attention share and observer callbacks (summed over threads) as a share of
the step.

  scripts/observed_prefill_ab.py --model m.gguf --kvx before=/tmp/kvx-old --kvx after=build/kvx \
      --rounds 3 --out docs/results/bench/observed_prefill.jsonl
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

# (label, spec, extra flags, label of the unobserved run it is divided by)
SPECS = [
    ("f16", "codec=f16", [], None),
    ("snapkv", "codec=f16;policy=snapkv,ratio=0.5", [], "f16"),
    ("h2o", "codec=f16;policy=h2o,ratio=0.5", [], "f16"),
    ("f16 -c 1024", "codec=f16", ["-c", "1024"], None),
    ("tova -c 1024", "codec=f16;policy=tova,ratio=0.5", ["-c", "1024"], "f16 -c 1024"),
]


def run(binary, model, spec, extra, threads):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = ["nice", "-n", "5", binary, "bench", "-m", model, "-t", str(threads), "--depths", "0", "-n", "1",
           "-p", "512", "-r", "3", "--profile", "--kv", spec, "--json", out] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        j = json.load(f)
    os.unlink(out)
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kvx", action="append", required=True, help="LABEL=PATH, repeatable")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="JSON lines, appended to as runs finish")
    ap.add_argument("--report-only", action="store_true", help="only summarise --out")
    args = ap.parse_args()
    binaries = [kv.split("=", 1) for kv in args.kvx]
    if not args.report_only:
        for rnd in range(args.rounds):
            for label, spec, extra, _ in SPECS:
                order = binaries if rnd % 2 == 0 else binaries[::-1]
                for name, path in order:
                    j = run(path, args.model, spec, extra, args.threads)
                    load = os.getloadavg()[0]
                    rec = {"round": rnd, "binary": name, "spec": label, "kv": spec, "load1": load,
                           "prefill_tok_s": j["prefill"]["tok_s"], "profile": j["prefill"].get("profile")}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    print(f"round {rnd} {name:8s} {label:14s} {rec['prefill_tok_s']:9.1f} tok/s  load {load:.1f}",
                          flush=True)
    recs = [json.loads(line) for line in open(args.out)]
    by = {(r["round"], r["binary"], r["spec"]): r for r in recs}
    loads = [r["load1"] for r in recs]
    print(f"\n{len(recs)} runs, 1-minute load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| binary | spec | observed / unobserved prefill time (median, min-max) | prefill tok/s (median) |"
          " attention share | observer callbacks (summed over threads) |")
    print("|---|---|---|---|---|---|")
    for name, _ in binaries:
        for label, _, _, base in SPECS:
            rows = [r for (rnd, b, s), r in sorted(by.items()) if b == name and s == label]
            if not rows:
                continue
            ratios = [by[(r["round"], name, base)]["prefill_tok_s"] / r["prefill_tok_s"]
                      for r in rows if base and (r["round"], name, base) in by]
            ratio = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
            tok = statistics.median(r["prefill_tok_s"] for r in rows)
            prof = [r["profile"] for r in rows if r["profile"]]
            att = statistics.median(p["phase_ms"]["attention"] / p["step_ms"] for p in prof) if prof else 0
            obs = statistics.median(p["observer_thread_ms"] / p["step_ms"] for p in prof) if prof else 0
            print(f"| {name} | {label} | {ratio} | {tok:.1f} | {100 * att:.1f}% | {100 * obs:.1f}% |")


if __name__ == "__main__":
    main()
