"""Shared by the report scripts (golden_perplexity.py, kv_quant_report.py, bench_report.py).

Each report script measures into raw JSON committed under docs/results/ and renders its
documents from that JSON alone, so a document can always be rebuilt from the data beside
it. `Output` collects what a render writes; with --check nothing is written and every
difference from the committed files is printed instead (the render-only ctest).
"""
import difflib, os, re, statistics, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Output:
    """Files a render produces: written, or in check mode compared with the committed ones."""

    def __init__(self, check):
        self.check = check
        self.stale = []

    def write(self, rel_path, text):
        path = os.path.join(ROOT, rel_path)
        if not self.check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            return
        old = open(path).read() if os.path.exists(path) else ""
        if old != text:
            self.stale.append(rel_path)
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                       "committed/" + rel_path, "rendered/" + rel_path, n=1))

    def readme_block(self, name, body):
        """Replaces README.md's text between <!-- NAME:begin --> and <!-- NAME:end -->."""
        path = os.path.join(ROOT, "README.md")
        readme = open(path).read()
        begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
        if begin not in readme or end not in readme:
            sys.exit("README.md has no %s ... %s markers" % (begin, end))
        head, rest = readme.split(begin, 1)
        _, tail = rest.split(end, 1)
        self.write("README.md", head + begin + "\n" + body.rstrip("\n") + "\n" + end + tail)

    def finish(self, what):
        if not self.check:
            return
        if self.stale:
            sys.exit("%s: %s differ from what the script renders from the committed data (above); "
                     "rerun the script (render-only mode) and commit the result" % (what, ", ".join(self.stale)))
        print("%s: committed documents match the committed data" % what)


def rel(path):
    """A path as the documents show it: ../shared/... for the shared folder, relative to the repository
    for files of a kvx checkout (whichever checkout recorded it), else unchanged."""
    path = os.path.normpath(path)
    m = re.match(r"^/.*?/shared/((models|golden|data)/.*)$", path)
    if m:
        return "../shared/" + m.group(1)
    if path.startswith(ROOT + "/"):
        return path[len(ROOT) + 1:]
    m = re.match(r"^/.*?/((build|docs|scripts|tests)/.*)$", path)
    if m and not path.startswith("/tmp/"):
        return m.group(1)
    return path


def spread(values, fmt="%.1f"):
    """'median (min–max, n runs)' of repeated measurements."""
    return "%s (%s–%s, %d runs)" % (fmt % statistics.median(values), fmt % min(values), fmt % max(values),
                                     len(values))


def sub_command_paths(cmd):
    """A recorded command line with machine-specific paths made relative (build/kvx, ../shared/...)."""
    return " ".join(rel(t) if t.startswith("/") else t for t in cmd.split(" "))


# ---- statistics of paired retrieval results (kvx eval's src/eval/stats.cc computes the same) ----

def wilson(hits, n, z=1.96):
    """Wilson score 95% interval of hits / n; (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = hits / n
    center, spread = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, (center - spread) / (1 + z * z / n)), min(1.0, (center + spread) / (1 + z * z / n))


def mcnemar_p(only_a, only_b):
    """Exact McNemar: two-sided binomial test of the discordant pairs, min(1, 2 P(X <= min)), X ~ Bin(n, 1/2)."""
    import math
    n = only_a + only_b
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2 ** n)


def paired(a, b):
    """(only_a, only_b, n) of two {prompt id: hit} maps on the prompts both answered."""
    ids = a.keys() & b.keys()
    return sum(1 for i in ids if a[i] and not b[i]), sum(1 for i in ids if b[i] and not a[i]), len(ids)


def holm(pvalues, alpha=0.05):
    """Holm's step-down correction: which of a family of p-values are significant at family-wise alpha."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    significant = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        significant[i] = True
    return significant


# ---- shared by the scripts that start servers and splice tables into docs ----

def free_port():
    """A TCP port free on the loopback interface now."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def splice_doc(rel_path, marker, table):
    """Replaces the <!-- MARKER:begin --> .. <!-- MARKER:end --> section of ROOT/rel_path with `table`."""
    path = os.path.join(ROOT, rel_path)
    text = open(path).read()
    if "<!-- %s:begin -->" % marker not in text:
        sys.exit("kvx: error: %s has no <!-- %s:begin --> section to write" % (rel_path, marker))
    new = re.sub(r"(<!-- %s:begin -->\n).*?(<!-- %s:end -->)" % (re.escape(marker), re.escape(marker)),
                 lambda mo: mo.group(1) + table + "\n" + mo.group(2), text, flags=re.S)
    open(path, "w").write(new)
