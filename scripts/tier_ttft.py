#!/usr/bin/env python3
"""Time to first token with the KV tiers (docs/tiers.md): a miss (the prompt computed, its blocks written
through to a disk directory and a Redis), then new `kvx batch` processes — a restart — that admit the same
prompt from the disk tier and from the Redis tier. Prints a Markdown table (medians over --reps hit runs;
the miss runs once per size unless --miss-reps says more) and, with --write, splices it into docs/tiers.md
between <!-- tier-ttft:begin --> and <!-- tier-ttft:end -->.

  scripts/tier_ttft.py --sizes 2048 8192 --write     # needs build/kvx and redis-server

With --ram, the host-RAM tier instead, which lives in one process: one `kvx serve` with a pool that holds
about one prompt's KV and a host-RAM tier; per size a prompt P is computed (a miss, written through to the
RAM tier), asked again (a pool hit), then --reps times a filler prompt of the same size (a miss that evicts
P's blocks from the pool) and P again (a RAM-tier hit: its blocks loaded back from host RAM). TTFT is the
client's time for a one-token completion; the miss row is the median of P's first run and the fillers.
Splices into the <!-- tier-ttft-ram:begin --> section.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time, urllib.request

from reportlib import ROOT, free_port, splice_doc


def batch(kvx, model, prompt_file, ctx, cache_flags):
    out = prompt_file + ".out"
    cmd = [kvx, "batch", prompt_file, "-m", model, "-c", str(ctx), "--no-grouping", "-o", out] + cache_flags
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.loads(f.readline())


def words(size, tag):
    return " ".join("%s%d" % (tag, i % 1000) for i in range(int(size / 3.85)))  # ~3.85 tokens per word


def complete(port, prompt):
    """(seconds, usage) of a one-token completion."""
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, body, {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        usage = json.loads(r.read())["usage"]
    return time.monotonic() - t0, usage


def ram_rows(args, model, tmp):
    """The host-RAM tier's rows (one kvx serve process per size)."""
    rows = []
    for size in args.sizes:
        port = free_port()
        kv_bytes = int(size * 1.15) * 23040  # smollm2-135m f16: 23040 KV bytes a token; the pool holds ~1.15 prompts
        server = subprocess.Popen([args.kvx, "serve", "-m", model, "-c", str(size + 512), "--max-seqs", "1", "--port",
                                   str(port), "--kv", "codec=f16,page=16;budget=%d" % kv_bytes, "--cache-ram-bytes",
                                   "1G"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5)
                    break
                except OSError:
                    time.sleep(0.5)
            prompt = words(size, "w")
            miss, usage = complete(port, prompt)
            misses, pool, ram, tokens = [miss], [], [], usage["prompt_tokens"]
            pool.append(complete(port, prompt))
            for rep in range(args.reps):
                misses.append(complete(port, words(size, "abcdefghij"[rep % 10]))[0])  # same shape, other words
                ram.append(complete(port, prompt))
                print("size %d rep %d: miss %.2f s, RAM hit %.2f s" % (size, rep, misses[-1], ram[-1][0]), file=sys.stderr,
                      flush=True)
        finally:
            server.terminate()
            server.wait()
        m = statistics.median(misses)
        def by_tier(u, tier):
            return u.get("prompt_tokens_details", {}).get("cached_tokens_by_tier", {}).get(tier, 0)
        rows.append("| %d | miss (computed; written through to the RAM tier) | 0 | %.0f | 1× |" % (tokens, 1e3 * m))
        t = statistics.median(x[0] for x in pool)
        rows.append("| %d | pool hit (prefix cache, same process) | %d | %.0f | %.3f× |" %
                    (tokens, pool[0][1].get("prompt_tokens_details", {}).get("cached_tokens", 0), 1e3 * t, t / m))
        t = statistics.median(x[0] for x in ram)
        u = sorted(ram)[len(ram) // 2][1]  # the median run's usage
        rows.append("| %d | RAM-tier hit (same process, evicted from the pool) | %d (+ %d still in the pool) | %.0f | %.3f× |" %
                    (tokens, by_tier(u, "ram"), by_tier(u, "pool"), 1e3 * t, t / m))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--model", help="GGUF model (default: a synthetic smollm2-135m, q8_0)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192], help="prompt lengths in tokens (about)")
    ap.add_argument("--reps", type=int, default=3, help="hit runs per tier and size")
    ap.add_argument("--miss-reps", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="splice the table into docs/tiers.md")
    ap.add_argument("--ram", action="store_true", help="the host-RAM tier's rows (one kvx serve process)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvx-tier-ttft-")
    model = args.model or os.path.join(tmp, "smollm2-135m.gguf")
    if not args.model:
        subprocess.run([args.kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", model], check=True,
                       stderr=subprocess.DEVNULL)
    if args.ram:
        table = "\n".join(["| prompt tokens | run | tokens from the tier (or pool) | TTFT ms (median) | vs miss |",
                           "|---|---|---|---|---|"] + ram_rows(args, model, tmp))
        print(table)
        if args.write:
            splice_doc(os.path.join("docs", "tiers.md"), "tier-ttft-ram", table)
        return
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
                f.write(json.dumps({"prompt": words(size, "w"), "max_tokens": 1}))
            ctx = size + 512
            miss = []
            for rep in range(args.miss_reps):
                d = os.path.join(tmp, "disk%d-%d" % (size, rep))
                subprocess.run(["redis-cli", "-p", str(port), "flushall"], stdout=subprocess.DEVNULL)
                r = batch(args.kvx, model, prompt, ctx, ["--cache-dir", d, "--cache-redis", url])
                miss.append(r["ttft_ms"])
                tokens = r["prompt_tokens"]
            # The disk tier writes its blocks with O_DIRECT, so they are not in the page cache: the first
            # hit reads them from the device (cold); its reads are buffered, so the later hits find them
            # in the page cache (warm).
            cold = [batch(args.kvx, model, prompt, ctx, ["--cache-dir", d])]
            warm = [batch(args.kvx, model, prompt, ctx, ["--cache-dir", d]) for _ in range(args.reps)]
            redis_hits = [batch(args.kvx, model, prompt, ctx, ["--cache-redis", url]) for _ in range(args.reps)]
            m = statistics.median(miss)
            runs_by_name = (("disk hit (new process, page cache cold: the first read)", cold),
                            ("disk hit (new process, page cache warm)", warm), ("Redis hit (new process)", redis_hits))
            rows.append("| %d | miss (computed; written through) | 0 | %.0f | 1× |" % (tokens, m))
            for name, runs in runs_by_name:
                t = statistics.median(r["ttft_ms"] for r in runs)
                cached = runs[0].get("cached_tokens", 0)
                rows.append("| %d | %s | %d | %.0f | %.3f× |" % (tokens, name, cached, t, t / m))
    finally:
        redis.kill()
    table = "\n".join(["| prompt tokens | run | tokens from the tier | TTFT ms (median) | vs miss |",
                       "|---|---|---|---|---|"] + rows)
    print(table)
    if args.write:
        splice_doc(os.path.join("docs", "tiers.md"), "tier-ttft", table)


if __name__ == "__main__":
    sys.exit(main())
