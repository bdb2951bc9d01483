#!/usr/bin/env python3
"""Checks that README.md and docs/*.md point only at what exists in the repository (a ctest: docs_links).

  * a Markdown link `[text](target)` to a relative path must name a file or folder of this checkout
    (not one beside it, such as ../shared), and a `#fragment` must name a heading of the target page;
  * README.md links nothing outside the repository at all (a clone must be able to follow every link);
  * a source path in backticks (`kv/kv_manager.h`, `src/engine/engine.cc`, `scripts/x.py`, ...) must be a
    file of the checkout (a path may omit its leading folders: `kv/attention.cc` is src/kv/attention.cc);
  * a C++ symbol in backticks (`KVManager::BeginStep`, `ResolveKVSpec`) must occur in the sources;
  * in fenced blocks (diagrams, commands) the same holds for every word that looks like a source path
    (`engine/engine.cc`) or a C++ symbol (`Engine::Step`, `BeginStep`).

Paths under ../shared, build/ and /tmp are outputs or data beside the checkout and are not checked; nor is
a path with a wildcard or placeholder (`docs/results/eval-*/report.md`).

  scripts/check_docs.py            # exit 1 and one line per problem when something is stale
"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ("src", "tests", "bench", "fuzz")
# Extensions of the files whose names the documents cite; other dotted words (a model's .gguf in
# ../shared, a .txt of evaluation data) are data, not the repository's.
PATH_EXTS = (".h", ".cc", ".py", ".sh", ".md", ".mjs", ".json", ".in", ".supp", ".svg")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
SYMBOL = re.compile(r"^(?:[A-Za-z_]\w*::)*[A-Za-z_~]\w*(?:\(\))?$")


def documents():
    docs = ["README.md"]
    docs += sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    return docs


def repository_files():
    """Every file of the checkout (relative paths), build trees and git metadata excluded."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "__pycache__"]
        out += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
    return out


def source_words():
    words = set()
    for top in SOURCE_DIRS:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".h", ".cc")):
                    words.update(re.findall(r"\w+", open(os.path.join(d, f), errors="replace").read()))
    return words


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    in_code = False
    for line in open(path):
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else "%s-%d" % (s, n))
        out.update(re.findall(r'<a (?:name|id)="([^"]+)"', line))
    return out


def check_link(doc, target, problems):
    if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
        if doc == "README.md":
            problems.append("%s: links outside the repository: %s (link a page of docs/ instead)" % (doc, target))
        return
    path, _, fragment = target.partition("#")
    full = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else os.path.join(ROOT, doc)
    if full != ROOT and not full.startswith(ROOT + os.sep):
        problems.append("%s: links outside the repository: %s (a clone does not have it)" % (doc, target))
    elif not os.path.exists(full):
        problems.append("%s: links a missing file: %s" % (doc, target))
    elif fragment and full.endswith(".md") and fragment not in anchors(full):
        problems.append("%s: links a missing heading: %s (no '#%s' in %s)" % (doc, target, fragment,
                                                                            os.path.relpath(full, ROOT)))


def cited_path(text):
    """The repository path a code span names, or None when it names none (or one we do not check)."""
    p = re.sub(r"(:\d+(-\d+)?|#.*|\(\))$", "", text.strip())
    if " " in p or not re.match(r"^[\w./-]+$", p) or p.startswith(("../", "/", "build/", "http")):
        return None
    if re.search(r"[A-Z]{3,}", p):  # a placeholder such as FILE or NAME
        return None
    if p.endswith(PATH_EXTS) or re.match(r"^(src|docs|scripts|tests|bench|fuzz)/.", p):
        return p.rstrip("/")
    return None


def cited_names(text):
    """What a document names: its inline code spans, and the path- or symbol-like words of its fenced
    blocks (a diagram names functions and files without backticks)."""
    fences = re.findall(r"```.*?```", text, flags=re.S)
    spans = set(CODE.findall(re.sub(r"```.*?```", "", text, flags=re.S)))
    for block in fences:
        spans.update(re.findall(r"(?<![\w/.-])[\w./-]+\.(?:h|cc|py|sh|md)\b", block))
        spans.update(re.findall(r"(?<![\w/.-])(?:[A-Za-z_]\w*::)*[A-Za-z_]\w*(?:\(\))?", block))
    return sorted(spans)


def main():
    files = repository_files()
    names = set(files) | {os.path.dirname(f) for f in files}
    words = source_words()
    problems = []
    for doc in documents():
        text = open(os.path.join(ROOT, doc)).read()
        text_no_code = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", text_no_code)):
            check_link(doc, target, problems)
        for span in cited_names(text):
            p = cited_path(span)
            if p is not None:
                here = os.path.normpath(os.path.join(os.path.dirname(doc), p))
                if p not in names and here not in names and not any(n.endswith("/" + p) for n in names):
                    problems.append("%s: names a file that does not exist: %s" % (doc, span))
            elif SYMBOL.match(span) and ("::" in span or re.search(r"[a-z0-9][A-Z]", span)):
                last = re.sub(r"\(\)$", "", span).split("::")[-1]
                if last not in words:
                    problems.append("%s: names a symbol the sources do not have: %s" % (doc, span))
    for p in problems:
        print(p)
    if problems:
        sys.exit("check_docs.py: %d stale reference(s) in README.md / docs/*.md (above)" % len(problems))
    print("check_docs.py: every link, path and symbol in README.md and docs/*.md exists")


if __name__ == "__main__":
    main()
