#!/usr/bin/env python3
"""Serving under load: `kvx serve` beside llama.cpp's `llama-server` on the same GGUF, same
threads, same KV memory, driven by the same streaming clients on loopback. Writes the raw
results to docs/results/serving/serving.json and renders docs/serving.md and README.md between
<!-- serving:begin --> and <!-- serving:end -->.

What it measures (the model: `kvx gen-model --shape smollm2-135m --type q8_0`):
  load      N = 1, 8, 32 concurrent clients, each sending streaming /v1/completions one after
            another (distinct prompts of --prompt tokens, --gen tokens each): total generated
            tokens/s over the scenario's wall time, p50/p99 time to first token (TTFT) and p50/p99
            inter-token latency (gaps between streamed chunks).
  prefix    TTFT of a request whose first --prefix tokens (2048) are shared with an earlier one
            (cache hit) vs a request with a fresh prefix (miss), medians of --prefix-trials pairs.
  capacity  4k-token sessions per GiB of KV: the KV bytes one 4096-token session really holds
            (kvx: the pool's bytes in use from /metrics with the session held; llama.cpp: the
            KV buffer size it logs for a 4096-token context at each cache type), and
            1 GiB divided by it.

Usage:
  scripts/serving_report.py [--model GGUF] [--threads 2] [--llama-bin DIR]   measure, save, render
  scripts/serving_report.py --render                                          render from the saved data
  scripts/serving_report.py --check                                           fail if the documents differ
  scripts/serving_report.py --load-only --clients 32 [--kvx BIN]              kvx's load scenario with its step
                                                                              counters, printed (no files)
  --llama-bin DIR   a llama.cpp build's bin/ folder with llama-server; kvx never builds or ships it.
"""
import argparse, http.client, json, os, random, re, socket, statistics, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/results/serving")
RAW = os.path.join(DATA, "serving.json")
DOCS = [os.path.join(ROOT, "docs/serving.md"), os.path.join(ROOT, "README.md")]
GIB = 1 << 30
CAPACITY_TOKENS = 4096
KVX_CODECS = ["codec=f16", "codec=int8", "codec=kivi4,page=32", "codec=kivi2,page=32"]
LLAMA_CACHE_TYPES = ["f16", "q8_0", "q4_0"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free loopback port; its log is kept for parsing."""

    def __init__(self, cmd, port):
        self.port = port
        self.log_path = os.path.join(DATA, ".server.log")
        log("+ " + " ".join(cmd))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit("server exited at start:\n" + open(self.log_path).read()[-3000:])
            try:
                status, _ = self.get("/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        sys.exit("server did not become healthy in 300 s")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, body

    def logged(self):
        self.log.flush()
        return open(self.log_path).read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def stream_completion(port, prompt_ids, gen, temperature=0):
    """One streaming /v1/completions request; returns (ttft_s, [chunk gaps], completion tokens)."""
    body = json.dumps({"model": "m", "prompt": prompt_ids, "max_tokens": gen, "temperature": temperature,
                       "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    times, usage = [], None
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = json.loads(payload)
        if chunk.get("usage"):
            usage = chunk["usage"].get("completion_tokens")
        if chunk.get("choices"):
            times.append(time.perf_counter())
    c.close()
    if not times:
        raise RuntimeError("the stream carried no tokens")
    gaps = [b - a for a, b in zip(times, times[1:])]
    return times[0] - t0, gaps, usage if usage is not None else len(times)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def load_scenario(port, clients, per_client, prompt_len, gen, vocab, seed, temperature=0):
    rng = random.Random(seed)
    prompts = [[[rng.randrange(10, vocab) for _ in range(prompt_len)] for _ in range(per_client)]
               for _ in range(clients)]
    ttft, gaps, tokens, errors = [], [], [0], []
    lock = threading.Lock()

    def client(i):
        for p in prompts[i]:
            try:
                t, g, n = stream_completion(port, p, gen, temperature)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    errors.append(str(e)[:200])
                continue
            with lock:
                ttft.append(t)
                gaps.extend(g)
                tokens[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": clients * per_client, "errors": len(errors),
            "error_examples": errors[:3], "wall_s": wall, "tokens": tokens[0], "tok_s": tokens[0] / wall,
            "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
            "itl_p50_ms": 1e3 * pct(gaps, 50) if gaps else None, "itl_p99_ms": 1e3 * pct(gaps, 99) if gaps else None}


def prefix_scenario(port, prefix_len, trials, vocab, seed):
    rng = random.Random(seed)
    hit, miss = [], []
    for _ in range(trials):
        prefix = [rng.randrange(10, vocab) for _ in range(prefix_len)]
        tail = lambda: [rng.randrange(10, vocab) for _ in range(16)]  # noqa: E731
        first, _, _ = stream_completion(port, prefix + tail(), 4)  # a miss: this prefix is new
        second, _, _ = stream_completion(port, prefix + tail(), 4)  # shares the prefix
        miss.append(first)
        hit.append(second)
    return {"prefix_tokens": prefix_len, "trials": trials, "ttft_miss_ms": 1e3 * statistics.median(miss),
            "ttft_hit_ms": 1e3 * statistics.median(hit)}


def kvx_pool_bytes(metrics_text):
    for line in metrics_text.splitlines():
        m = re.match(r"kvx_pool_bytes_used(?:\{[^}]*\})?\s+([0-9.eE+]+)", line)
        if m:
            return float(m.group(1))
    return None


def kvx_capacity(args, kv):
    """Bytes of one 4096-token session, read from /metrics while a request holds it."""
    port = free_port()
    srv = Server([os.path.join(ROOT, "build/kvx"), "serve", "-m", args.model, "-t", str(args.threads),
                  "-c", str(CAPACITY_TOKENS + 64), "--kv", kv, "--port", str(port)], port)
    try:
        base = kvx_pool_bytes(srv.get("/metrics")[1]) or 0.0
        rng = random.Random(7)
        prompt = [rng.randrange(10, args.vocab) for _ in range(CAPACITY_TOKENS - 1)]
        peak = [0.0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                b = kvx_pool_bytes(srv.get("/metrics")[1])
                if b is not None:
                    peak[0] = max(peak[0], b)
                time.sleep(0.05)

        w = threading.Thread(target=watch)
        w.start()
        stream_completion(port, prompt, 1)
        done.set()
        w.join()
        return {"kv": kv, "session_bytes": peak[0] - base, "sessions_per_gib": GIB / (peak[0] - base)}
    finally:
        srv.stop()


def llama_capacity(args, cache_type):
    port = free_port()
    srv = Server([os.path.join(args.llama_bin, "llama-server"), "-m", args.model, "-t", str(args.threads),
                  "-c", str(CAPACITY_TOKENS), "-np", "1", "-ctk", cache_type, "-ctv", cache_type,
                  "--port", str(port)] + (["-fa"] if cache_type != "f16" else []), port)
    try:
        text = srv.logged()
    finally:
        srv.stop()
    # "llama_init_from_model: KV self size  =   90.00 MiB, K (f16): ..." (older builds), else the
    # "CPU KV buffer size = 90.00 MiB" line.
    m = re.search(r"KV self size\s*=\s*([0-9.]+)\s*MiB", text) or \
        re.search(r"KV buffer size\s*=\s*([0-9.]+)\s*MiB", text)
    if not m:
        return {"cache_type": cache_type, "error": "no KV size in llama-server's log"}
    b = float(m.group(1)) * (1 << 20)
    return {"cache_type": cache_type, "session_bytes": b, "sessions_per_gib": GIB / b}


def kvx_serve_cmd(args, kvx, port, n):
    ctx = args.prompt + args.gen + 16
    return [kvx, "serve", "-m", args.model, "-t", str(args.threads), "-c", str(max(ctx, args.prefix + 64)),
            "--max-seqs", str(n), "--kv", "codec=f16", "--port", str(port)]


def kvx_counters(srv):
    """The scheduler's counters from /metrics (unlabelled samples only)."""
    out = {}
    for line in srv.get("/metrics")[1].splitlines():
        m = re.match(r"(kvx_[a-z_]+) ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def load_only(args):
    """--load-only: kvx's load scenario alone (binary --kvx), with what its forward steps held and
    cost (/metrics counters over the scenario); prints JSON lines, writes no file."""
    for n in [int(c) for c in args.clients.split(",")]:
        port = free_port()
        srv = Server(kvx_serve_cmd(args, args.kvx, port, n), port)
        try:
            before = kvx_counters(srv)
            row = load_scenario(port, n, args.per_client, args.prompt, args.gen, args.vocab, 1000 + n,
                                args.temperature)
            after = kvx_counters(srv)
        finally:
            srv.stop()
        names = ("steps", "busy_seconds", "prompt_tokens", "generated_tokens", "decode_rows", "decode_only_steps",
                 "decode_only_seconds", "host_seconds", "sample_seconds")
        d = {n: after.get("kvx_%s_total" % n, 0) - before.get("kvx_%s_total" % n, 0) for n in names}
        d["ms_per_step"] = 1e3 * d.get("busy_seconds", 0) / max(d.get("steps", 0), 1)
        d["ms_per_decode_only_step"] = 1e3 * d.get("decode_only_seconds", 0) / max(d.get("decode_only_steps", 0), 1)
        row["steps"] = {k: round(v, 3) for k, v in d.items()}
        row.update(kvx=args.kvx, temperature=args.temperature)
        print(json.dumps(row), flush=True)


def measure(args):
    os.makedirs(DATA, exist_ok=True)
    kvx = os.path.join(ROOT, "build/kvx")
    if not os.path.exists(args.model):
        subprocess.run([kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", args.model], check=True)
    clients = [int(c) for c in args.clients.split(",")]
    most = max(clients)
    ctx = args.prompt + args.gen + 16
    data = {"generated": time.strftime("%Y-%m-%d %H:%M"), "model": os.path.basename(args.model),
            "threads": args.threads, "prompt": args.prompt, "gen": args.gen, "per_client": args.per_client,
            "prefix": args.prefix, "servers": {}, "capacity": {"kvx": [], "llama_cpp": []}}
    # Each client count gets its own server sized for it: kvx with --max-seqs N, llama-server with
    # N slots in N times the context (the same KV memory on both sides); the prefix scenario runs on
    # the one-client servers.
    def kvx_cmd(port, n):
        return kvx_serve_cmd(args, kvx, port, n)

    def llama_cmd(port, n):
        return [os.path.join(args.llama_bin, "llama-server"), "-m", args.model, "-t", str(args.threads), "-np",
                str(n), "-c", str(n * max(ctx, args.prefix + 64)), "--port", str(port)]

    servers = {"kvx": kvx_cmd}
    if args.llama_bin:
        servers["llama_cpp"] = llama_cmd
    for name, cmd in servers.items():
        rows, prefix = [], None
        for n in clients:
            port = free_port()
            srv = Server(cmd(port, n), port)
            try:
                log("%s: %d clients" % (name, n))
                rows.append(load_scenario(port, n, args.per_client, args.prompt, args.gen, args.vocab, 1000 + n))
                if prefix is None:
                    prefix = prefix_scenario(port, args.prefix, args.prefix_trials, args.vocab, 99)
            finally:
                srv.stop()
        data["servers"][name] = {"load": rows, "prefix": prefix}
    for kv in KVX_CODECS:
        data["capacity"]["kvx"].append(kvx_capacity(args, kv))
    if args.llama_bin:
        for t in LLAMA_CACHE_TYPES:
            data["capacity"]["llama_cpp"].append(llama_capacity(args, t))
    with open(RAW, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def fmt(x, digits=1):
    return "–" if x is None else ("%.*f" % (digits, x))


def render_section(d):
    names = {"kvx": "kvx", "llama_cpp": "llama.cpp"}
    out = ["Regenerated by `scripts/serving_report.py` on %s from `docs/results/serving/serving.json`. Model: `%s` "
           "(`kvx gen-model --shape smollm2-135m --type q8_0`), %d threads, f16 KV on both sides. Each client sends "
           "%d streaming `/v1/completions` requests one after another: %d-token prompts (distinct token ids), %d "
           "generated tokens. Each client count runs on its own server sized for it: kvx with `--max-seqs N`, "
           "llama-server with N slots (`-np N`) in N times the context, so both hold the same KV memory." % (
               d["generated"], d["model"], d["threads"], d["per_client"], d["prompt"], d["gen"]), "",
           "| server | clients | requests | errors | total tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, s in d["servers"].items():
        for r in s["load"]:
            out.append("| %s | %d | %d | %d | %s | %s | %s | %s | %s |" % (
                names[name], r["clients"], r["requests"], r["errors"], fmt(r["tok_s"]), fmt(r["ttft_p50_ms"]),
                fmt(r["ttft_p99_ms"]), fmt(r["itl_p50_ms"]), fmt(r["itl_p99_ms"])))
    out += ["", "Time to first token with a %d-token prefix shared with the previous request (hit) or new (miss), "
            "medians of %d pairs:" % (d["prefix"], next(iter(d["servers"].values()))["prefix"]["trials"]), "",
            "| server | TTFT miss ms | TTFT hit ms | miss / hit |", "|---|---|---|---|"]
    for name, s in d["servers"].items():
        p = s["prefix"]
        out.append("| %s | %s | %s | %s |" % (names[name], fmt(p["ttft_miss_ms"]), fmt(p["ttft_hit_ms"]),
                                              fmt(p["ttft_miss_ms"] / p["ttft_hit_ms"], 2)))
    out += ["", "4096-token sessions per GiB of KV (kvx: the pool's bytes in use while one session is held, from "
            "`/metrics`; llama.cpp: the KV buffer it logs for a 4096-token context). Quality of each codec: "
            "[docs/kv-quantization.md](kv-quantization.md).", "",
            "| server | KV | bytes per 4096-token session | sessions per GiB |", "|---|---|---|---|"]
    for r in d["capacity"]["kvx"]:
        out.append("| kvx | `%s` | %s MiB | %s |" % (r["kv"], fmt(r["session_bytes"] / (1 << 20), 2),
                                                     fmt(r["sessions_per_gib"])))
    for r in d["capacity"].get("llama_cpp") or []:
        if "error" in r:
            out.append("| llama.cpp | `-ctk/-ctv %s` | %s | – |" % (r["cache_type"], r["error"]))
        else:
            out.append("| llama.cpp | `-ctk/-ctv %s` | %s MiB | %s |" % (
                r["cache_type"], fmt(r["session_bytes"] / (1 << 20), 2), fmt(r["sessions_per_gib"])))
    return "\n".join(out) + "\n"


def rendered_docs():
    with open(RAW) as f:
        section = render_section(json.load(f))
    docs = {}
    for path in DOCS:
        text = open(path).read()
        new, n = re.subn(r"(<!-- serving:begin -->\n).*?(<!-- serving:end -->)",
                         lambda m: m.group(1) + section + m.group(2), text, flags=re.S)
        if n != 1:
            sys.exit("%s has no <!-- serving:begin --> ... <!-- serving:end --> section" % path)
        docs[path] = new
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/kvx-bench-models/smollm2-135m-q8_0.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--per-client", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--prefix-trials", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this")
    ap.add_argument("--load-only", action="store_true",
                    help="run kvx's load scenario at --clients only; print it with the step counters (no files)")
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"), help="the kvx binary for --load-only")
    ap.add_argument("--temperature", type=float, default=0, help="the requests' temperature for --load-only")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        if not os.path.exists(RAW):
            print("serving_report: no measured data yet (%s); run the script to measure" % RAW)
            sys.exit(77)
        bad = [p for p, text in rendered_docs().items() if open(p).read() != text]
        if bad:
            sys.exit("serving_report --check: %s differ from what %s renders; run scripts/serving_report.py --render"
                     % (", ".join(bad), RAW))
        print("serving_report: committed documents match the committed data")
        return
    if args.load_only:
        load_only(args)
        return
    if not args.render:
        measure(args)
    for path, text in rendered_docs().items():
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
