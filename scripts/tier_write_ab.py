#!/usr/bin/env python3
"""Decode speed with KV tier write-through on and off (docs/tiers.md): one `kvx batch` of requests that
finish at different times (so blocks are written while others decode), run alternately without cache
flags and with --cache-dir (a fresh directory each run, so every block is written), on a synthetic
smollm2-135m. Prints the median generated tokens per second of each, and the on/off ratio of each round (an
"off" run and the "on" run right after it: on a machine shared with other work, a ratio within a round is
steadier than a ratio of medians) with its median and spread.

  scripts/tier_write_ab.py --reps 7
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
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
    speed = {"off": [], "on": []}
    for rep in range(args.reps):
        for mode in ("off", "on"):
            flags = ["--cache-dir", os.path.join(tmp, "dir%d" % rep)] if mode == "on" else []
            r = subprocess.run([args.kvx, "batch", batch, "-m", model, "-c", "1024", "--parallel", str(args.requests),
                                "--ignore-eos", "--no-grouping", "-o", os.path.join(tmp, "out.jsonl")] + flags,
                               check=True, stderr=subprocess.PIPE, text=True)
            speed[mode].append(float(re.search(r"generated \d+ tokens, ([\d.]+) tok/s", r.stderr).group(1)))
    off, on = statistics.median(speed["off"]), statistics.median(speed["on"])
    print("| write-through | tok/s (median of %d) | runs |" % args.reps)
    print("|---|---|---|")
    print("| off | %.1f | %s |" % (off, ", ".join("%.1f" % x for x in speed["off"])))
    print("| on (--cache-dir) | %.1f | %s |" % (on, ", ".join("%.1f" % x for x in speed["on"])))
    ratios = sorted(b / a for a, b in zip(speed["off"], speed["on"]))
    print("\non/off per round: %s" % ", ".join("%.3f" % x for x in ratios))
    print("on/off: median %.3f, spread %.3f..%.3f over %d rounds (ratio of the medians %.3f)" %
          (statistics.median(ratios), ratios[0], ratios[-1], len(ratios), on / off))


if __name__ == "__main__":
    sys.exit(main())
