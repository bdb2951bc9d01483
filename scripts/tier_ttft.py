#!/usr/bin/env python3
"""Time to first token with the KV tiers (docs/tiers.md): a miss (the prompt computed, its blocks written
through to a disk directory and a Redis), then new `kvx batch` processes — a restart — that admit the same
prompt from the disk tier and from the Redis tier. Prints a Markdown table (medians over --reps hit runs;
the miss runs once per size unless --miss-reps says more) and, with --write, splices it into docs/tiers.md
between <!-- tier-ttft:begin --> and <!-- tier-ttft:end -->.

  scripts/tier_ttft.py --sizes 2048 8192 --write     # needs build/kvx and redis-server
"""
import argparse, json, os, re, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def batch(kvx, model, prompt_file, ctx, cache_flags):
    out = prompt_file + ".out"
    cmd = [kvx, "batch", prompt_file, "-m", model, "-c", str(ctx), "--no-grouping", "-o", out] + cache_flags
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.loads(f.readline())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--model", help="GGUF model (default: a synthetic smollm2-135m, q8_0)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192], help="prompt lengths in tokens (about)")
    ap.add_argument("--reps", type=int, default=3, help="hit runs per tier and size")
    ap.add_argument("--miss-reps", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="splice the table into docs/tiers.md")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvx-tier-ttft-")
    model = args.model or os.path.join(tmp, "smollm2-135m.gguf")
    if not args.model:
        subprocess.run([args.kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", model], check=True,
                       stderr=subprocess.DEVNULL)
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                              "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    url = "redis://127.0.0.1:%d" % port
    rows = []
    try:
        for size in args.sizes:
            prompt = os.path.join(tmp, "p%d.jsonl" % size)
            with open(prompt, "w") as f:  # ~3.85 tokens per word with this tokenizer
                f.write(json.dumps({"prompt": " ".join("w%d" % (i % 1000) for i in range(int(size / 3.85))), "max_tokens": 1}))
            ctx = size + 512
            miss = []
            for rep in range(args.miss_reps):
                d = os.path.join(tmp, "disk%d-%d" % (size, rep))
                subprocess.run(["redis-cli", "-p", str(port), "flushall"], stdout=subprocess.DEVNULL)
                r = batch(args.kvx, model, prompt, ctx, ["--cache-dir", d, "--cache-redis", url])
                miss.append(r["ttft_ms"])
                tokens = r["prompt_tokens"]
            disk = [batch(args.kvx, model, prompt, ctx, ["--cache-dir", d]) for _ in range(args.reps)]
            redis_hits = [batch(args.kvx, model, prompt, ctx, ["--cache-redis", url]) for _ in range(args.reps)]
            m = statistics.median(miss)
            for name, runs in (("disk hit (new process, page cache warm)", disk), ("Redis hit (new process)", redis_hits)):
                t = statistics.median(r["ttft_ms"] for r in runs)
                cached = runs[0].get("cached_tokens", 0)
                rows.append("| %d | %s | %d | %.0f | %.3f× |" % (tokens, name, cached, t, t / m))
            rows.insert(len(rows) - 2, "| %d | miss (computed; written through) | 0 | %.0f | 1× |" % (tokens, m))
    finally:
        redis.kill()
    table = "\n".join(["| prompt tokens | run | tokens from the tier | TTFT ms (median) | vs miss |",
                       "|---|---|---|---|---|"] + rows)
    print(table)
    if args.write:
        path = os.path.join(ROOT, "docs", "tiers.md")
        text = open(path).read()
        new = re.sub(r"(<!-- tier-ttft:begin -->\n).*?(<!-- tier-ttft:end -->)", lambda mo: mo.group(1) + table + "\n" + mo.group(2),
                     text, flags=re.S)
        open(path, "w").write(new)


if __name__ == "__main__":
    sys.exit(main())
