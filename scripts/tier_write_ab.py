#!/usr/bin/env python3
"""Decode speed with KV tier writes on and off (docs/tiers.md): one `kvx batch` of requests that
finish at different times (so blocks are written while others decode), run in rounds without cache
flags, with --cache-dir (write-through; a fresh directory each run, so every block is written) and with
--cache-dir --cache-write back, on a synthetic smollm2-135m. Prints the median generated tokens per
second of each, the on/off ratio of each round (runs of one round follow each other: on a machine shared
with other work, a ratio within a round is steadier than a ratio of medians), and the CPU seconds of the
tiers' I/O thread against the rest of the process (kvx batch's "tiers:" line), which other work on the
machine does not inflate as it does wall time. With --write the table goes into docs/tiers.md between
<!-- tier-write-ab:begin --> and <!-- tier-write-ab:end -->.

  scripts/tier_write_ab.py --reps 5 --write
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reportlib import ROOT, splice_doc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--write", action="store_true", help="splice the table into docs/tiers.md")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvx-tier-ab-")
    model = os.path.join(tmp, "smollm2-135m.gguf")
    subprocess.run([args.kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", model], check=True,
                   stderr=subprocess.DEVNULL)
    batch = os.path.join(tmp, "in.jsonl")
    with open(batch, "w") as f:
        for i in range(args.requests):  # 600-token prompts (2 blocks each), 24..80 generated tokens
            words = " ".join("r%d-w%d" % (i, j) for j in range(150))
            f.write(json.dumps({"prompt": words, "max_tokens": 24 + 8 * i, "seed": i}) + "\n")
    modes = {"off": [], "through": ["--cache-write", "through"], "back": ["--cache-write", "back"]}
    speed = {m: [] for m in modes}
    cpu = {m: [] for m in modes if m != "off"}  # (I/O thread CPU s, the rest of the process CPU s)
    for rep in range(args.reps):
        for mode, extra in modes.items():
            flags = ["--cache-dir", os.path.join(tmp, "%s%d" % (mode, rep))] + extra if mode != "off" else []
            r = subprocess.run([args.kvx, "batch", batch, "-m", model, "-c", "1024", "--parallel", str(args.requests),
                                "--ignore-eos", "--no-grouping", "-o", os.path.join(tmp, "out.jsonl")] + flags,
                               check=True, stderr=subprocess.PIPE, text=True)
            speed[mode].append(float(re.search(r"generated \d+ tokens, ([\d.]+) tok/s", r.stderr).group(1)))
            if mode != "off":
                m = re.search(r"tier I/O thread ([\d.]+) s, the rest of the process ([\d.]+) s", r.stderr)
                cpu[mode].append((float(m.group(1)), float(m.group(2))))
            print("round %d %s: %.1f tok/s%s" % (rep, mode, speed[mode][-1],
                  " | I/O CPU %.3f s of %.3f s" % cpu[mode][-1] if mode != "off" else ""), file=sys.stderr, flush=True)
    rows = ["| tier writes | tok/s (median of %d) | on/off per round (median, spread) | I/O thread CPU / rest of the "
            "process CPU (median, spread) | runs (tok/s) |" % args.reps, "|---|---|---|---|---|",
            "| off | %.1f | | | %s |" % (statistics.median(speed["off"]), ", ".join("%.1f" % x for x in speed["off"]))]
    for mode, name in (("through", "write-through (`--cache-dir`)"), ("back", "write-back (`--cache-write back`)")):
        ratios = sorted(b / a for a, b in zip(speed["off"], speed[mode]))
        shares = sorted(io / rest for io, rest in cpu[mode])
        rows.append("| %s | %.1f | %.3f (%.3f..%.3f) | %.2f%% (%.2f..%.2f%%) | %s |" %
                    (name, statistics.median(speed[mode]), statistics.median(ratios), ratios[0], ratios[-1],
                     100 * statistics.median(shares), 100 * shares[0], 100 * shares[-1],
                     ", ".join("%.1f" % x for x in speed[mode])))
    table = "\n".join(rows)
    print(table)
    if args.write:
        splice_doc(os.path.join("docs", "tiers.md"), "tier-write-ab", table)


if __name__ == "__main__":
    sys.exit(main())
