#!/usr/bin/env python3
"""The KV eviction report's documents (docs/kv-eviction.md, its SVGs, README's kv-eviction block), rendered from
docs/results/eviction/ alone: tables with Wilson intervals, McNemar verdicts against the full cache and between
methods, the long-context KLD table, the Pareto charts, the papers' variants, decode speed and what is not
measured yet. The methods, the plan of runs and the results reader live in eviction_report.py (the command).
"""
import argparse, glob, json, os, statistics

from eviction_report import (FLOOR_RATE, KLD_CONTEXTS, KLD_SCORED, KLD_TEXT, METHODS, PAPER_CONTEXT, PAPER_LENGTH,
                             PAPER_RATIO, PAPER_VARIANTS, RATIOS, RESULTS, SPEED, SWEEP_LENGTHS, SWEEP_PROMPTS,
                             finished_specs, floors, kld_runs, load, sweep_path, sweep_runs)
from reportlib import ROOT, holm, mcnemar_p, paired, wilson

DOC = "docs/kv-eviction.md"
# Hand-written text per method (its deviations from the paper, investigations), spliced into its section
# after the paper/kvx lines: docs/kv-eviction-notes/<method>.md.
NOTES = os.path.join(ROOT, "docs/kv-eviction-notes")
# "Equal quality" to the full cache: mean KLD within the serving capacity goal's bound (serving_report.GOAL_KLD)
# and retrieval not worse (issue 37).
EQUAL_KLD = 0.01


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return None if not n else xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def speed_section():
    if not os.path.exists(SPEED):
        return ["## Decode speed and memory with a policy", "", "Not measured yet: "
                "`scripts/eviction_report.py --speed --llama-bin <llama.cpp>/build/bin`.", ""]
    d = json.load(open(SPEED))
    mib = 1024.0 * 1024.0
    f16 = median([r["tok_s"] for r in d["kvx"].get("codec=f16", [])]) or 0
    lines = ["## Decode speed and memory with a policy", "",
             "`scripts/eviction_report.py --speed` on %s (%s), %s threads, %d-token context, %d rounds (every "
             "configuration once per round; medians, min–max in brackets). kvx: `kvx bench --depths %d -n 32`; a spec "
             "with a policy fills the context with a real forward pass, compresses once, then decodes over what "
             "was kept. KV MiB is the pool's bytes in use during the decode, RSS the whole process's resident set "
             "then (weights included). llama.cpp: `llama-batched-bench -npp %d -ntg 32` (`-fa`: flash attention, "
             "which llama.cpp needs to quantize V), same GGUF. Measured %s on a shared 2-core VM." % (
                 d["model"], "same GGUF for both", d["threads"], d["depth"],
                 max(len(runs) for runs in d["kvx"].values()), d["depth"], d["depth"],
                 d["generated"]), "",
             "| engine | KV | decode tok/s | vs kvx f16 | KV MiB | RSS MiB |", "|---|---|---:|---:|---:|---:|"]
    for spec, runs in d["kvx"].items():
        if not runs:
            continue
        t = [r["tok_s"] for r in runs]
        lines.append("| kvx | `%s` | %.1f (%.1f–%.1f) | %.2f× | %.1f | %.0f |" % (
            spec, median(t), min(t), max(t), median(t) / f16 if f16 else 0,
            median([r["kv_bytes"] for r in runs]) / mib, median([r["rss_bytes"] for r in runs]) / mib))
    for t, runs in d.get("llama_cpp", {}).items():
        if not runs:
            continue
        v = [r["tok_s"] for r in runs]
        # runs measured before the f16 -fa row name the quantized types bare (they always ran with -fa)
        label = t if " " in t or t == "f16" else t + " -fa"
        lines.append("| llama.cpp | `-ctk/-ctv %s` | %.1f (%.1f–%.1f) | %.2f× | – | – |" % (
            label, median(v), min(v), max(v), median(v) / f16 if f16 else 0))
    return lines + [""]


def paper_section():
    """Per variant: passkey (rate, Wilson interval, exact McNemar of the pair) and KLD (mean ± standard error, and
    whether the difference exceeds 1.96 combined standard errors), kvx's version beside the paper's."""
    def results(kind, n):
        path = sweep_path(kind, n, [PAPER_RATIO], "paper")
        try:
            return {s["spec"]: s for s in json.load(open(path)).get("results", []) if s.get("done")}
        except (OSError, ValueError):
            return {}
    pk, kl = results("passkey", PAPER_LENGTH), results("kld", PAPER_CONTEXT)
    lines = ["## The papers' versions as options", "",
             "`scripts/eviction_report.py --paper`: kvx's version of a method and the paper's (an option of the same "
             "policy) in one run, ratio %g; passkey at %d tokens (%d prompts, the sweep's prompts; exact McNemar on "
             "the pairs, ▲/▼ the paper's version better/worse, = indistinguishable at 0.05) and KLD at %d tokens of "
             "context (mean ± standard error over the scored tokens; ▲/▼ when the difference exceeds 1.96 combined "
             "standard errors); bytes: the KLD run's peak pool bytes plus what the method keeps beside the pool, "
             "over the full f16 cache's." % (PAPER_RATIO, PAPER_LENGTH, SWEEP_PROMPTS, PAPER_CONTEXT), "",
             "| method | the paper's version | passkey kvx | passkey paper | p | KLD kvx | KLD paper | bytes vs f16 "
             "(kvx / paper) |", "|---|---|---:|---:|---|---:|---:|---:|"]
    peak = lambda spec: kl.get(spec, {}).get("ppl", {}).get("kv", {}).get("peak_bytes")
    for m, (what, kvx, paper) in PAPER_VARIANTS.items():
        a, b = pk.get(kvx(PAPER_RATIO, PAPER_LENGTH), {}).get("passkey"), \
            pk.get(paper(PAPER_RATIO, PAPER_LENGTH), {}).get("passkey")
        if a and b:
            cell = lambda t: fmt_rate({"hits": t["hits"], "n": t["n"]})
            ob, op, _ = paired({p["id"]: p["hit"] for p in a["prompts"]}, {p["id"]: p["hit"] for p in b["prompts"]})
            pv = mcnemar_p(ob, op)
            pass_cells = [cell(a), cell(b), "%.2g %s" % (pv, MARK["indistinguishable" if pv >= 0.05 else
                                                                     "better" if op > ob else "worse"])]
        else:
            pass_cells = ["–", "–", "–"]
        ka, kb = kl.get(kvx(PAPER_RATIO, PAPER_CONTEXT), {}).get("kld"), \
            kl.get(paper(PAPER_RATIO, PAPER_CONTEXT), {}).get("kld")
        if ka and kb:
            z = (kb["mean"] - ka["mean"]) / max(1e-12, (ka["mean_stderr"] ** 2 + kb["mean_stderr"] ** 2) ** 0.5)
            mark = MARK["indistinguishable" if abs(z) < 1.96 else "worse" if z > 0 else "better"]
            kld_cells = ["%.4f ± %.4f" % (ka["mean"], ka["mean_stderr"]),
                         "%.4f ± %.4f %s" % (kb["mean"], kb["mean_stderr"], mark)]
        else:
            kld_cells = ["–", "–"]
        f16, pa, pb = peak("codec=f16"), peak(kvx(PAPER_RATIO, PAPER_CONTEXT)), peak(paper(PAPER_RATIO, PAPER_CONTEXT))
        kld_cells.append("%s / %s" % (fmt(pa / f16), fmt(pb / f16)) if f16 and pa and pb else "–")
        lines.append("| %s | %s | %s |" % (m, what, " | ".join(pass_cells + kld_cells)))
    lines += ["", "Specs (kvx's, then the paper's): " + "; ".join(
        "`%s` vs `%s`" % (kvx(PAPER_RATIO, PAPER_LENGTH), paper(PAPER_RATIO, PAPER_LENGTH))
        for _, kvx, paper in PAPER_VARIANTS.values()) + ".", ""]
    return lines


def bytes_fraction(data, cell, key):
    base = data["f16_bytes"].get(key)
    return cell["peak"] / base if base and cell.get("peak") else None


def verdicts(data):
    """{(method, ratio, length): (p, verdict vs the full f16 cache)}: exact McNemar on the same prompts, Holm's
    correction over every comparison at one length (the family of one table)."""
    out = {}
    for n, base in data["base"].items():
        keys = [k for k in data["passkey"] if k[2] == n]
        tests = []
        for k in keys:
            only_base, only_spec, _ = paired(base["prompts"], data["passkey"][k]["prompts"])
            tests.append((k, only_base, only_spec, mcnemar_p(only_base, only_spec)))
        for (k, ob, os_, p), sig in zip(tests, holm([t[3] for t in tests])):
            out[k] = (p, ("worse" if ob > os_ else "better") if sig else "indistinguishable")
    return out


def best_groups(data):
    """{(ratio, length): (best method, {method: indistinguishable from it})}: the method with the most hits at
    a ratio and length, and which others an exact McNemar against it (Holm over the table's methods) cannot
    tell apart from it."""
    out = {}
    for ratio, n in {(k[1], k[2]) for k in data["passkey"] if k[1] > 0}:
        cells = {m: c for (m, r, nn), c in data["passkey"].items() if r == ratio and nn == n}
        best = max(sorted(cells), key=lambda m: cells[m]["hits"] / cells[m]["n"])
        others = [m for m in sorted(cells) if m != best]
        ps = []
        for m in others:
            a, b, _ = paired(cells[best]["prompts"], cells[m]["prompts"])
            ps.append(mcnemar_p(a, b))
        same = {m: not sig for m, sig in zip(others, holm(ps))}
        same[best] = True
        out[(ratio, n)] = (best, same)
    return out


def pairwise(data, ratio, n):
    """[(method, cell, [methods indistinguishable from it])] at one ratio and length, by rate: exact McNemar on
    the same prompts for every pair, Holm's correction over all pairs (the family is the whole matrix)."""
    cells = {m: c for (m, r, nn), c in data["passkey"].items() if r == ratio and nn == n}
    order = sorted(cells, key=lambda m: (-cells[m]["hits"] / cells[m]["n"], m))
    pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]
    ps = [mcnemar_p(*paired(cells[a]["prompts"], cells[b]["prompts"])[:2]) for a, b in pairs]
    same = {m: [] for m in order}
    for (a, b), sig in zip(pairs, holm(ps)):
        if not sig:
            same[a].append(b)
            same[b].append(a)
    return [(m, cells[m], sorted(same[m], key=order.index)) for m in order]


def pairwise_section(data, n):
    """The between-methods matrix at length n, one table per ratio. Methods that no test separates from each
    other and that share the same further partners form one row (a clique of the matrix), listed by rate."""
    lines = ["## Between methods at %d tokens" % n, "",
             "Every pair of methods at one ratio, compared prompt by prompt: exact McNemar test, Holm's correction "
             "over all pairs of that ratio (the family is the whole matrix, so this is stricter than the ★ above, "
             "which tests each method against the best only). A row is a group of methods no test tells apart and "
             "which are indistinguishable from the same others (last column); every pair not listed so differs, in "
             "the direction of the rates (on the same prompts, a higher rate is more prompts only that method "
             "retrieves). Cells: passkey rate [Wilson 95%] (bytes vs f16).", ""]
    for ratio in RATIOS:
        rows = pairwise(data, ratio, n)
        if not rows:
            continue
        groups = []  # [[closed set, [(method, cell)]]], consecutive by rate
        for m, c, same in rows:
            closed = frozenset(same) | {m}
            if groups and groups[-1][0] == closed:
                groups[-1][1].append((m, c))
            else:
                groups.append([closed, [(m, c)]])
        lines += ["### Ratio %g" % ratio, "", "| methods | indistinguishable also from |", "|---|---|"]
        for closed, members in groups:
            names = {m for m, _ in members}
            lines.append("| %s | %s |" % ("; ".join("%s %s (%s)" % (m, fmt_rate(c).rsplit(" n=", 1)[0],
                                                                   fmt(bytes_fraction(data, c, n)))
                                                   for m, c in members),
                                         ", ".join(m for m, _, _ in rows if m in closed - names) or "none"))
        lines.append("")
    return lines


def fmt(x, pct=True):
    if x is None:
        return "–"
    return "%.0f%%" % (100 * x) if pct else "%.2f" % x


def fmt_rate(cell):
    """'72% [58–83] n=50'"""
    lo, hi = wilson(cell["hits"], cell["n"])
    return "%.0f%% [%.0f–%.0f] n=%d" % (100.0 * cell["hits"] / cell["n"], 100 * lo, 100 * hi, cell["n"])


MARK = {"worse": "▼", "better": "▲", "indistinguishable": "="}


def fmt_kld(cell):
    return "–" if cell is None else "%.4f ± %.4f" % (cell["mean"], cell["stderr"])


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#000000", "#aa3377", "#66ccee", "#228833", "#ccbb44", "#ee6677", "#4477aa", "#994455",
          "#997700", "#6699cc", "#332288", "#88ccee", "#44aa99", "#117733", "#999933"]


def svg_frame(title, W, H, L, B, x, y, xticks, xlabel):
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (W, H), '<text x="%d" y="16" font-size="13">%s</text>' % (L, title)]
    for t in [0, 0.25, 0.5, 0.75, 1.0]:
        out.append('<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>' % (L, y(t), x(xticks[-1]), y(t)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%d%%</text>' % (L - 4, y(t) + 4, 100 * t))
    for r in xticks:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x(r), H - B + 14, r))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x(xticks[-1] / 2), H - 6, xlabel))
    return out


def error_bar(x, y, lo, hi, color):
    return '<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1"/>' % (x, y(lo), x, y(hi), color)


def svg_curves(title, series):
    """passkey rate vs ratio, one polyline per method, Wilson 95% error bars: series = {method: [(ratio,
    cell)]}; methods are offset a little along x so that their bars do not hide each other."""
    W, H, L, B, R = 620, 340, 50, 40, 170
    ratios = [0] + RATIOS
    x = lambda r: L + r * (W - L - R)
    y = lambda s: H - B - s * (H - B - 30)
    out = svg_frame(title, W, H, L, B, x, y, ratios, "ratio removed")
    for i, (m, pts) in enumerate(sorted(series.items())):
        c, dx = COLORS[i % len(COLORS)], (i - len(series) / 2) * 0.8
        pts = sorted(pts)
        out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (
            c, " ".join("%.1f,%.1f" % (x(r) + dx, y(cl["hits"] / cl["n"])) for r, cl in pts)))
        for r, cl in pts:
            lo, hi = wilson(cl["hits"], cl["n"])
            out.append(error_bar(x(r) + dx, y, lo, hi, c))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - R + 10, 40 + 13 * i, c, m))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def pareto_points(data, n):
    """[(bytes fraction, cell, method, ratio)] of every spec measured at length n, the f16 baseline first."""
    pts = []
    if n in data["base"]:
        pts.append((1.0, data["base"][n], "f16", 0.0))
    for (m, r, nn), c in sorted(data["passkey"].items()):
        f = bytes_fraction(data, c, nn)
        if nn == n and f is not None:
            pts.append((f, c, m, r))
    return pts


def frontier(pts):
    """The points no other point beats on both axes (fewer bytes and a higher rate), by bytes."""
    best, out = -1.0, []
    for p in sorted(pts, key=lambda p: (p[0], -p[1]["hits"] / p[1]["n"])):
        if p[1]["hits"] / p[1]["n"] > best:
            out.append(p)
            best = p[1]["hits"] / p[1]["n"]
    return out


def svg_pareto(title, pts):
    """passkey rate vs bytes held, a dot and its Wilson 95% bar per spec, the frontier as a staircase."""
    W, H, L, B, R = 640, 360, 50, 40, 190
    x = lambda f: L + min(f, 1.05) / 1.05 * (W - L - R)
    y = lambda s: H - B - s * (H - B - 30)
    methods = sorted({p[2] for p in pts})
    col = {m: COLORS[i % len(COLORS)] for i, m in enumerate(methods)}
    out = svg_frame(title, W, H, L, B, x, y, [0, 0.25, 0.5, 0.75, 1.0], "KV bytes held vs f16")
    f = frontier(pts)
    steps = []
    for i, p in enumerate(f):
        if i:
            steps.append("%.1f,%.1f" % (x(p[0]), y(f[i - 1][1]["hits"] / f[i - 1][1]["n"])))
        steps.append("%.1f,%.1f" % (x(p[0]), y(p[1]["hits"] / p[1]["n"])))
    if steps:
        out.append('<polyline fill="none" stroke="#999" stroke-dasharray="4,3" points="%s"/>' % " ".join(steps))
    for fr, cl, m, _ in pts:
        lo, hi = wilson(cl["hits"], cl["n"])
        out.append(error_bar(x(fr), y, lo, hi, col[m]))
        out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x(fr), y(cl["hits"] / cl["n"]), col[m]))
    for i, m in enumerate(methods):
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - R + 10, 40 + 12 * i, col[m], m))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def sweep_reports():
    """(kind, length, group, report) of every sweep file that parses: kind "passkey" or "kld", the run's group
    ("shared", "full", a codec, "g1".., "codecs", "paper") from its name (sweep_path)."""
    for path in glob.glob(os.path.join(RESULTS, "passkey_*.json")) + glob.glob(os.path.join(RESULTS, "kld_*.json")):
        try:
            report = json.load(open(path))
        except ValueError:
            continue
        kind, length, _, group = os.path.basename(path)[:-5].split("_")
        yield kind, int(length), group, report


def sweep_cost():
    """Machine time of the sweep: {kind: (seconds, specs, files)}, the wall time kvx eval reports for each finished
    spec (baseline included), and the load averages sweep-times.jsonl logged at the end of each run."""
    out = {}
    for kind, _, _, report in sweep_reports():
        done = [s for s in report.get("results", []) if s.get("done")]
        sec, specs, files = out.get(kind, (0.0, 0, 0))
        out[kind] = (sec + sum(s.get("seconds", 0) for s in done), specs + len(done), files + 1)
    log = os.path.join(RESULTS, "sweep-times.jsonl")
    loads = [json.loads(line)["loadavg"] for line in open(log)] if os.path.exists(log) else []
    return out, loads


def cost_line(kind, what):
    costs, loads = sweep_cost()
    if kind not in costs:
        return ""
    sec, specs, files = costs[kind]
    return ("Machine time of the %s: %.0f min of wall clock for %d specs in %d kvx eval runs (kvx eval's own "
            "seconds per spec, baseline included), at nice 5-10 on the shared 2-vCPU AMD EPYC VM while 5-7 other "
            "engineers built and tested (load average %s): an idle machine needs a fraction of it." % (
                what, sec / 60, specs, files,
                "%.0f–%.0f" % (min(loads), max(loads)) if loads else "13–25 when the runs were started"))


def passkey_table(data, n, verdict, best):
    """Every method x ratio at length n: rate [Wilson 95%] n, verdict vs full, ★ when indistinguishable from the
    best method at that ratio, bytes vs f16."""
    lines = ["The full f16 cache (ratio 0): %s." % fmt_rate(data["base"][n]), ""] if n in data["base"] else []
    lines += ["| method | " + " | ".join("r=%g" % r for r in RATIOS) + " |", "|---|" + "---:|" * len(RATIOS)]
    dropped = floors()
    for m in METHODS:
        cells = []
        for r in RATIOS:
            c = data["passkey"].get((m, r, n))
            if c is None:
                cells.append("floor, not run" if (m, r, n) in dropped else "–")
                continue
            star = " ★" if best.get((r, n), (None, {}))[1].get(m) else ""
            cells.append("%s %s%s (%s)" % (fmt_rate(c), MARK[verdict[(m, r, n)][1]], star,
                                           fmt(bytes_fraction(data, c, n))))
        if any(c != "–" for c in cells):
            lines.append("| %s | %s |" % (m, " | ".join(cells)))
    return lines


def kld_table(data, ctx):
    keys = [k for k in data["kld"] if k[2] == ctx]
    if not keys:
        return []
    any_cell = data["kld"][keys[0]]
    lines = ["### %d tokens of context, the next %d scored (%d chunk%s, %d scored tokens per spec)" % (
                 ctx, KLD_SCORED, any_cell["chunks"], "" if any_cell["chunks"] == 1 else "s", any_cell["scored"]), "",
             "| method | " + " | ".join("r=%g" % r for r in [0] + RATIOS) + " |", "|---|" + "---:|" * (1 + len(RATIOS))]
    for m in METHODS:
        row = []
        for r in [0] + RATIOS:
            c = data["kld"].get((m, r, ctx))
            row.append("–" if c is None else "%s (%s)" % (fmt_kld(c), fmt(bytes_fraction(data, c, ("kld", ctx)))))
        if any(c != "–" for c in row):
            lines.append("| %s | %s |" % (m, " | ".join(row)))
    return lines + [""]


def pace_class(kind, group):
    """Runs whose specs cost alike: the KLD batches g1.. mix the same methods, so they are one class."""
    return (kind, "g" if kind == "kld" and group.startswith("g") else group)


def equal_quality_section(data, verdict):
    """Per ratio, the specs whose KLD at the first long context is within EQUAL_KLD and whose passkey is not worse
    than the full cache at any length measured, and those the KLD bound alone would have called equal."""
    ctx = KLD_CONTEXTS[0]
    equal, kld_only = {}, {}
    for (m, r, c), cell in data["kld"].items():
        tests = [v for (mm, rr, _), (_, v) in verdict.items() if mm == m and rr == r]
        if c != ctx or cell["mean"] > EQUAL_KLD or not tests:
            continue
        name = m.split("+")[0] + " alone" if r == 0 else m  # ratio 0 of a combination is its codec, shared by several
        entry = "%s (%s, KLD %.4f, passkey %s)" % (name, fmt(bytes_fraction(data, cell, ("kld", ctx))), cell["mean"],
                                                   ", ".join("%s at %d" % (fmt_rate(data["passkey"][(m, r, n)]).rsplit(
                                                       " n=", 1)[0], n) for n in SWEEP_LENGTHS
                                                       if (m, r, n) in data["passkey"]))
        (kld_only if "worse" in tests else equal).setdefault(r, []).append(
            (bytes_fraction(data, cell, ("kld", ctx)) or 9, entry))
    lines = ["## Equal quality: KLD and retrieval together", "",
             "A spec is of equal quality to the full f16 cache only when both hold (issue 37; the serving capacity "
             "goal's bound): mean KLD at %d tokens of context ≤ %g, and passkey not worse than the full cache at "
             "any length measured (exact McNemar, Holm, the tables above). Sorted by bytes held vs f16 (the KLD "
             "run's); ratio 0 is a combination's codec alone. The last column lists the specs the KLD bound alone "
             "would have called equal." % (
                 ctx, EQUAL_KLD), "",
             "| ratio | equal quality | KLD within the bound, retrieval worse |", "|---:|---|---|"]
    for r in sorted(set(equal) | set(kld_only)):
        lines.append("| %g | %s | %s |" % (r, "; ".join(e for _, e in sorted(set(equal.get(r, [])))) or "none",
                                           "; ".join(e for _, e in sorted(set(kld_only.get(r, [])))) or "none"))
    return lines + [""]


def spec_pace():
    """{(kind, group class): (median wall seconds of a finished spec per 1000 tokens of length, specs timed)},
    from kvx eval's own timings (baselines included: an unfinished run re-runs its baseline too)."""
    secs = {}
    for kind, length, group, report in sweep_reports():
        secs.setdefault(pace_class(kind, group), []).extend(
            1000.0 * s["seconds"] / length for s in report.get("results", []) if s.get("done") and s.get("seconds"))
    return {k: (statistics.median(v), len(v)) for k, v in secs.items()}


def run_cost(pace, kind, length, group, specs):
    """Seconds a run would take at the measured pace: its specs and its baseline, each at the median of its
    class (scaled linearly by length), else of its kind; None when nothing of its kind was timed."""
    rates = [rate for (k, _), (rate, _) in pace.items() if k == kind]
    if not rates:
        return None
    rate = pace[pace_class(kind, group)][0] if pace_class(kind, group) in pace else statistics.median(rates)
    return (specs + 1) * rate * length / 1000.0


def remaining_section():
    """The planned runs not finished yet (what an interrupted sweep leaves), and what the statistics part of
    issue 37 still lacks."""
    plan = argparse.Namespace(only="", lengths="")
    pace, missing, total = spec_pace(), [], 0.0
    for kind, length, ratios, group, _, specs in sweep_runs(plan) + kld_runs(plan):
        left = {s for _, _, s in specs} - finished_specs(kind, length)
        if left:
            cost = run_cost(pace, kind, length, group, len(specs))
            total += cost or 0
            missing.append("| %s | %d | %s | %s | %d of %d | %s |" % (
                kind, length, "all" if ratios is None else ", ".join("%g" % r for r in ratios), group, len(left),
                len(specs), "–" if cost is None else "%.0f min" % (cost / 60)))
    lines = ["## Not measured yet, and what remains", ""]
    if missing:
        _, loads = sweep_cost()
        lines += ["These planned runs have specs without results in a complete run (a run cut mid-way shows the "
                  "specs it finished and is re-run whole, baseline included). `nohup nice -n 5 "
                  "scripts/eviction_report.py --sweep --kld > /tmp/eviction.log 2>&1 &` runs them (finished runs are "
                  "skipped; `--lengths`, `--ratios` and `--only` pick a slice), then `--render-only` and commit "
                  "`docs/results/eviction/`. Cost: the run's specs and its baseline at the median seconds per spec "
                  "of the finished runs of its group (per 1000 tokens of length, so a 4096 run costs twice a 2048 "
                  "one; the KLD batches are one group; a group never run takes its kind's median), measured on the "
                  "shared 2-vCPU VM at load averages %s: a ratio of wall times on that machine, not a "
                  "prediction for an idle one." % ("%.0f–%.0f" % (min(loads), max(loads)) if loads else "unknown"),
                  "", "| kind | length / context | ratios | group | specs missing | cost at the measured pace |",
                  "|---|---:|---|---|---:|---:|"] + missing + [
                  "| | | | | total | ≈ %.1f h |" % (total / 3600), ""]
    dropped = sorted(floors())
    if dropped:
        lines += ["Left out as floors (FLOOR_RATE: at most %.0f%% passkey at that ratio at a shorter length; on this model "
                  "retrieval only gets harder with distance, so a longer cell would spend its compute to confirm a "
                  "near-zero rate): %s." % (100 * FLOOR_RATE, "; ".join(
                      "%s at %d (r = %s)" % (m, n, ", ".join("%g" % r for mm, r, nn in dropped if mm == m and nn == n))
                      for m, n in sorted({(m, n) for m, _, n in dropped}))), ""]
    lines += ["Still open in issue 37's statistics: the question-included mode and niah_multikey / needle are not in "
              "the 50-prompt sweep (the former doubles its cost, the latter are floors or weak on this model); "
              "the passkey haystack is llama.cpp's repeated filler only (one filler, 50 keys and depths): a "
              "natural-text passkey (the model's training format) would test methods on text where every token "
              "is new; the full between-methods matrix is rendered at %d tokens only (at longer lengths floors are "
              "not run, so it would be partial); KLD's interval is the standard error "
              "over scored tokens, which are correlated within a chunk (more chunks, not more tokens, would "
              "tighten it honestly)." % SWEEP_LENGTHS[0], ""]
    return lines


def render(out):
    data = load()
    verdict, best = verdicts(data), best_groups(data)
    lengths = sorted(data["base"])
    contexts = sorted({k[2] for k in data["kld"]})
    lines = ["# KV eviction: score-based policies on the recall model", "",
             "Rendered by `scripts/eviction_report.py` from `docs/results/eviction/*.json` (never typed).", "",
             "## How it is measured", "",
             "**Passkey sweep** (`scripts/eviction_report.py --sweep`). `kvx eval --tasks passkey` on "
             "`../shared/models/recall` (llama.cpp's passkey prompt), %d prompts per cell: one per depth, spread "
             "evenly over [0, 1], each with its own seeded key, the same prompts for every method (so pairs of "
             "methods are compared prompt by prompt). The cache is compressed once after the context, question "
             "**excluded** (the cache could serve any question: the server's case). Lengths %s; 8192 is left out: "
             "the model retrieves only ~5k tokens back (../shared/models/recall/README.md), so at 8k the full "
             "cache itself fails the early depths and the cells measure the model, not the method. The question-"
             "included mode, needle (ROUGE, weak on this model) and niah_multikey (the full cache finds 13 of 50 at "
             "2k: a floor) are left out to buy prompts." % (SWEEP_PROMPTS, ", ".join(map(str, SWEEP_LENGTHS))), "",
             "**Statistics.** Each cell: passkey rate [Wilson 95% interval] n = prompts, then the verdict against "
             "the full f16 cache on the same prompts: exact McNemar test (two-sided binomial on the discordant "
             "prompts), ▼ worse, ▲ better, = indistinguishable, with Holm's correction over every comparison of "
             "one length (family-wise alpha 0.05). ★: indistinguishable from the best method at that ratio and "
             "length (exact McNemar against it, Holm over the methods of that ratio). Bytes vs f16 in brackets: the "
             "pool's bytes at the end of a sequence plus what the method keeps beside it (side bytes), over the "
             "full cache's. A cell of 50 prompts separates about 20 points near 50% and less near 0 or 100%; "
             "two methods whose intervals overlap can still differ on paired prompts (the test sees the pairs).", "",
             "Shared contexts (SCBench's protocols: one context compressed once, then several questions against "
             "it, or a conversation): [scbench.md](scbench.md).", ""]
    cost = cost_line("passkey", "passkey sweep")
    if cost:
        lines += [cost, ""]
    for n in lengths:
        lines += ["## Passkey at %d tokens, every method" % n, ""] + passkey_table(data, n, verdict, best) + [""]
    if SWEEP_LENGTHS[0] in lengths:  # the length where every method is measured (longer ones drop floors)
        lines += pairwise_section(data, SWEEP_LENGTHS[0])
    plots = []
    for n in lengths:
        series = {}
        for (m, r, nn), c in data["passkey"].items():
            if nn == n and r > 0:
                series.setdefault(m, []).append((r, c))
        for m in series:
            series[m].append((0, data["base"][n]))
        name = "eviction-passkey-%d.svg" % n
        out.write("docs/" + name, svg_curves("passkey, %d tokens, question excluded (95%% Wilson)" % n, series))
        plots.append(name)
    if plots:
        lines += ["## Passkey vs ratio", ""] + ["![%s](%s)" % (p, p) for p in plots] + [""]
    for n in lengths:
        pts = pareto_points(data, n)
        name = "eviction-pareto-%d.svg" % n
        out.write("docs/" + name, svg_pareto("passkey vs KV bytes, %d tokens (95%% Wilson)" % n, pts))
        lines += ["## Pareto: passkey vs KV bytes at %d tokens" % n, "", "![%s](%s)" % (name, name), "",
                  "The frontier (no other spec holds fewer bytes with a higher rate):", "",
                  "| spec | ratio | bytes vs f16 | passkey |", "|---|---:|---:|---:|"]
        lines += ["| %s | %g | %s | %s |" % (m, r, fmt(fr), fmt_rate(c)) for fr, c, m, r in frontier(pts)] + [""]
    if contexts:
        lines += ["## KLD at long context", "",
                  "`scripts/eviction_report.py --kld`: `kvx eval --tasks ppl,kld --kld-context C --kld-score %d` on "
                  "the recall model's held-out text (`../shared/%s`, never trained on): each chunk's first C tokens "
                  "are prefilled and compressed once (no question), the next %d are fed one at a time (teacher "
                  "forced) and each next-token distribution is compared with the full f16 cache's: mean KL(f16 ‖ "
                  "method) ± its standard error over the scored tokens (bytes held vs f16 in brackets). The longest "
                  "context is 8192 − 257 = %d so that context + scored tokens stay within the trained 8192. "
                  "r=0 is a codec combination's codec alone." % (KLD_SCORED, KLD_TEXT, KLD_SCORED, KLD_CONTEXTS[-1]),
                  ""]
        cost = cost_line("kld", "KLD runs")
        if cost:
            lines += [cost, ""]
        for ctx in contexts:
            lines += kld_table(data, ctx)
        lines += equal_quality_section(data, verdict)
    lines += ["## The methods", ""]
    for m, (spec_fn, paper, kvx) in METHODS.items():
        lines += ["### %s" % m, "", "**Paper.** " + paper, "", "**kvx.** " + kvx, ""]
        note = os.path.join(NOTES, m + ".md")
        if os.path.exists(note):
            with open(note) as f:
                lines += [f.read().rstrip("\n"), ""]
        lines += ["**Spec at ratio r, length n** (e.g. r = 0.5, n = 4096): `%s`" % spec_fn(0.5, 4096), ""]
        rows = sorted((n, r) for (mm, r, n) in data["passkey"] if mm == m)
        if rows:
            lines += ["| length | ratio | passkey | vs full (p) | bytes vs f16 | live slots |",
                      "|---:|---:|---:|---|---:|---:|"]
            for n, r in rows:
                c = data["passkey"][(m, r, n)]
                p, v = verdict.get((m, r, n), (None, ""))
                lines.append("| %d | %g | %s | %s (%s) | %s | %s |" % (
                    n, r, fmt_rate(c), v, "–" if p is None else "%.2g" % p, fmt(bytes_fraction(data, c, n)),
                    fmt(c["live"])))
            lines.append("")
        if not rows and not any(k[0] == m for k in data["kld"]):
            lines += ["Not measured yet.", ""]
    lines += paper_section()
    lines += remaining_section()
    lines += speed_section()
    out.write(DOC, "\n".join(lines).rstrip("\n") + "\n")
    out.readme_block("kv-eviction", "\n".join(readme_headline(data, best)))


def readme_headline(data, best):
    """The README's summary: per length and ratio, the methods indistinguishable from the best (rate and
    interval, bytes), and the Pareto chart of the first length."""
    if not data["base"]:
        return ["Eviction: no sweep results committed yet; run `scripts/eviction_report.py --sweep` "
                "(see [docs/kv-eviction.md](docs/kv-eviction.md))."]
    lengths = sorted(data["base"])
    out = ["Eviction, merging, demotion, head typing, Quest, ThinK and policies on quantized pages, on the recall "
           "model: passkey with %d prompts per cell (question excluded from the compression). Per ratio: the best "
           "method and every method an exact McNemar test on the same prompts cannot tell from it (Holm-corrected), "
           "with the passkey rate [Wilson 95%% interval] and the bytes held vs f16. Every method, the verdicts "
           "against the full cache, the long-context KLD table and decode speed: "
           "[docs/kv-eviction.md](docs/kv-eviction.md) (rendered by `scripts/eviction_report.py`)." % SWEEP_PROMPTS,
           "", "| length | full f16 | ratio | best methods |", "|---:|---:|---:|---|"]
    for n in lengths:
        for r in RATIOS:
            if (r, n) not in best:
                continue
            same = [m for m, s in best[(r, n)][1].items() if s]
            same.sort(key=lambda m: -data["passkey"][(m, r, n)]["hits"])
            out.append("| %d | %s | %g | %s |" % (n, fmt_rate(data["base"][n]), r, "; ".join(
                "%s %s (%s)" % (m, fmt_rate(data["passkey"][(m, r, n)]),
                                fmt(bytes_fraction(data, data["passkey"][(m, r, n)], n))) for m in same)))
    out += ["", "![passkey vs KV bytes](docs/eviction-pareto-%d.svg)" % lengths[0]]
    return out
