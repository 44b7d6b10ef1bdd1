#!/usr/bin/env python3
"""Every repository path a comment names must exist.

Scans the comments of the product and test sources (// and # lines) and
the docs for paths under the top-level folders (kernels/cpu/cpu_store.h,
docs/operations.md#ttl, ...) and prints each one that names no file or
folder of the tree; exits 1 if there is any. Paths with wildcards or
placeholders (<name>, *, $VAR) are not checked; a path without an extension
may name a program or module by its source's stem (bench/pooling_bench).
Run by tests/run_tests.sh."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOP = ("common", "kernels", "server", "client", "python", "bench", "tests", "deploy",
       "docs", "proto", "scripts", "examples")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])" % "|".join(TOP))
SOURCES = ("*.h", "*.cc", "*.cu", "*.cuh", "*.py", "*.sh", "*.proto", "CMakeLists.txt")


def comment_lines(path):
    text = path.read_text(errors="replace").splitlines()
    if path.suffix == ".md":
        yield from enumerate(text, 1)
        return
    for no, line in enumerate(text, 1):
        stripped = line.strip()
        for mark in ("//", "#"):
            at = line.find(mark)
            if at < 0 or (mark == "#" and stripped.startswith("#include")):
                continue
            if mark == "#" and path.suffix in (".h", ".cc", ".cu", ".cuh", ".proto"):
                continue
            yield no, line[at:]
            break


def main():
    files = [p for pattern in SOURCES for top in TOP for p in (ROOT / top).rglob(pattern)]
    files += list(ROOT.glob("*.md")) + list((ROOT / "docs").rglob("*.md"))
    files += [ROOT / "CMakeLists.txt"]
    missing = []
    for f in sorted(set(files)):
        if "build" in f.relative_to(ROOT).parts[0] or ".venv" in f.parts:
            continue
        for no, text in comment_lines(f):
            for m in PATH.finditer(text):
                name = m.group(1).split("#")[0].rstrip(".")
                if any(c in text[m.start():m.end() + 1] for c in "*<>$") or "{" in name:
                    continue
                if name.endswith("_"):
                    continue  # a prefix ("tests/python/test_")
                # A program or a module named by its stem (bench/pooling_bench,
                # common/aliased_serialize) names its source files.
                stems = [ROOT / (name + ext) for ext in ("", ".cc", ".h", ".cu", ".sh", ".py")]
                if not any(p.exists() for p in stems):
                    missing.append(f"{f.relative_to(ROOT)}:{no}: names {name}, which does not exist")
    for line in missing:
        print(line)
    if missing:
        print(f"{len(missing)} path(s) named in comments do not exist")
        return 1
    print("comment paths: every path named in a comment exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
