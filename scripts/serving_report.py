#!/usr/bin/env python3
"""Serving under load: `kvx serve` beside llama.cpp's `llama-server` on the same GGUF, same
threads, same KV memory, driven by the same streaming clients on loopback. Writes the raw
results to docs/results/serving/serving.json and renders docs/serving.md (every table) and the README's
headline, each between <!-- serving:begin --> and <!-- serving:end -->.

What it measures (the model: `kvx gen-model --shape smollm2-135m --type q8_0`):
  load      N = 1, 8, 32 concurrent clients, each sending streaming /v1/completions one after
            another (distinct prompts of --prompt tokens, --gen tokens each): total generated
            tokens/s over the scenario's wall time, p50/p99 time to first token (TTFT) and p50/p99
            inter-token latency (gaps between streamed chunks).
  prefix    TTFT of a request whose first --prefix tokens (2048) are shared with an earlier one
            (cache hit) vs a request with a fresh prefix (miss), medians of --prefix-trials pairs.
  capacity  4k-token sessions per GiB of KV: the KV bytes one 4096-token session really holds,
            and 1 GiB divided by it. kvx: one request on a fresh server with a named session
            ("session" field): a prompt of --kld-context x 4096 tokens (random ids), then
            generated tokens (ignore_eos) until the session holds 4096 tokens; the request ends,
            the session keeps its sequence, and /metrics' kvx_pool_bytes_used is read then
            (deterministic: nothing else is in the pool). A spec with a policy that compresses once
            is compressed after the prompt (the scheduler's compression moment), so its tail of
            generated tokens stays uncompressed: the state the kld protocol scores. llama.cpp: the
            KV buffer size it logs for a 4096-token context at each cache type.
  kld       the quality of each capacity spec: `kvx eval --tasks ppl,kld` on a REAL model (the
            capacity model has random weights, so its KLD would mean nothing): --kld-model (the
            recall model, 8 layers, trained at 8192) on --kld-text (its held-out validation text),
            chunks of 4096 tokens, baseline f32 KV. With a policy that compresses once, every
            run (baseline too) splits each chunk: the first --kld-context of it is prefilled and
            compressed, the rest scored token by token (docs/eval.md).
  goal      from the data: a spec meets the compass goal when its sessions per GiB are >= 6x
            llama.cpp's f16 and its mean KLD <= 0.01.

Usage:
  scripts/serving_report.py [--model GGUF] [--threads 2] [--llama-bin DIR]   measure, save, render
  scripts/serving_report.py --only capacity,kld [...]   measure only these sections (load, capacity,
                                                        kld), keep the others from the saved data
  scripts/serving_report.py --render                                          render from the saved data
  scripts/serving_report.py --check                                           fail if the documents differ
  scripts/serving_report.py --load-only --clients 32 [--kvx BIN]              kvx's load scenario with its step
                                                                              counters, printed (no files)
  --llama-bin DIR   a llama.cpp build's bin/ folder with llama-server; kvx never builds or ships it.
"""
import argparse, http.client, json, os, random, re, shlex, socket, statistics, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/results/serving")
RAW = os.path.join(DATA, "serving.json")
# Where the section goes: docs/serving.md gets every table, the README its headline (functions below).
DOCS = {os.path.join(ROOT, "docs/serving.md"): lambda d: render_section(d),
        os.path.join(ROOT, "README.md"): lambda d: render_headline(d)}
GIB = 1 << 30
CAPACITY_TOKENS = 4096
# KV specs of the capacity table: the codecs alone, then codecs with SnapKV compressing once after
# the prompt (ratio = the fraction of the compressed context's entries removed).
KVX_SPECS = ["codec=f16", "codec=int8", "codec=kivi4,page=32", "codec=kivi2,page=32",
             "codec=f16;policy=snapkv,ratio=0.875", "codec=int8;policy=snapkv,ratio=0.75",
             "codec=kivi4,page=32;policy=snapkv,ratio=0.5", "codec=kivi4,page=32;policy=snapkv,ratio=0.75",
             "codec=kivi2,page=32;policy=snapkv,ratio=0.5",
             # SnapKV with max pooling over a wider kernel (KVCache-Factory's choice: the neighbours of every
             # voted entry survive) and KIVI-4 with pre-RoPE keys in 64-token pages.
             "codec=kivi4,page=32;policy=snapkv,ratio=0.7,kernel=15,pool=max",
             "codec=kivi4,page=32;policy=snapkv,ratio=0.75,kernel=15,pool=max",
             "codec=kivi4,page=64,group=64,prerope=1;policy=snapkv,ratio=0.7,kernel=15,pool=max",
             "codec=kivi4,page=64,group=64,prerope=1;policy=snapkv,ratio=0.75,kernel=15,pool=max",
             # DuoAttention-style head typing, continuous: retrieval heads keep everything, streaming heads
             # 64 sinks + 512 recent entries after every step, so the generated tail is bounded too. HEADS
             # stands for the model's head table (see with_heads).
             "codec=f16;policy=duo,heads=HEADS,retrieval=0.25,sinks=64,window=512,mode=continuous",
             "codec=kivi4,page=64,group=64,prerope=1;policy=duo,heads=HEADS,retrieval=0.25,sinks=64,window=512,"
             "mode=continuous",
             "codec=kivi4,page=64,group=64,prerope=1;policy=duo,heads=HEADS,retrieval=0.0625,sinks=64,window=512,"
             "mode=continuous"]
LLAMA_CACHE_TYPES = ["f16", "q8_0", "q4_0"]
SECTIONS = ["load", "capacity", "kld", "validation", "retrieval"]
# The specs that met the goal were chosen looking at the kld section's chunks: the validation section
# re-measures them (and the f32 baseline) over more chunks of the same held-out text, the first ones
# being those chunks, so the chunks not seen when choosing can be read apart.
VALIDATION_CHUNKS = 12
# The head table of a head-typing spec belongs to a model: the capacity model's is calibrated by the
# capacity section (its random weights make the choice of heads arbitrary, but only their number sets the
# bytes), the kld model's is the committed calibration of the recall model (--kld-heads).
HEADS = "heads=HEADS"
CAPACITY_HEADS = os.path.join(DATA, "capacity-heads-duo.json")
GOAL_RATIO = 6.0  # sessions per GiB against llama.cpp's f16
GOAL_KLD = 0.01   # mean KLD against the f32 baseline
# "Equal quality" needs retrieval too (issue 37): a number hidden in natural text (RULER's niah_number in the
# Paul Graham essays, question included, as the capacity session compresses after its prompt) at 2k and 4k
# tokens (8k: 2.5x the machine time of both; left for an idle machine);
# a spec passes when the exact McNemar test on the same prompts finds it indistinguishable from f16 (or better).
RETRIEVAL_LENGTHS = "2048,4096"
RETRIEVAL_DEPTHS = "0.1,0.3,0.5,0.7,0.9"
RETRIEVAL_TRIALS = 5  # per (length, depth): 50 prompts per spec
RETRIEVAL_JSON = os.path.join(DATA, "retrieval.eval.json")
KLD_BASELINE = "codec=f32"


def with_heads(kv, path):
    """The spec with its head table placeholder (HEADS) replaced by the table of the model it runs on."""
    return kv.replace(HEADS, "heads=" + os.path.relpath(path, ROOT))


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


def post_json(port, path, body, timeout=1800):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, text[:300]))
    return json.loads(text)


def kvx_capacity(args, kv):
    """Bytes of one 4096-token session held by name, read from /metrics after its request ended."""
    port = free_port()
    srv = Server([os.path.join(ROOT, "build/kvx"), "serve", "-m", args.model, "-t", str(args.threads),
                  "-c", str(CAPACITY_TOKENS + 64), "--kv", kv, "--port", str(port)], port)
    try:
        before = kvx_pool_bytes(srv.get("/metrics")[1]) or 0.0
        rng = random.Random(7)
        n_prompt = int(round(args.kld_context * CAPACITY_TOKENS))
        prompt = [rng.randrange(10, args.vocab) for _ in range(n_prompt)]
        # The last generated token is sampled, not fed: the session holds prompt + gen - 1 tokens.
        gen = CAPACITY_TOKENS - n_prompt + 1
        log("kvx capacity %s: %d prompt + %d generated tokens" % (kv, n_prompt, gen))
        out = post_json(port, "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": gen,
                                                  "temperature": 0, "ignore_eos": True, "session": "capacity"})
        generated = out["usage"]["completion_tokens"]
        if generated != gen:
            raise RuntimeError("the capacity request generated %d tokens, not %d" % (generated, gen))
        held = kvx_pool_bytes(srv.get("/metrics")[1]) - before
        return {"kv": kv, "prompt_tokens": n_prompt, "session_tokens": n_prompt + gen - 1,
                "session_bytes": held, "sessions_per_gib": GIB / held}
    finally:
        srv.stop()


def run_kld_eval(args, specs, chunks, out):
    """`kvx eval --tasks ppl,kld` of `specs` (HEADS placeholders as given) on the kld model over `chunks`
    chunks, its JSON kept at `out` (re-read instead with --kld-reuse); returns the report and, per spec, its
    non-baseline result in order."""
    run_specs = [with_heads(kv, args.kld_heads) for kv in specs]
    cmd = [os.path.join(ROOT, "build/kvx"), "eval", "-m", args.kld_model, "--baseline", KLD_BASELINE,
           "--tasks", "ppl,kld", "-f", args.kld_text, "-c", str(CAPACITY_TOKENS), "--chunk", str(CAPACITY_TOKENS),
           "--chunks", str(chunks), "--kld-context", str(args.kld_context), "--compress", "included",
           "-t", str(args.kld_threads or args.threads), "-q", "--json", out]
    for kv in run_specs:
        cmd += ["--kv", kv]
    if args.kld_reuse and os.path.exists(out):
        log("reusing %s (--kld-reuse)" % out)
    else:
        log("+ " + " ".join(cmd))
        subprocess.run(cmd, check=True)
    with open(out) as f:
        rep = json.load(f)
    results = [sp for sp in rep["results"] if not sp.get("baseline")]
    if [sp["spec"] for sp in results] != run_specs or rep["settings"]["ppl"].get("kld_context") != args.kld_context:
        sys.exit("%s was made for other specs or another --kld-context; run without --kld-reuse" % out)
    return rep, results


def kld_table(args):
    """`kvx eval --tasks ppl,kld` of every capacity spec on the real model; the eval's JSON is kept."""
    rep, results = run_kld_eval(args, KVX_SPECS, args.kld_chunks, os.path.join(DATA, "kld.eval.json"))
    rows = []
    for kv, sp in zip(KVX_SPECS, results):
        k = sp.get("kld") or {}
        p = sp.get("ppl") or {}
        rows.append({"kv": kv, "kld_mean": k.get("mean"), "kld_stderr": k.get("mean_stderr"),
                     "kld_p99": k.get("p99"), "top1": k.get("top1"), "positions": k.get("n_positions"),
                     "context": k.get("context", 0), "ppl": p.get("ppl"), "ok": bool(k.get("ok", False)),
                     "error": k.get("error")})
    base = next(sp for sp in rep["results"] if sp.get("baseline"))
    return {"model": os.path.basename(args.kld_model), "text": os.path.basename(args.kld_text),
            "baseline": KLD_BASELINE, "chunk": CAPACITY_TOKENS, "chunks": args.kld_chunks,
            "kld_context": args.kld_context, "baseline_ppl": (base.get("ppl") or {}).get("ppl"),
            "heads": os.path.relpath(args.kld_heads, ROOT), "rows": rows}


def kld_validation(args, data):
    """The specs that met the goal in the kld section, over VALIDATION_CHUNKS chunks (the kld section's
    first, then unseen ones); the eval's JSON is kept."""
    met = [r["kv"] for r, _, _, ok in goal_rows(data) if ok]
    if not met:
        return None
    _, results = run_kld_eval(args, met, VALIDATION_CHUNKS, os.path.join(DATA, "kld_validation.eval.json"))
    rows = []
    for kv, sp in zip(met, results):
        k = sp.get("kld") or {}
        rows.append({"kv": kv, "kld_mean": k.get("mean"), "kld_stderr": k.get("mean_stderr"),
                     "top1": k.get("top1"), "positions": k.get("n_positions"), "ok": bool(k.get("ok", False))})
    return {"chunks": VALIDATION_CHUNKS, "rows": rows}


# Of the specs meeting the ratio and the KLD bound, those whose retrieval is measured (each continuous policy or
# codec needs its own prefill of every prompt: on 2 loaded cores, about 15 minutes each): SnapKV 0.7 and 0.75 +
# KIVI-4 (one prefill), the case, and the validated duo + KIVI-4 at one retrieval head. The others
# (page-64 SnapKV, duo at 0.25) are left out of the verdict as not measured.
RETRIEVAL_SPECS = ["codec=kivi4,page=32;policy=snapkv,ratio=0.7,kernel=15,pool=max",
                   "codec=kivi4,page=32;policy=snapkv,ratio=0.75,kernel=15,pool=max",
                   "codec=kivi4,page=64,group=64,prerope=1;policy=duo,heads=HEADS,retrieval=0.0625,sinks=64,window=512,"
                   "mode=continuous"]


def retrieval_specs(data):
    """The specs whose retrieval is measured: RETRIEVAL_SPECS that meet the ratio and the KLD bound."""
    met = [r["kv"] for r, _, _, ok in goal_rows(data) if ok]
    return [kv for kv in RETRIEVAL_SPECS if kv in met]


def retrieval_command(specs, heads):
    cmd = ["build/kvx", "eval", "-m", "../shared/models/recall/recall-llama-8L-d512-f16.gguf", "-q", "--tasks",
           "niah_number", "-c", "4096", "--lengths", RETRIEVAL_LENGTHS, "--depths", RETRIEVAL_DEPTHS,
           "--ruler-trials", str(RETRIEVAL_TRIALS), "--baseline", "codec=f16", "--compress", "included",
           "--json", os.path.relpath(RETRIEVAL_JSON, ROOT)]
    for kv in specs:  # heads: relative to the repository (the command runs there)
        cmd += ["--kv", kv.replace(HEADS, "heads=" + heads)]
    return cmd


def retrieval_table(args, data):
    """niah_number of the specs that meet the ratio and KLD, against f16 on the same prompts."""
    specs = retrieval_specs(data)
    if not specs:
        return None
    cmd = retrieval_command(specs, os.path.relpath(args.kld_heads, ROOT)) + ["-t", str(args.kld_threads or args.threads)]
    log("+ " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=ROOT)
    return retrieval_from_json(specs, args.kld_heads)


def retrieval_from_json(specs, heads):
    with open(RETRIEVAL_JSON) as f:
        rep = json.load(f)
    rows = {}
    base = next(sp for sp in rep["results"] if sp.get("baseline"))["niah_number"]
    for kv, sp in zip(specs, [sp for sp in rep["results"] if not sp.get("baseline")]):
        t = sp.get("niah_number") or {}
        rows[kv] = {"hits": t.get("hits"), "n": t.get("n"), "interval": t.get("accuracy_interval"),
                    "vs_baseline": t.get("vs_baseline"), "ok": bool(t.get("ok"))}
    return {"baseline": {"hits": base["hits"], "n": base["n"], "interval": base.get("accuracy_interval")},
            "heads": os.path.relpath(heads, ROOT), "lengths": RETRIEVAL_LENGTHS, "depths": RETRIEVAL_DEPTHS, "trials": RETRIEVAL_TRIALS, "rows": rows}


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


def measure(args, sections):
    os.makedirs(DATA, exist_ok=True)
    kvx = os.path.join(ROOT, "build/kvx")
    if not os.path.exists(args.model):
        subprocess.run([kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", args.model], check=True)
    data = {}
    if set(sections) != set(SECTIONS):
        if not os.path.exists(RAW):
            sys.exit("--only needs the saved data (%s) to merge into; measure every section first" % RAW)
        with open(RAW) as f:
            data = json.load(f)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    data["model"] = os.path.basename(args.model)
    data["threads"] = args.threads
    def save():  # after every section, so a later failure keeps what was measured
        with open(RAW, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")

    if "load" in sections:
        data.update(load_sections(args, kvx))
        data["generated"] = stamp
        save()
    if "capacity" in sections:
        cap = {"generated": stamp, "kld_context": args.kld_context, "kvx": [], "llama_cpp": []}
        if any(HEADS in kv for kv in KVX_SPECS):
            calibrate = [kvx, "calibrate-heads", "-m", args.model, "--method", "duo", "-t", str(args.threads),
                         "-o", CAPACITY_HEADS]
            log("+ " + " ".join(calibrate))
            subprocess.run(calibrate, check=True, stdout=subprocess.DEVNULL)
        for kv in KVX_SPECS:
            row = kvx_capacity(args, with_heads(kv, CAPACITY_HEADS))
            row["kv"] = kv
            cap["kvx"].append(row)
        if args.llama_bin:
            for t in LLAMA_CACHE_TYPES:
                cap["llama_cpp"].append(llama_capacity(args, t))
        else:
            cap["llama_cpp"] = (data.get("capacity") or {}).get("llama_cpp", [])
        data["capacity"] = cap
        save()
    if "kld" in sections:
        data["kld"] = kld_table(args)
        data["kld"]["generated"] = stamp
        save()
    if "validation" in sections:
        data["validation"] = kld_validation(args, data)
        save()
    if "retrieval" in sections:
        data["retrieval"] = (retrieval_from_json(retrieval_specs(data), args.kld_heads) if args.retrieval_reuse
                             else retrieval_table(args, data))
        save()


def median_row(rows, keys):
    """One row of medians over the rounds of a scenario (errors and requests summed)."""
    out = dict(rows[0])
    for k in keys:
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    out["errors"] = sum(r["errors"] for r in rows)
    out["requests"] = sum(r["requests"] for r in rows)
    out["error_examples"] = [e for r in rows for e in r.get("error_examples", [])][:3]
    out["rounds"] = len(rows)
    if "tok_s" in keys:
        out["tok_s_min"], out["tok_s_max"] = min(r["tok_s"] for r in rows), max(r["tok_s"] for r in rows)
    return out


LOAD_KEYS = ("wall_s", "tokens", "tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
PREFIX_KEYS = ("ttft_miss_ms", "ttft_hit_ms")


def load_sections(args, kvx):
    """The load and prefix scenarios on both servers, --rounds times; the rounds interleave the servers
    (round 1: kvx then llama.cpp at every client count, round 2 ...) so a drift of this machine's speed
    falls on both, and the tables show medians."""
    clients = [int(c) for c in args.clients.split(",")]
    ctx = args.prompt + args.gen + 16
    data = {"prompt": args.prompt, "gen": args.gen, "per_client": args.per_client, "prefix": args.prefix,
            "rounds": args.rounds, "servers": {}}
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
    raw = {name: {"load": {n: [] for n in clients}, "prefix": []} for name in servers}
    for rnd in range(args.rounds):
        for n in clients:
            for name, cmd in servers.items():
                port = free_port()
                srv = Server(cmd(port, n), port)
                try:
                    log("round %d/%d, %s: %d clients" % (rnd + 1, args.rounds, name, n))
                    # The same prompts every round (the seed is the client count): rounds differ only by time.
                    raw[name]["load"][n].append(load_scenario(port, n, args.per_client, args.prompt, args.gen,
                                                              args.vocab, 1000 + n))
                    if n == clients[0]:
                        raw[name]["prefix"].append(prefix_scenario(port, args.prefix, args.prefix_trials,
                                                                   args.vocab, 99 + rnd))
                finally:
                    srv.stop()
    for name in servers:
        data["servers"][name] = {
            "load": [median_row(raw[name]["load"][n], LOAD_KEYS) for n in clients],
            "prefix": dict(raw[name]["prefix"][0], rounds=args.rounds,
                           **{k: statistics.median(p[k] for p in raw[name]["prefix"]) for k in PREFIX_KEYS}),
            "raw": {str(n): raw[name]["load"][n] for n in clients}, "raw_prefix": raw[name]["prefix"]}
    return data


def fmt(x, digits=1):
    return "–" if x is None else ("%.*f" % (digits, x))


def render_section(d):
    names = {"kvx": "kvx", "llama_cpp": "llama.cpp"}
    out = ["Regenerated by `scripts/serving_report.py` on %s from `docs/results/serving/serving.json`. Model: `%s` "
           "(`kvx gen-model --shape smollm2-135m --type q8_0`), %d threads, f16 KV on both sides. Each client sends "
           "%d streaming `/v1/completions` requests one after another: %d-token prompts (distinct token ids), %d "
           "generated tokens. Each client count runs on its own server sized for it: kvx with `--max-seqs N`, "
           "llama-server with N slots (`-np N`) in N times the context, so both hold the same KV memory. %s" % (
               d["generated"], d["model"], d["threads"], d["per_client"], d["prompt"], d["gen"],
               "Every cell is the median of %d rounds; the rounds interleave the servers (kvx then llama.cpp at "
               "each client count, then the next round), the same prompts each round; requests and errors are "
               "summed over the rounds." % d["rounds"] if d.get("rounds", 1) > 1 else "One round."), "",
           "| server | clients | requests | errors | total tok/s (min–max) | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
           "| ITL p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in d["servers"].items():
        for r in s["load"]:
            spread = " (%s–%s)" % (fmt(r["tok_s_min"]), fmt(r["tok_s_max"])) if "tok_s_min" in r else ""
            out.append("| %s | %d | %d | %d | %s%s | %s | %s | %s | %s |" % (
                names[name], r["clients"], r["requests"], r["errors"], fmt(r["tok_s"]), spread,
                fmt(r["ttft_p50_ms"]), fmt(r["ttft_p99_ms"]), fmt(r["itl_p50_ms"]), fmt(r["itl_p99_ms"])))
    pre = next(iter(d["servers"].values()))["prefix"]
    out += ["", "Time to first token with a %d-token prefix shared with the previous request (hit) or new (miss), "
            "medians of %d pairs%s:" % (d["prefix"], pre["trials"],
                                        " in each of %d rounds, then the median of the rounds" % pre["rounds"]
                                        if pre.get("rounds", 1) > 1 else ""), "",
            "| server | TTFT miss ms | TTFT hit ms | miss / hit |", "|---|---|---|---|"]
    for name, s in d["servers"].items():
        p = s["prefix"]
        out.append("| %s | %s | %s | %s |" % (names[name], fmt(p["ttft_miss_ms"]), fmt(p["ttft_hit_ms"]),
                                              fmt(p["ttft_miss_ms"] / p["ttft_hit_ms"], 2)))
    out += [""] + render_capacity(d)
    return "\n".join(out) + "\n"


def goal_rows(d):
    """Each kvx capacity spec with its ratio to llama.cpp's f16 sessions per GiB, its KLD row and the verdict."""
    cap = d["capacity"]
    llama_f16 = next((r for r in cap.get("llama_cpp") or [] if r.get("cache_type") == "f16" and "error" not in r),
                     None)
    kld = {r["kv"]: r for r in (d.get("kld") or {}).get("rows", [])}
    rows = []
    for r in cap["kvx"]:
        ratio = r["sessions_per_gib"] / llama_f16["sessions_per_gib"] if llama_f16 else None
        k = kld.get(r["kv"])
        mean = k["kld_mean"] if k and k["ok"] else None
        met = ratio is not None and mean is not None and ratio >= GOAL_RATIO and mean <= GOAL_KLD
        rows.append((r, ratio, k, met))
    return rows


def retrieval_verdict(d, kv):
    """(cell text, equal or None when not measured) of a spec's retrieval against f16 on the same prompts."""
    ret = d.get("retrieval")
    row = (ret or {}).get("rows", {}).get(kv)
    if not row or not row["ok"] or row["hits"] is None:
        return "–", None
    vs = row.get("vs_baseline") or {}
    verdict = vs.get("verdict", "?")
    lo, hi = row["interval"] or (0, 1)
    text = "%d/%d [%.0f–%.0f%%], %s (McNemar p %.2g: %d lost, %d gained)" % (
        row["hits"], row["n"], 100 * lo, 100 * hi, verdict, vs.get("p", vs.get("mcnemar_p", 1)), vs.get("baseline_only", 0),
        vs.get("spec_only", 0))
    return text, verdict in ("indistinguishable", "better")


def fmt_kld(x):
    return "%.4f" % x if x >= 1e-3 else "%.1e" % x


def kld_command(kd):
    """The eval command of the kld section, from its saved settings (threads do not change the numbers)."""
    cmd = ["build/kvx", "eval", "-m", "../shared/models/recall/" + kd["model"], "--baseline", kd["baseline"],
           "--tasks", "ppl,kld", "-f", "../shared/golden/" + kd["text"], "-c", str(kd["chunk"]), "--chunk",
           str(kd["chunk"]), "--chunks", str(kd["chunks"]), "--kld-context", "%g" % kd["kld_context"],
           "--compress", "included", "-q", "--json", "docs/results/serving/kld.eval.json"]
    for r in kd["rows"]:
        cmd += ["--kv", "'%s'" % r["kv"].replace(HEADS, "heads=" + kd.get("heads", "HEADS"))]
    return " ".join(cmd)


def render_capacity(d):
    cap = d["capacity"]
    kd = d.get("kld")
    ctx = cap.get("kld_context", 0.75)
    n_prompt = int(round(ctx * CAPACITY_TOKENS))
    out = ["### Sessions per GiB at equal quality", "",
           "Regenerated on %s. A 4096-token session is a %d-token prompt (the context) followed by %d generated "
           "tokens. kvx: one request on a fresh `kvx serve` (same smollm2-135m-shape GGUF, random weights) keeps its "
           "sequence as a named session (`\"session\"`), with `ignore_eos` so it holds exactly 4096 tokens; the "
           "pool's bytes in use (`kvx_pool_bytes_used` in `/metrics`) are read after the request ended, so the "
           "figure is exact, not a poll. A spec with a policy that compresses once (`policy=snapkv` here) is "
           "compressed by the scheduler when the prompt is in, before the first token is sampled; the generated "
           "tokens after it stay uncompressed. A head-typing spec (`policy=duo,...,mode=continuous`) trims its "
           "streaming heads after every step, generated tokens included; its `heads=HEADS` stands for the head "
           "table of the model it runs on: `kvx calibrate-heads --method duo` of the capacity model "
           "(`docs/results/serving/capacity-heads-duo.json`; with random weights the choice of heads is arbitrary, "
           "but only their number sets the bytes) and, for the KLD, of the recall model (`%s`). llama.cpp: the KV "
           "buffer `llama-server` logs for a 4096-token context (`-c 4096 -np 1`)." % (
               cap.get("generated", d.get("generated", "?")), n_prompt, CAPACITY_TOKENS - n_prompt,
               (kd or {}).get("heads", "docs/results/head_typing/recall-duo.json")), ""]
    if kd:
        out += ["Quality is measured on a **real** model, not on the capacity model (its random weights make any "
                "KLD meaningless): `%s` (the recall model: 8 layers, 2 KV heads, trained at 8192 tokens) on `%s` "
                "(its held-out validation text), %d chunks of %d tokens, KLD against the `%s` KV cache. Every run, "
                "baseline included, prefills the first %d tokens of a chunk, compresses (a no-op without a policy), "
                "then scores the other %d positions token by token, teacher forced: the same context/tail split as "
                "the capacity session (`kvx eval --kld-context %g`, [docs/eval.md](eval.md)). Command: `%s`." % (
                    kd["model"], kd["text"], kd["chunks"], kd["chunk"], kd["baseline"],
                    int(round(kd["kld_context"] * kd["chunk"])),
                    kd["chunk"] - 1 - int(round(kd["kld_context"] * kd["chunk"])), kd["kld_context"],
                    kld_command(kd)), ""]
    ret = d.get("retrieval")
    if ret:
        b = ret["baseline"]
        out += ["Retrieval, for the specs within the ratio and the KLD bound: RULER's `niah_number` (a 7-digit number "
                "hidden in the Paul Graham essays, asked at the end; question included, as the capacity session "
                "compresses after its prompt) at %s tokens, depths %s, %d prompts per cell: %d per spec, the same "
                "prompts for every spec. f16 finds %d/%d [Wilson 95%%: %.0f–%.0f%%]. A spec is **equal** when the "
                "exact McNemar test on the same prompts (`eval/stats.h`) calls it indistinguishable from f16 "
                "(or better). Command: `%s`." % (
                    ret["lengths"], ret["depths"], ret["trials"], b["n"], b["hits"], b["n"],
                    100 * (b["interval"] or [0, 1])[0], 100 * (b["interval"] or [0, 1])[1],
                    " ".join(shlex.quote(x) for x in retrieval_command(list(ret["rows"]), ret["heads"])))]
        if kd and kd.get("heads") != ret["heads"]:
            out[-1] += (" The head-typing rows' KLD was measured with the head table `%s`, their retrieval with `%s` "
                        "(`kvx calibrate-heads` on leak-free data, docs/kv-head-typing.md): at `retrieval=0.0625` both "
                        "keep the same single head, (7,1); at `retrieval=0.25` they share only that one of four, so "
                        "that row's KLD is the old table's." % (kd["heads"], ret["heads"]))
        out.append("")
    out += ["| server | KV | bytes per 4096-token session | sessions per GiB | × llama.cpp f16 | mean KLD (± stderr) "
            "| top-1 agreement | niah_number vs f16 | goal (≥ %gx, KLD ≤ %g, retrieval equal) |" % (
                GOAL_RATIO, GOAL_KLD), "|---|---|---|---|---|---|---|---|---|"]
    met_any = []
    for r, ratio, k, met in goal_rows(d):
        retrieval, equal = retrieval_verdict(d, r["kv"])
        kld_only = met and ret and equal is None  # not measured is not a verdict of equal quality
        if met and ret:
            met = bool(equal)
        if k and k["ok"]:
            kl = "%s ± %s" % (fmt_kld(k["kld_mean"]), fmt_kld(k["kld_stderr"]))
            top1 = "%.1f%%" % (100 * k["top1"])
        else:
            kl = "–" if not k else "error: %s" % k.get("error")
            top1 = "–"
        verdict = "–" if ratio is None or not (k and k["ok"]) else (
            "**met**" if met else "KLD only: retrieval not measured" if kld_only else "no")
        if met:
            met_any.append(r["kv"])
        out.append("| kvx | `%s` | %s MiB | %s | %s | %s | %s | %s | %s |" % (
            r["kv"], fmt(r["session_bytes"] / (1 << 20), 2), fmt(r["sessions_per_gib"]),
            "–" if ratio is None else "%.2f×" % ratio, kl, top1, retrieval, verdict))
    for r in cap.get("llama_cpp") or []:
        if "error" in r:
            out.append("| llama.cpp | `-ctk/-ctv %s` | %s | – | – | – | – | – | – |" % (r["cache_type"], r["error"]))
        else:
            out.append("| llama.cpp | `-ctk/-ctv %s` | %s MiB | %s | %s | – | – | – | – |" % (
                r["cache_type"], fmt(r["session_bytes"] / (1 << 20), 2), fmt(r["sessions_per_gib"]),
                "%.2f×" % (r["sessions_per_gib"] / next(x["sessions_per_gib"] for x in cap["llama_cpp"]
                                                         if x.get("cache_type") == "f16" and "error" not in x))))
    rows = goal_rows(d)
    if not kd:
        out += ["", "**Goal (≥ %gx llama.cpp's f16 sessions per GiB at mean KLD ≤ %g): not judged**: no KLD data." % (
            GOAL_RATIO, GOAL_KLD)]
    elif met_any:
        out += ["", "**Goal (≥ %gx llama.cpp's f16 sessions per GiB at mean KLD ≤ %g%s): %s** by %s." % (
            GOAL_RATIO, GOAL_KLD, " and retrieval indistinguishable from f16's" if ret else "",
            "met on these %d chunks" % kd["chunks"] if d.get("validation") else "met",
            ", ".join("`%s`" % m for m in met_any))]
    else:
        within = [(r["kv"], ratio) for r, ratio, k, _ in rows if k and k["ok"] and k["kld_mean"] <= GOAL_KLD]
        best_q = max(within, key=lambda x: x[1] or 0) if within else None
        dense = [(r["kv"], k["kld_mean"], k["kld_stderr"], ratio) for r, ratio, k, _ in rows
                 if ratio and ratio >= GOAL_RATIO and k and k["ok"]]
        best_d = min(dense, key=lambda x: x[1]) if dense else None
        msg = "**Goal (≥ %gx llama.cpp's f16 sessions per GiB at mean KLD ≤ %g): not met.**" % (GOAL_RATIO, GOAL_KLD)
        if best_q:
            msg += " The most sessions at KLD ≤ %g: `%s`, %.2f× llama.cpp's f16." % (GOAL_KLD, best_q[0], best_q[1])
        if best_d:
            msg += " The lowest KLD at ≥ %g×: `%s` (%.2f×), mean KLD %s ± %s." % (
                GOAL_RATIO, best_d[0], best_d[3], fmt_kld(best_d[1]), fmt_kld(best_d[2]))
        out += ["", msg]
    out += render_validation(d)
    out += ["", "Quality of each codec on more models and tasks: [docs/kv-quantization.md](kv-quantization.md); "
            "of the eviction policies: [docs/kv-eviction.md](kv-eviction.md)."]
    return out


def render_validation(d):
    """The goal's specs over more chunks: the kld section's chunks came first, so the mean over the unseen
    ones follows from the two means (every chunk scores the same number of positions)."""
    v, kd = d.get("validation"), d.get("kld")
    if not v or not kd:
        return []
    seen = {r["kv"]: r for r in kd["rows"]}
    n_seen, n_all = kd["chunks"], v["chunks"]
    out = ["", "The specs that met the goal were picked looking at those %d chunks; over %d chunks of the same text "
           "(the same %d first, then %d unseen; command: the one above with `--chunks %d` and these specs):" % (
               n_seen, n_all, n_seen, n_all - n_seen, n_all), "",
           "| KV | mean KLD, %d chunks | mean KLD, %d chunks (± stderr) | mean KLD, the %d unseen | top-1 | goal |" % (
               n_seen, n_all, n_all - n_seen), "|---|---|---|---|---|---|"]
    for r in v["rows"]:
        s = seen.get(r["kv"])
        if not (r["ok"] and s and s["ok"]):
            out.append("| `%s` | – | – | – | – | – |" % r["kv"])
            continue
        unseen = (n_all * r["kld_mean"] - n_seen * s["kld_mean"]) / (n_all - n_seen)
        out.append("| `%s` | %s | %s ± %s | %s | %.1f%% | %s |" % (
            r["kv"], fmt_kld(s["kld_mean"]), fmt_kld(r["kld_mean"]), fmt_kld(r["kld_stderr"]), fmt_kld(unseen),
            100 * r["top1"], "holds" if r["kld_mean"] <= GOAL_KLD and unseen <= GOAL_KLD else
            ("holds over %d, not on the unseen alone" % n_all if r["kld_mean"] <= GOAL_KLD else "does not hold")))
    ratio = {r["kv"]: x for r, x, _, _ in goal_rows(d)}
    # With retrieval measured, a spec that loses retrievals f16 makes is not "equal quality", whatever its KLD.
    judged = {r["kv"]: retrieval_verdict(d, r["kv"])[1] for r in v["rows"]} if d.get("retrieval") else {}
    lost = [kv for kv, equal in judged.items() if equal is False]
    unmeasured = [kv for kv, equal in judged.items() if equal is None]
    held = [r for r in v["rows"] if r["ok"] and r["kld_mean"] <= GOAL_KLD and r["kv"] not in lost + unmeasured]
    clean = [r for r in held if seen.get(r["kv"]) and (n_all * r["kld_mean"] - n_seen * seen[r["kv"]]["kld_mean"])
             / (n_all - n_seen) <= GOAL_KLD]
    if clean:
        best = max(clean, key=lambda r: ratio.get(r["kv"]) or 0)
        verdict = "**Verdict: met**, validated on unseen chunks: `%s`, %.2f× llama.cpp's f16." % (
            best["kv"], ratio.get(best["kv"]) or 0)
    elif held:
        best = max(held, key=lambda r: ratio.get(r["kv"]) or 0)
        verdict = ("**Verdict: borderline.** Over all %d chunks `%s` holds (%.2f× llama.cpp's f16, mean KLD %s), "
                   "but the %d chunks not seen when choosing it alone are above %g." % (
                       n_all, best["kv"], ratio.get(best["kv"]) or 0, fmt_kld(best["kld_mean"]), n_all - n_seen,
                       GOAL_KLD))
    else:
        verdict = "**Verdict: not met** on more data: no spec stays at mean KLD ≤ %g over %d chunks%s." % (
            GOAL_KLD, n_all, " with retrieval equal to f16's" if lost else "")
    if lost:
        verdict += (" Left out for losing retrievals f16 makes (KLD alone would have called them equal): %s." %
                    ", ".join("`%s`" % kv for kv in lost))
    if unmeasured:
        verdict += " Not judged (retrieval not measured): %s." % ", ".join("`%s`" % kv for kv in unmeasured)
    return out + ["", verdict]


def render_headline(d):
    """The README's serving table: throughput and time to first token per client count, both servers side
    by side, then the prefix-cache hit and the capacity verdict; docs/serving.md has every table."""
    names = list(d["servers"])
    load = {name: {r["clients"]: r for r in s["load"]} for name, s in d["servers"].items()}
    label = {"kvx": "kvx", "llama_cpp": "llama.cpp"}
    out = ["`kvx serve` beside `llama-server` on `%s`, %d threads, f16 KV on both sides, the same KV memory; "
           "streaming `/v1/completions`, %d-token prompts, %d generated tokens, medians of %d rounds "
           "(rendered by `scripts/serving_report.py` on %s; every table, the method and the capacity "
           "measurements: [docs/serving.md](docs/serving.md#measured-under-load))." % (
               d["model"], d["threads"], d["prompt"], d["gen"], d.get("rounds", 1), d["generated"]), "",
           "| clients | " + " | ".join("%s tok/s" % label[n] for n in names) + " | " +
           " | ".join("%s TTFT p50 ms" % label[n] for n in names) + " |", "|---|" + "---:|" * (2 * len(names))]
    for c in sorted(load[names[0]]):
        out.append("| %d | %s | %s |" % (c, " | ".join(fmt(load[n][c]["tok_s"]) if c in load[n] else "–" for n in names),
                                         " | ".join(fmt(load[n][c]["ttft_p50_ms"]) if c in load[n] else "–"
                                                    for n in names)))
    hits = ", ".join("%s %s → %s ms" % (label[n], fmt(s["prefix"]["ttft_miss_ms"]), fmt(s["prefix"]["ttft_hit_ms"]))
                     for n, s in d["servers"].items())
    out += ["", "A %d-token prefix shared with the previous request cuts the time to first token: %s." % (
        d["prefix"], hits)]
    validation = render_validation(d)
    if validation:
        out += ["", "Sessions per GiB at equal quality (goal: ≥ 6× llama.cpp's f16 at mean KLD ≤ %g%s; `HEADS` is the "
                "model's head table from `kvx calibrate-heads --method duo`): %s" % (
                    GOAL_KLD, " and retrieval indistinguishable from f16's" if d.get("retrieval") else "",
                    validation[-1])]
    return "\n".join(out) + "\n"


def rendered_docs():
    with open(RAW) as f:
        d = json.load(f)
    docs = {}
    for path, render in DOCS.items():
        text = open(path).read()
        section = render(d)
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
    ap.add_argument("--rounds", type=int, default=3, help="load: rounds of every scenario (medians shown)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--prefix-trials", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this")
    ap.add_argument("--load-only", action="store_true",
                    help="run kvx's load scenario at --clients only; print it with the step counters (no files)")
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build/kvx"), help="the kvx binary for --load-only")
    ap.add_argument("--temperature", type=float, default=0, help="the requests' temperature for --load-only")
    ap.add_argument("--only", help="comma-separated sections to measure (%s); the others are kept from the "
                    "saved data" % ",".join(SECTIONS))
    ap.add_argument("--kld-model", default=os.path.join(ROOT, "../shared/models/recall/recall-llama-8L-d512-f16.gguf"))
    ap.add_argument("--kld-text", default=os.path.join(ROOT, "../shared/golden/recall_val.txt"))
    ap.add_argument("--kld-chunks", type=int, default=2)
    ap.add_argument("--kld-heads", default=os.path.join(ROOT, "docs/results/head_typing/recall-duo.json"),
                    help="the kld model's head table for the head-typing specs (kvx calibrate-heads --method duo)")
    ap.add_argument("--kld-reuse", action="store_true", help="kld: read the eval report this script wrote "
                    "before (docs/results/serving/kld.eval.json, same specs and --kld-context) instead of running it")
    ap.add_argument("--retrieval-reuse", action="store_true", help="retrieval: read %s (written by the same "
                    "command) instead of running it" % os.path.relpath(RETRIEVAL_JSON, ROOT))
    ap.add_argument("--kld-threads", type=int, help="threads of the kld eval (default --threads; no timing is "
                    "taken there, so 1 thread wastes less on a loaded machine)")
    ap.add_argument("--kld-context", type=float, default=0.75,
                    help="the context's share of a 4096-token session / kld chunk (compressed once)")
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
        sections = args.only.split(",") if args.only else SECTIONS
        bad = [x for x in sections if x not in SECTIONS]
        if bad:
            sys.exit("--only: unknown section(s) %s; choose from %s" % (", ".join(bad), ",".join(SECTIONS)))
        measure(args, sections)
    for path, text in rendered_docs().items():
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
