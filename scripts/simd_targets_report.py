#!/usr/bin/env python3
"""The int8 kernels of each SIMD target this CPU runs, side by side (docs/simd-dispatch.md).

Measure (runs build/ops_bench once per target per round, targets interleaved so that the
machine's drift hits each alike; writes docs/results/bench/simd-targets.json):
    scripts/simd_targets_report.py --measure [--rounds 3]
Render the page's table from the committed JSON (what ctest's --check compares):
    scripts/simd_targets_report.py [--check]
"""
import argparse, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reportlib import ROOT, Output  # noqa: E402

RAW = "docs/results/bench/simd-targets.json"
DOC = "docs/simd-dispatch.md"
FILTER = r"^(DecodeSweep|PrefillGemm)/(q4_0|q8_0|q8_0_repacked)/thr1/real_time$|^BM_QuantizeActs/(1|64)$"
BEGIN, END = "<!-- simd-targets:begin -->", "<!-- simd-targets:end -->"


def run(exe, target, flt):
    env = dict(os.environ, KVX_BENCH_TARGET=target)
    return subprocess.run([exe, "--benchmark_filter=" + flt, "--benchmark_format=json"], env=env,
                          capture_output=True, text=True)


def measure(rounds):
    exe = os.path.join(ROOT, "build", "ops_bench")
    # The targets this CPU runs (ops_bench refuses one it cannot); SCALAR is left out: minutes per
    # round, and never what dispatch picks on a CPU with AVX2.
    targets = [t for t in ["AVX3_DL", "AVX2_VNNI", "AVX2"] if run(exe, t, "^BM_QuantizeActs/1$").returncode == 0]
    if not targets:
        sys.exit("ops_bench runs none of the SIMD targets on this CPU")
    runs = []
    for r in range(rounds):
        for t in targets[r % len(targets):] + targets[:r % len(targets)]:  # rotate: drift hits each alike
            out = run(exe, t, FILTER)
            if out.returncode != 0:
                sys.exit("ops_bench failed on %s:\n%s" % (t, out.stderr))
            for b in json.loads(out.stdout)["benchmarks"]:
                runs.append({"round": r, "target": t, "name": b["name"], "real_time": b["real_time"],
                             "time_unit": b["time_unit"]})
        print("round %d of %d done" % (r + 1, rounds), file=sys.stderr)
    return {"targets": targets, "rounds": rounds, "runs": runs}


def render(data):
    names = []
    for r in data["runs"]:
        if r["name"] not in names:
            names.append(r["name"])
    targets = data["targets"]
    head = "| benchmark | " + " | ".join(targets) + " |\n|---|" + "---:|" * len(targets) + "\n"
    rows = []
    for n in names:
        cells = []
        base = None
        for t in targets:
            v = [r["real_time"] for r in data["runs"] if r["name"] == n and r["target"] == t]
            unit = next(r["time_unit"] for r in data["runs"] if r["name"] == n)
            if not v:
                cells.append("–")
                continue
            m = statistics.median(v)
            base = base or m
            cells.append("%.3g %s (%.3g–%.3g), %.2f×" % (m, unit, min(v), max(v), base / m))
        rows.append("| `%s` | %s |" % (n, " | ".join(cells)))
    note = ("Medians of %d interleaved rounds (min–max), one thread; × = speed relative to the first column "
            "(above 1 = faster). CPU: %s.\n" % (data["rounds"], data.get("cpu") or "not recorded"))
    return note + "\n" + head + "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", default="", help="the CPU, as `kvx inspect` prints it (stored with --measure)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    raw = os.path.join(ROOT, RAW)
    if a.measure:
        data = measure(a.rounds)
        data["cpu"] = a.cpu
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        with open(raw, "w") as f:
            json.dump(data, f, indent=1)
    if not os.path.exists(raw):
        sys.exit("%s is missing: run with --measure" % RAW)
    data = json.load(open(raw))
    doc = open(os.path.join(ROOT, DOC)).read()
    if BEGIN not in doc or END not in doc:
        sys.exit("%s has no %s ... %s markers" % (DOC, BEGIN, END))
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    out = Output(a.check)
    out.write(DOC, head + BEGIN + "\n" + render(data) + END + tail)
    out.finish("simd_targets_report")


if __name__ == "__main__":
    main()
