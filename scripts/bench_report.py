#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md (and the README's speed section) from `kvx bench`
runs, the Google Benchmark microbenchmarks in bench/, and, when given, llama.cpp's
own benchmark tools on the same GGUF in the same run (side by side).

Usage: scripts/bench_report.py [--threads 2] [--llama-bin DIR] [--models DIR]
  --llama-bin DIR   a llama.cpp build's bin/ folder (llama-bench, llama-batched-bench);
                    kvx never builds or ships llama.cpp, it only runs what you point it at.
"""
import argparse, json, os, re, subprocess, sys, statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("command failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout

def kvx_bench(kvx, model, threads, kv, depths, out):
    run([kvx, "bench", "-m", model, "-t", str(threads), "--kv", kv, "--depths", depths, "-r", "3", "-n", "16",
         "--json", out])
    return json.load(open(out))

def llama_cpp(bin_dir, model, threads):
    """pp512 / tg32 at depth 0 (llama-bench) and tg32 after a 4096-token prompt (llama-batched-bench)."""
    out = run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(threads), "-p", "512", "-n", "32",
               "-r", "3", "-o", "json"])
    res = {}
    for row in json.loads(out):
        key = "prefill" if row["n_prompt"] > 0 else "decode0"
        res[key] = row["avg_ts"]
    out = run([os.path.join(bin_dir, "llama-batched-bench"), "-m", model, "-t", str(threads), "-c", "4224",
               "-b", "4096", "-ub", "512", "-npp", "4096", "-ntg", "32", "-npl", "1", "--output-format", "jsonl"])
    for line in out.splitlines():
        if line.startswith("{"):
            res["decode4096"] = json.loads(line)["speed_tg"]
    return res

def microbench(binary, bench_filter, out, target=None):
    """Runs a Google Benchmark binary of bench/ and returns its JSON benchmarks (medians of 3);
    `target` restricts the kernels to one SIMD target (KVX_BENCH_TARGET)."""
    env = dict(os.environ, KVX_BENCH_TARGET=target) if target else None
    run([binary, "--benchmark_filter=" + bench_filter, "--benchmark_repetitions=3",
         "--benchmark_report_aggregates_only=true", "--benchmark_format=json", "--benchmark_out=" + out,
         "--benchmark_out_format=json"], env=env)
    rows = json.load(open(out))["benchmarks"]
    return [b for b in rows if b.get("aggregate_name") == "median"]

def microbench_table(rows):
    """One generic table: time plus whichever rate counters the benchmark reports."""
    md = ["| benchmark | time | GB/s | GFLOP/s | tok/s |", "|---|---:|---:|---:|---:|"]
    for b in rows:
        name = b["run_name"]
        gbs = "%.1f" % (b["bytes_per_second"] / 1e9) if "bytes_per_second" in b else ""
        gfl = "%.1f" % (b["GFLOPS"]) if "GFLOPS" in b else ""
        toks = "%.1f" % b["tok/s"] if "tok/s" in b else ""
        md.append("| `%s` | %.3g %s | %s | %s | %s |" % (name, b["real_time"], b["time_unit"], gbs, gfl, toks))
    return md

def goals_table(r, ll):
    """The speed goals (smollm2-135m q8_0, f16 cache), measured in this run."""
    dec = {d["depth"]: d for d in r["decode"]}
    pf = r["prefill"]
    fma_pct = 100.0 * pf["gflops"] / r["peak_flops"]["gflops"]
    yes = lambda ok: "yes" if ok else "no"
    md = ["## Goals", "",
          "Measured in this run (f16 cache). Prefill's bound runs each kind of op at its own measured peak: the "
          "matmuls' int8 dot products (vpdpbusd) at the int8 peak, attention's f32 FMAs at the FMA peak. Prefill "
          "is also given against the int8 peak alone and the FMA peak alone.", "",
          "| goal | measured | met |", "|---|---|---|"]
    for depth, goal in [(0, 80.0), (8192, 70.0)]:
        if depth in dec:
            d = dec[depth]
            md.append("| decode at depth %d ≥ %.0f%% of the bandwidth bound | %.1f%% (%.1f of %.1f tok/s) | %s |" % (
                depth, goal, d["pct_of_bound"], d["tok_s"], d["bound_tok_s"], yes(d["pct_of_bound"] >= goal)))
    md.append("| prefill ≥ 50%% of the measured peak | %.1f%% of the bound (%.1f%% of the %s peak alone, %.1f%% of "
              "the FMA peak) | %s |" % (pf["pct_of_bound"], pf["pct_of_peak"], pf.get("peak_kind", "fma"), fma_pct,
                                        yes(pf["pct_of_bound"] >= 50.0)))
    if ll is not None:
        ours = {"prefill": pf["tok_s"], "decode0": dec[0]["tok_s"], "decode4096": dec[4096]["tok_s"]}
        for key, label in [("prefill", "prefill 512"), ("decode0", "decode at depth 0"), ("decode4096", "decode at depth 4096")]:
            ratio = ours[key] / ll[key]
            md.append("| kvx / llama.cpp, %s ≥ 1.0 | %.2f | %s |" % (label, ratio, yes(ratio >= 1.0)))
    return md + [""]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", default="")
    ap.add_argument("--models", default="/tmp/kvx-bench-models")
    args = ap.parse_args()
    kvx = os.path.join(ROOT, "build/kvx")
    os.makedirs(args.models, exist_ok=True)
    model = os.path.join(args.models, "smollm2-135m-q8_0.gguf")
    if not os.path.exists(model):
        run([kvx, "gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", model])
    depths = "0,1024,4096,8192"
    results = {kv: kvx_bench(kvx, model, args.threads, kv, depths, os.path.join(args.models, kv.replace("=", "_") + ".json"))
               for kv in ["codec=f16", "codec=f16,page=64", "codec=f32"]}
    # Each kvx bench run probes the bandwidth itself; on a shared VM that
    # reading drifts between runs (55-81 GB/s seen within an hour), which
    # would put rows of one table against different bounds (and some above
    # 100%). Every row's bound is the faster of its own run's re-read probe
    # at the row's bytes per token and the highest 256 MiB reading of the
    # report's runs: the machine's demonstrated bandwidth, the strictest bound.
    bw_run = max(results.values(), key=lambda r: r["bandwidth"]["read_gbps"])
    bw = bw_run["bandwidth"]["read_gbps"]
    for r in results.values():
        for d in r["decode"]:
            d["bound_gbps"] = max(d["bound_gbps"], bw)
            d["bound_tok_s"] = d["bound_gbps"] * 1e9 / d["bytes_per_token"]
            d["pct_of_bound"] = 100.0 * d["tok_s"] / d["bound_tok_s"]
    # Prefill likewise against the highest peaks the runs measured (FMA and
    # int8): a probe that caught the VM's second vCPU away once read half of
    # both peaks and put that run's prefill at 75.7% of "its" int8 peak. The
    # bound is recomputed as kvx bench computes it (eval/plan.h
    # PrefillBoundSeconds): matmul ops at the matmul peak, attention at FMA.
    best_fma = max(r["peak_flops"]["gflops"] for r in results.values())
    best_i8 = max(r.get("peak_int8", {"gops": 0.0})["gops"] for r in results.values())
    for r in results.values():
        pf = r["prefill"]
        matmul_peak = best_i8 if pf["peak_kind"] == "int8" else best_fma
        pf["bound_gops"] = (pf["matmul_ops"] + pf["attention_ops"]) / (
            pf["matmul_ops"] / matmul_peak + pf["attention_ops"] / best_fma)
        pf["pct_of_bound"] = 100.0 * pf["gflops"] / pf["bound_gops"]
        pf["pct_of_peak"] = 100.0 * pf["gflops"] / matmul_peak
        r["peak_flops"]["gflops"] = best_fma
        if "peak_int8" in r:
            r["peak_int8"]["gops"] = best_i8
    md = ["# Benchmarks", "",
          "Regenerated by `scripts/bench_report.py` (%d threads). Model: `kvx gen-model --shape smollm2-135m --type q8_0` "
          "(random weights, SmolLM2-135M's exact shape). Decode depth D = D cached tokens before the timed tokens. "
          "Medians of 3 repetitions; the bound is a read bandwidth divided by the bytes each decoded token "
          "reads (weights + the whole KV cache). That bandwidth is the faster of two probes: re-reading a buffer of the "
          "row's bytes per token (what the caches keep of it between tokens counts, as it does for decode), and the "
          "highest 256 MiB reading any of the report's `kvx bench` runs measured (each run probes it; on a shared VM "
          "the reading drifts between runs)." % args.threads, ""]
    r0 = results["codec=f16"]
    i8 = r0.get("peak_int8", {"gops": 0, "isa": "none"})
    md += ["Machine: read bandwidth %.1f GB/s (triad %.1f GB/s; the highest of the runs), peak %.1f GFLOP/s (%s FMA), "
           "%.1f int8 GOP/s (%s); both peaks the highest of the runs, %d threads. A multiply-add counts 2 ops. "
           "Prefill's bound runs each kind of op at its own peak (`eval/plan.h`): the matmuls at the int8 peak on "
           "quantized weights (int8 dot products) or the FMA peak on float weights, attention (QK^T and PV, f32 "
           "FMAs on every KV codec) at the FMA peak; the stricter figure against the matmul peak alone is beside it." % (
        bw, bw_run["bandwidth"]["triad_gbps"], r0["peak_flops"]["gflops"], r0["peak_flops"]["isa"],
        i8["gops"], i8["isa"], r0["threads"]), ""]
    md += ["| KV | prefill tok/s | G ops/s | attention share of the ops | bound G ops/s | % of bound | "
           "% of the matmul peak alone | matmul peak |", "|---|---|---|---|---|---|---|---|"]
    for kv, r in results.items():
        pf = r["prefill"]
        md.append("| %s | %.1f | %.1f | %.1f%% | %.1f | %.1f%% | %.1f%% | %s |" % (
            kv, pf["tok_s"], pf["gflops"], 100.0 * pf["attention_ops"] / (pf["matmul_ops"] + pf["attention_ops"]),
            pf["bound_gops"], pf["pct_of_bound"], pf["pct_of_peak"], pf["peak_kind"]))
    md += ["", "| KV | depth | decode tok/s | KV MiB | bound GB/s | bound tok/s | % of bound |",
           "|---|---|---|---|---|---|---|"]
    for kv, r in results.items():
        for d in r["decode"]:
            md.append("| %s | %d | %.1f | %.2f | %.1f | %.1f | %.1f%% |" % (
                kv, d["depth"], d["tok_s"], d["kv_bytes"] / 2**20, d["bound_gbps"], d["bound_tok_s"],
                d["pct_of_bound"]))
    md += ["", "Peak RSS (f16 run): %.1f MiB." % (r0["peak_rss_bytes"] / 2**20), ""]
    ll = None
    if args.llama_bin:
        ll = llama_cpp(args.llama_bin, model, args.threads)
        ours = {"prefill": r0["prefill"]["tok_s"],
                "decode0": next(d["tok_s"] for d in r0["decode"] if d["depth"] == 0),
                "decode4096": next(d["tok_s"] for d in r0["decode"] if d["depth"] == 4096)}
        md += ["## Side by side with llama.cpp", "",
               "Same GGUF, same run, %d threads, f16 KV cache on both sides. llama.cpp: `llama-bench -p 512 -n 32` "
               "(prefill, decode at depth 0) and `llama-batched-bench -npp 4096 -ntg 32 -npl 1` (decode after 4096 "
               "tokens)." % args.threads, "",
               "| measure | kvx tok/s | llama.cpp tok/s | kvx / llama.cpp |", "|---|---|---|---|"]
        for key, label in [("prefill", "prefill 512"), ("decode0", "decode, depth 0"), ("decode4096", "decode, depth 4096")]:
            md.append("| %s | %.1f | %.1f | %.2f |" % (label, ours[key], ll[key], ours[key] / ll[key]))
        md.append("")
    md += goals_table(r0, ll)
    readme_md = list(md)
    # Kernel microbenchmarks (bench/): weight streaming and GEMMs per type,
    # memory probes, and decode attention per KV codec.
    ops = microbench(os.path.join(ROOT, "build/ops_bench"),
                     "DecodeSweep|PrefillGemm|MemRead|MemTriad|PeakFma|MatMul/q8_0|MatMul/q4_K|BM_",
                     os.path.join(args.models, "ops_bench.json"))
    kvb = microbench(os.path.join(ROOT, "build/kv_bench"), "ctx:8192|tokens:512/|F16DecodeKernel", os.path.join(args.models, "kv_bench.json"))
    md += ["## Kernel microbenchmarks", "",
           "`build/ops_bench` and `build/kv_bench` (Google Benchmark, medians of 3; see the comments at the top of "
           "`bench/ops_bench.cc` and `bench/kv_bench.cc` for what each measures). DecodeSweep streams every weight "
           "matrix of the smollm2-135m stack once, as one decoded token does; its GB/s is to be compared with "
           "MemRead; `q8_0_repacked` is the same with the matrices repacked as the model loader stores them on "
           "AVX-512 VNNI and AVX2 machines (groups of 16 rows interleaved 4 bytes at a time, so that one vpdpbusd serves 16 rows "
           "(two pmaddubsw halves on AVX2) and each 32-block is summed in int32; one aligned stream; all matrices in one buffer on transparent huge pages; "
           "`src/ops/weight_pack.h`). DecodeAttentionAllLayers reads a whole smollm2-135m-shaped KV cache of 8k tokens from DRAM; "
           "DecodeAttention one layer's, from cache. f16 pages go through the fused decode kernel (channel-major keys, "
           "scores + online softmax + values per 16 entries in registers, the page two ahead prefetched across the score "
           "steps, one call per run of pages: `F16Codec::AttendRun`); KIVI scores its channel-major key codes 16 entries per vector (`ChannelTensor::Dot`); the per-token codecs (int8/int4) use the general row-major kernels. "
           "PrefillAttention is a 512-token prompt's causal attention over itself (one smollm2-135m layer, every "
           "query at once; GFLOPS counts 4 head_dim flops per visible query-key pair); on f16 pages its blocks of 8 "
           "query rows take the prompt kernel (two 16-entry blocks per step, `simd_avx512_prompt.h`). "
           "F16DecodeKernel is the fused "
           "f16 kernel alone over one contiguous run of pages per thread (46080 pages: the bytes of the 8k cache); "
           "set against DecodeAttentionAllLayers/f16/ctx:8192 at the same thread count, the difference is what "
           "attention spends outside the kernel (page tables, work items, merges, thread sync, page placement).", ""]
    md += microbench_table(ops) + [""] + microbench_table(kvb) + [""]
    # The same weight streaming and GEMMs on the AVX2 kernels (what a machine
    # without AVX-512 runs), Q8_0 in GGUF rows and repacked.
    avx2 = microbench(os.path.join(ROOT, "build/ops_bench"), "DecodeSweep/q8_0|PrefillGemm/q8_0",
                      os.path.join(args.models, "ops_bench_avx2.json"), target="AVX2")
    md += ["### AVX2 kernels", "",
           "`KVX_BENCH_TARGET=AVX2 build/ops_bench` on the same machine: the kernels a CPU without AVX-512 runs. "
           "Q8_0 in GGUF rows sums 4 products per 32-bit lane with pmaddubsw + pmaddwd and spends a conversion, "
           "a multiply and an fma on each lane sum; repacked (as the loader stores Q8_0 on AVX2 machines too) each "
           "32-block is summed in int32 first, and decode reads one aligned stream.", ""]
    md += microbench_table(avx2) + [""]
    # AVX-VNNI (Alder Lake and later Intel cores, Zen 5) gives the AVX2
    # target's repacked Q8_0 kernel one vpdpbusd per 8 lanes.
    if "avx_vnni" in open("/proc/cpuinfo").read():
        vnni = microbench(os.path.join(ROOT, "build/ops_bench"), "DecodeSweep/q8_0_repacked|PrefillGemm/q8_0_repacked",
                          os.path.join(args.models, "ops_bench_avx2_vnni.json"), target="AVX2_VNNI")
        md += ["`KVX_BENCH_TARGET=AVX2_VNNI`: the same AVX2 kernels on a CPU with AVX-VNNI; the repacked Q8_0 kernel "
               "sums each block with one 256-bit vpdpbusd per half and step instead of the pmaddubsw sequence "
               "(bit-identical outputs).", ""]
        md += microbench_table(vnni) + [""]
    text = "\n".join(md) + "\n"
    open(os.path.join(ROOT, "docs/benchmarks.md"), "w").write(text)
    readme = os.path.join(ROOT, "README.md")
    s = open(readme).read()
    body = "\n".join(readme_md[2:]) + "\n"
    s = re.sub(r"(<!-- bench:begin -->\n).*?(<!-- bench:end -->)", lambda m: m.group(1) + body + m.group(2), s, flags=re.S)
    open(readme, "w").write(s)
    print(text)

if __name__ == "__main__":
    main()
