#!/usr/bin/env python3
"""The server's time to first token with chunk reuse (docs/kv-reuse.md): starts `kvx serve` on the recall model
and sends RAG prompts built as `kvx eval --tasks rag` builds them (Paul Graham essay sentences in documents of about
256 tokens, an instruction, the documents shuffled per question, one holding the pass key, the question last) as
`/v1/completions` requests with `"chunks"` (the instruction and each document a chunk, the question the prompt),
once per repair, and the same text as one plain prompt with `"cache": "none"` (the miss: a full prefill, no prefix
cache). Every document was sent once before the questions, so the chunk cache holds them all. TTFT is measured on
the streamed response: from sending the request to the first token's event. Prints a Markdown table (median TTFT
per repair and its ratio to the miss's, accuracy, the usage's chunk tokens from the cache and recomputed), writes
each request's result to --out as it goes, and with --write splices the table into docs/kv-reuse.md between
<!-- rag-server:begin --> and <!-- rag-server:end --> and a line into README.md (<!-- rag-server-line -->).

  nice -n 5 scripts/kv_reuse_server.py --sizes 2048 4096 7168 --questions 5 --write
"""
import argparse, glob, http.client, json, os, random, re, statistics, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reportlib import ROOT, Output  # noqa: E402

INSTRUCTION = " A pass key is hidden in one of the documents below. Find it and remember it, I will ask you about it.\n"
QUESTION = "\nWhat is the pass key? The pass key is"
REPAIRS = ["none", "epic,k=16", "blend,r=0.05,k=16", "blend,r=0.15", "full"]
WORDS = 160  # per document: about 256 tokens of the recall model (1.6 tokens per word of these essays)


def sentences(data):
    text = " ".join(open(p).read() for p in sorted(glob.glob(os.path.join(data, "paul_graham_essays", "*.txt")))
                    if "LICENSE" not in p)
    return [s for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)) if s]


def document(sents, rng, words, value=None, split=False):
    """Whole sentences from a random start, at most `words` words (at least one sentence); with `value` the
    needle at a random sentence: one text, or with `split` two cut inside the needle ("... The pass key is" |
    " N. Remember it. ...")."""
    at, out = rng.randrange(len(sents)), []
    while not out or sum(len(s.split()) for s in out) + len(sents[at].split()) <= words:
        out.append(sents[at])
        at = (at + 1) % len(sents)
    if value is None:
        return ["".join(" " + s for s in out)]  # a document starts with the space that separates it
    cut = "\x01"
    needle = ("The pass key is%s %s. Remember it." % (cut, value) if split
              else "The pass key is %s. Remember it. %s is the pass key." % (value, value))
    out.insert(rng.randrange(len(out) + 1), needle)
    return "".join(" " + s for s in out).split(cut)


def post(port, body):
    """Streams one completion: (ttft seconds, text, usage)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = dict(body, stream=True, stream_options={"include_usage": True}, max_tokens=8, temperature=0)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit("kvx serve answered %d: %s" % (resp.status, resp.read()[:500]))
    ttft, text, usage = None, "", {}
    for line in resp:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            if ttft is None:
                ttft = time.perf_counter() - t0
            text += choice.get("text", "")
        usage = event.get("usage") or usage
    conn.close()
    return ttft, text, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvx", default=os.path.join(ROOT, "build", "kvx"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "recall",
                                                   "recall-llama-8L-d512-f16.gguf"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 7168], help="tokens of documents (about)")
    ap.add_argument("--questions", type=int, default=5)
    ap.add_argument("--needle", choices=["whole", "split"], default="split")
    ap.add_argument("--repairs", nargs="+", default=REPAIRS)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kvx-rag-server.jsonl"))
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--write", action="store_true", help="splice the table into docs/kv-reuse.md and README.md")
    ap.add_argument("--render", metavar="JSONL", help="render the table from a run's --out file (nothing run)")
    args = ap.parse_args()
    if not args.render:
        measure(args)
    render(args, [json.loads(line) for line in open(args.render or args.out)])


def measure(args):
    """Runs the server and every request, each result a line of args.out."""
    sents, rng = sentences(args.data), random.Random(args.seed)
    server = subprocess.Popen([args.kvx, "serve", "-m", args.model, "--kv", "codec=f16", "-c", "8192", "-t", "2",
                               "--port", "0", "--max-seqs", "2", "--chunk-cache-bytes", "2G"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = open(args.out, "w")
    try:
        listening = None
        for line in server.stderr:  # the port it picked (--port 0)
            listening = re.search(r"listening on http://[0-9.]+:(\d+)", line)
            if listening:
                break
        if not listening:
            sys.exit("kvx serve did not start")
        port = int(listening.group(1))
        threading.Thread(target=server.stderr.read, daemon=True).start()  # drained, so it never blocks
        for size in args.sizes:
            n_docs = max(2, size // 256)
            plain = [document(sents, rng, WORDS)[0] for _ in range(n_docs - 1)]
            for q in range(args.questions):
                value = str(1 + rng.randrange(50000))
                docs = [[d] for d in plain] + [document(sents, rng, WORDS, value, args.needle == "split")]
                rng.shuffle(docs)
                chunks = [INSTRUCTION] + [part for d in docs for part in d]
                if q == 0:
                    for d in plain:  # every shared document seen once before (the eval's warm-up)
                        post(port, {"chunks": [INSTRUCTION, d], "prompt": QUESTION, "chunk_repair": "none"})
                post(port, {"chunks": chunks, "prompt": QUESTION, "chunk_repair": "none"})  # this question's document
                for repair in ["miss"] + args.repairs:
                    body = ({"prompt": "".join(chunks)[1:] + QUESTION, "cache": "none"} if repair == "miss"
                            else {"chunks": chunks, "prompt": QUESTION, "chunk_repair": repair})
                    ttft, text, usage = post(port, body)
                    details = usage.get("prompt_tokens_details", {})
                    result = {"size": size, "question": q, "repair": repair, "ttft_s": ttft, "hit": value in text,
                              "prompt_tokens": usage.get("prompt_tokens"),
                              "chunk_tokens": details.get("chunk_tokens", 0),
                              "chunk_cache_tokens": details.get("chunk_cache_tokens", 0),
                              "chunk_recomputed_tokens": details.get("chunk_recomputed_tokens", 0)}
                    log.write(json.dumps(result) + "\n")
                    log.flush()
                    print(json.dumps(result), file=sys.stderr)
    finally:
        server.terminate()
        server.wait()


def render(args, results):
    """The table of the results (per size and request: median TTFT, its ratio to the miss's)."""
    rows, last = [], []
    for size in sorted({r["size"] for r in results}):
        of_size = [r for r in results if r["size"] == size]
        tokens = max(r["prompt_tokens"] or 0 for r in of_size)
        miss = statistics.median(r["ttft_s"] for r in of_size if r["repair"] == "miss")
        last = []
        for repair in dict.fromkeys(r["repair"] for r in of_size):
            rs = [r for r in of_size if r["repair"] == repair]
            ttft = statistics.median(r["ttft_s"] for r in rs)
            chunk = sum(r["chunk_tokens"] for r in rs) or 1
            rows.append("| %d | %s | %d/%d | %.0f | %.2f | %.2f | %.3f |" % (
                tokens, "plain prompt (miss)" if repair == "miss" else repair, sum(r["hit"] for r in rs), len(rs),
                ttft * 1000, ttft / miss, sum(r["chunk_cache_tokens"] for r in rs) / chunk,
                sum(r["chunk_recomputed_tokens"] for r in rs) / chunk))
            last.append((tokens, repair, ttft / miss))
    sizes = sorted({r["size"] for r in results})
    questions = len({(r["size"], r["question"]) for r in results}) // max(1, len(sizes))
    cmd = ("`nice -n 5 scripts/kv_reuse_server.py --sizes %s --questions %d --needle %s --write` (the machine loaded "
           "by parallel builds: ratios within one run)" % (" ".join(map(str, sizes)), questions, args.needle))
    table = (cmd + "\n\n| prompt tokens | request | accuracy | TTFT ms (median) | TTFT / miss | chunk tokens from "
             "the cache | recomputed |\n|---:|---|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n")
    print(table)
    if args.write:
        out = Output(check=False)
        path = os.path.join(ROOT, "docs", "kv-reuse.md")
        page = open(path).read()
        page, n = re.subn(r"<!-- rag-server:begin -->.*?<!-- rag-server:end -->",
                          lambda m: "<!-- rag-server:begin -->\n" + table + "<!-- rag-server:end -->", page, flags=re.S)
        if n != 1:
            sys.exit("docs/kv-reuse.md has no rag-server markers")
        out.write("docs/kv-reuse.md", page)
        say = "; ".join("`%s` %.2fx" % (repair, ratio) for _, repair, ratio in last if repair != "miss")
        out.readme_block("rag-server-line", "Chunk reuse through `kvx serve`, %d prompt tokens (recall model, "
                         "`scripts/kv_reuse_server.py`): time to first token against the plain prompt's: %s." %
                         (last[0][0], say))


if __name__ == "__main__":
    main()
