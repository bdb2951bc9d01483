#!/usr/bin/env python3
"""Retrieval after a restore (docs/tiers.md): passkey prompts (llama.cpp's format, ../shared/data/passkey/FORMAT.md)
on the recall model, answered by a fresh prefill (`"cache": "none"`), then written to a disk tier (lossless) and a
Redis tier (a lossy level) by one `kvx batch` process, then answered by new processes — a restart — that admit
each prompt's full blocks from the disk tier or from Redis. The needle sits at depths 0.1-0.7, inside the blocks
restored from the tier. Prints a Markdown table: hits, the Wilson 95% interval, tokens from the tier, and an exact
McNemar test against the fresh prefill on the same prompts; with --write, splices it into docs/tiers.md between
<!-- tier-passkey:begin --> and <!-- tier-passkey:end -->.

  scripts/tier_passkey.py --n 24 --lossy medium --write     # needs build/kvx, redis-server, ../shared
"""
import argparse, json, os, random, re, subprocess, sys, tempfile, time

from reportlib import ROOT, free_port, mcnemar_p, paired, splice_doc, wilson

PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
          "I will quiz you about the important information there.")
JUNK = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
SUFFIX = " What is the pass key? The pass key is"


def prompts(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        n_junk = rng.randint(50, 80)  # about 1300-2100 tokens
        at = round(rng.uniform(0.1, 0.7) * n_junk)
        key = rng.randint(1, 50000)
        junk = [JUNK] * n_junk
        junk.insert(at, " The pass key is %d. Remember it. %d is the pass key." % (key, key))
        out.append((key, PREFIX + "".join(junk) + SUFFIX))
    return out


def batch(kvx, model, path, flags):
    out = path + ".out"
    subprocess.run([kvx, "batch", path, "-m", model, "-c", "4096", "--no-grouping", "--temp", "0", "-n", "16", "-o",
                    out] + flags, check=True, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return [json.loads(line) for line in f]


def hit(key, text):
    m = re.search(r"\d+", text or "")
    return m is not None and int(m.group(0)) == key


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "recall", "recall-llama-8L-d512-f16.gguf"))
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--lossy", default="medium", choices=["high", "medium", "low"])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit("kvx: error: the recall model is not at %s (../shared absent?): pass --model" % args.model)
    tmp = tempfile.mkdtemp(prefix="kvx-tier-passkey-")
    cases = prompts(args.n, args.seed)
    path = os.path.join(tmp, "passkey.jsonl")
    with open(path, "w") as f:
        for i, (key, text) in enumerate(cases):
            f.write(json.dumps({"prompt": text, "id": i}) + "\n")
    fresh_path = os.path.join(tmp, "fresh.jsonl")
    with open(fresh_path, "w") as f:
        for i, (key, text) in enumerate(cases):
            f.write(json.dumps({"prompt": text, "id": i, "cache": "none"}) + "\n")
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                              "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    url = "redis://127.0.0.1:%d" % port
    disk = os.path.join(tmp, "disk")
    runs = {}
    try:
        runs["fresh"] = batch(args.kvx, args.model, fresh_path, [])
        print("fresh done", file=sys.stderr, flush=True)
        runs["write"] = batch(args.kvx, args.model, path, ["--cache-dir", disk, "--cache-redis", url, "--cache-codec",
                                                          "disk=lossless,redis=%s" % args.lossy])
        print("write done", file=sys.stderr, flush=True)
        runs["disk"] = batch(args.kvx, args.model, path, ["--cache-dir", disk, "--cache-codec", "lossless"])
        runs["redis"] = batch(args.kvx, args.model, path, ["--cache-redis", url, "--cache-codec", args.lossy])
    finally:
        redis.kill()
    hits = {name: {r["id"]: hit(cases[r["id"]][0], r.get("text")) for r in rs} for name, rs in runs.items()}
    rows = ["| run | hits | rate [Wilson 95%] | prompt tokens from the tier (of) | vs fresh: only fresh / only this | "
            "McNemar p |", "|---|---|---|---|---|---|"]
    names = {"fresh": "fresh prefill (`\"cache\": \"none\"`)",
             "write": "prefill writing the tiers (same process, prefix cache on)",
             "disk": "new process, disk tier, lossless",
             "redis": "new process, Redis tier, `%s`" % args.lossy}
    for name, rs in runs.items():
        h = sum(hits[name].values())
        lo, hi = wilson(h, len(rs))
        tier = sum(sum(r.get("cached_by_tier", {}).values()) for r in rs)
        total = sum(r["prompt_tokens"] for r in rs)
        if name == "fresh":
            rows.append("| %s | %d/%d | %.0f%% [%.0f, %.0f] | %d (%d) | | |" % (names[name], h, len(rs), 100 * h / len(rs),
                                                                           100 * lo, 100 * hi, tier, total))
            continue
        only_fresh, only_this, _ = paired(hits["fresh"], hits[name])
        rows.append("| %s | %d/%d | %.0f%% [%.0f, %.0f] | %d (%d) | %d / %d | %.3g |" %
                    (names[name], h, len(rs), 100 * h / len(rs), 100 * lo, 100 * hi, tier, total, only_fresh,
                     only_this, mcnemar_p(only_fresh, only_this)))
    table = "\n".join(rows)
    print(table)
    if args.write:
        splice_doc(os.path.join("docs", "tiers.md"), "tier-passkey", table)


if __name__ == "__main__":
    sys.exit(main())
