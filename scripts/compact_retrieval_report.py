#!/usr/bin/env python3
"""Retrieval through the `compact` storage level (docs/tiers.md#measurements): reads the --json reports of
`kvx eval --storage-codec compact` runs (baseline first, the compact spec second) and prints
  * for passkey reports: a Markdown table of hits with the Wilson 95% intervals and the exact McNemar test
    the reports carry (same prompts, baseline vs compact);
  * for needle reports (ROUGE-1 F1; the recall model's answers never reach recall 1, so hits say nothing):
    each side's mean score with the report's bootstrap interval, and the paired difference over the same
    prompts with a paired bootstrap 95% interval (10 000 resamples, seed 1) and a sign test.
  * with --probes: one Markdown row per needle report of a rate probe (`kvx eval --storage-rates R`; the
    report's file name ends in -R.json, e.g. needle-2048-0.25,0.75,1.75,3.5.json): its rates, bytes vs f16,
    both means and the paired difference with its bootstrap interval and sign test.
The kvx eval commands are in docs/tiers.md.

  scripts/compact_retrieval_report.py --passkey p2048.json p4096.json --needle n2048.json n1536.json
"""
import argparse, json, math, random


def load(path, task):
    results = json.load(open(path))["results"]
    base, spec = results[0], results[1]
    if not spec.get(task, {}).get("ok"):
        raise SystemExit("kvx: error: %s: the compact run of %s did not finish (%s)" %
                         (path, task, spec.get(task, {}).get("error")))
    return base, spec


def task_pair(path, task):
    """The baseline's and the compact spec's results of `task` in a report, and its lengths as text."""
    base, spec = load(path, task)
    return base, base[task], spec[task], ",".join(map(str, json.load(open(path))["settings"][task]["lengths"]))


def rate(r):
    lo, hi = r["accuracy_ci95"]
    return "%d/%d = %.0f%% [%.0f, %.0f]" % (r["hits"], r["n"], 100 * r["accuracy"], 100 * lo, 100 * hi)


def passkey_row(path):
    base, b, s, length = task_pair(path, "passkey")
    v = s["vs_baseline"]
    return "| %s tokens | `%s` | %s | %s | %.1f× | %d / %d | %.3g (%s) |" % (
        length, base["spec"], rate(b), rate(s), s["kv"]["compression_vs_f16"], v["baseline_only"], v["spec_only"],
        v["p"], v["verdict"])


def paired(diffs):
    """The mean difference, its paired bootstrap 95% interval, the counts lower / higher / equal, sign test p."""
    rng = random.Random(1)
    means = sorted(sum(diffs[rng.randrange(len(diffs))] for _ in diffs) / len(diffs) for _ in range(10000))
    pos, neg = sum(x > 1e-9 for x in diffs), sum(x < -1e-9 for x in diffs)
    n, k = pos + neg, min(pos, neg)
    sign_p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return sum(diffs) / len(diffs), means[250], means[9749], pos, neg, len(diffs) - n, sign_p


def probe_row(path):
    _, b, s, length = task_pair(path, "needle")
    rates = path.rsplit("/", 1)[-1][:-len(".json")].split("-")[-1]
    mean, lo, hi, pos, neg, eq, p = paired([x["score"] - y["score"] for x, y in zip(b["prompts"], s["prompts"])])
    return "| %s | %s | %.2f× | %.3f | %.3f | %.3f [%.3f, %.3f] | %d / %d / %d | %.2g |" % (
        rates, length, s["kv"]["compression_vs_f16"], b["score"], s["score"], mean, lo, hi, pos, neg, eq, p)


TABLES = {  # the rows of each kind of report: (header, one row of a report)
    "passkey": ("| passkey | baseline | baseline hits [Wilson 95%] | `compact` hits [Wilson 95%] | compact vs f16 "
                "(bytes) | only baseline / only compact | exact McNemar p |\n|---|---|---|---|---:|---|---|", passkey_row),
    "probes": ("| rates (K early, V early, K late, V late) | tokens | vs f16 (bytes) | f16 | `compact` "
               "| f16 − compact [paired bootstrap 95%] | lower / higher / equal | sign test p |\n"
               "|---|---:|---:|---:|---:|---|---|---:|", probe_row),
}


def table(kind, paths):
    header, row = TABLES[kind]
    print(header)
    for path in paths:
        print(row(path))


def needle_stats(paths):
    diffs, lines = [], []
    for path in paths:
        base, spec = load(path, "needle")
        b, s = base["needle"], spec["needle"]
        d = [x["score"] - y["score"] for x, y in zip(b["prompts"], s["prompts"])]
        diffs += d
        lines.append("%s: n = %d, baseline `%s` %.3f [%.2f, %.2f], compact %.3f [%.2f, %.2f] (%.1f× smaller than f16)" %
                     (path, len(d), base["spec"], b["score"], *b["score_ci95"], s["score"], *s["score_ci95"],
                      s["kv"]["compression_vs_f16"]))
    for line in lines:
        print(line)
    print("paired, all %d prompts: baseline - compact = %.3f, paired bootstrap 95%% [%.3f, %.3f]; compact lower on %d, "
          "higher on %d, equal on %d; sign test p = %.3g" % (len(diffs), *paired(diffs)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passkey", nargs="*", default=[])
    ap.add_argument("--needle", nargs="*", default=[])
    ap.add_argument("--probes", nargs="*", default=[])
    args = ap.parse_args()
    if args.passkey:
        table("passkey", args.passkey)
    if args.needle:
        needle_stats(args.needle)
    if args.probes:
        table("probes", args.probes)


if __name__ == "__main__":
    main()
