#!/usr/bin/env python3
"""Keeps stored --kv spec strings meaning what they meant when they were measured, across a change of a codec's
default setting (kv::DefaultsOf, src/kv/kv_spec.cc).

A codec named without page, group, residual, rotate and prerope takes its default setting for every key the string
does not name (src/kv/kv_spec.h). When that setting changes, such a stored string (`codec=int2`, `codec=int4,sym=1`,
`codec=int4;policy=mikv,ratio=0.5`) would mean something else than what was run. This rewrites each one into the
explicit old setting, which parses to exactly what the string meant before (`codec=int2,clip=0`,
`codec=int4,sym=1,rotate=none;policy=mikv,ratio=0.5`). Canonical forms (KVSpec::ToString) always name page and are
left alone, so are strings that already name every key of the old setting. Running it twice changes nothing.

  scripts/pin_default_specs.py PATH...          rewrite in place (a directory: every text file under it)
  scripts/pin_default_specs.py --check PATH...  print what would change, exit 1 if anything would

The strings are found in any text (JSON, Markdown, SVG, Python, shell): `codec=NAME` followed by `,key=value` items
without spaces, as stored reports and scripts write them.
"""
import os, re, sys

# Issue 41's change: the settings a codec named alone had before it, as the items that restore them. int2 gained
# clip=1 (restored by naming clip=0, which the rest of int2's setting leaves as it was); int4 gained
# rotate=hadamard (naming rotate=none keeps the per-key defaults, int4's old setting); kivi4 gained rotate=hadamard
# (its old setting named in full, which keeps rotate at its per-key default, none).
OLD_SETTINGS = {"int2": "clip=0", "int4": "rotate=none", "kivi4": "page=128,group=64,residual=0,prerope=1"}

# The keys whose naming keeps a codec from its default setting (kv_spec.cc, ParseKVSpec).
SETTING_KEYS = {"page", "group", "residual", "rotate", "prerope"}

SPEC = re.compile(r"(?<![\w./-])codec=(%s)(?![\w.-])((?:,[a-z][a-z0-9.-]*=[A-Za-z0-9.%%+-]+)*)"
                  % "|".join(OLD_SETTINGS))
TEXT_EXTENSIONS = {".json", ".jsonl", ".md", ".in", ".svg", ".py", ".sh", ".txt", ".log", ".csv", ".html"}


def pin(spec_match):
    """The pinned form of one match of SPEC (its text unchanged when its meaning does not depend on the defaults)."""
    codec, items = spec_match.group(1), spec_match.group(2)
    parts = items.split(",")[1:]
    n_codec = next((i for i, p in enumerate(parts) if p.split("=", 1)[0] == "policy"), len(parts))
    named = {p.split("=", 1)[0] for p in parts[:n_codec]}
    if named & SETTING_KEYS:
        return spec_match.group(0)
    missing = [kv for kv in OLD_SETTINGS[codec].split(",") if kv.split("=", 1)[0] not in named]
    if not missing:
        return spec_match.group(0)
    return "codec=" + codec + "".join("," + p for p in parts[:n_codec] + missing + parts[n_codec:])


def pin_text(text):
    """(text with every spec pinned, [(old, new), ...] of the strings that changed)."""
    changes = []

    def one(m):
        new = pin(m)
        if new != m.group(0):
            changes.append((m.group(0), new))
        return new
    return SPEC.sub(one, text), changes


# This tool and its test name bare specs on purpose.
SELF = {os.path.join(os.path.dirname(os.path.abspath(__file__)), n)
        for n in ("pin_default_specs.py", "pin_default_specs_test.py")}


def files_under(paths):
    """The files of `paths` (directories walked for text files), this tool's own left out."""
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if os.path.splitext(name)[1] in TEXT_EXTENSIONS:
                        yield os.path.join(root, name)
        elif os.path.isfile(path):
            yield path
        else:
            sys.exit("kvx: error: %s: no such file or directory (give files or directories to pin)" % path)


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths or any(a.startswith("-") for a in paths):
        sys.exit("usage: scripts/pin_default_specs.py [--check] PATH...")
    total = 0
    for path in files_under(paths):
        if os.path.abspath(path) in SELF:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue  # not text
        new, changes = pin_text(text)
        if not changes:
            continue
        total += len(changes)
        distinct = sorted(set(changes))
        print("%s: %d string(s)%s" % (path, len(changes), "" if check else " pinned"))
        for old, pinned in distinct:
            print("  %s -> %s" % (old, pinned))
        if not check:
            mode = os.stat(path).st_mode
            tmp = path + ".pin.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(new)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
    if check and total:
        print("%d spec string(s) would change meaning with the new defaults; run scripts/pin_default_specs.py on "
              "these paths" % total)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
