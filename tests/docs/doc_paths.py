#!/usr/bin/env python3
"""Fails when a page names a file or folder of this repository that does not exist.

Checks README.md, CONTRIBUTING.md, docs/*.md and the other READMEs (or the pages given): every `path` in
backticks that starts with one of the repository's top-level folders (a `*` in it is a glob,
e.g. `cache/node_cache.*`; a trailing `/` is a folder), and every relative Markdown link
target. Anchors (#...) and external links are not checked. So that a page cannot point at a
file a split or a rename moved: tests/docs/CMakeLists.txt runs it as `docs_paths`.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOP = ("common/", "compute/", "memory/", "cache/", "router/", "tools/", "tests/", "experiments/", "docs/",
       "proto/", "python/", ".ci/")
CODE = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def exists(path):
    path = path.rstrip(".,;:")
    if any(c in path for c in "*?["):
        return bool(glob.glob(os.path.join(ROOT, path)))
    return os.path.exists(os.path.join(ROOT, path))


def check(page):
    bad = []
    here = os.path.dirname(os.path.abspath(page))
    in_fence = False
    for lineno, line in enumerate(open(page, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue  # commands: the README's run by tests/docs/readme_blocks.py
        for m in CODE.finditer(line):
            token = m.group(1)
            token = token.split(":", 1)[0] if re.match(r"^[\w./*-]+:\w", token) else token
            placeholder = re.search(r"[<>{}$]|(^|[/_.-])(NAME|DIR|FILE)([/_.-]|$)", token)
            if token.startswith(TOP) and not placeholder and not exists(token):
                bad.append((lineno, token))
        for m in LINK.finditer(line):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue
            full = os.path.normpath(os.path.join(here, target))
            if not full.startswith(ROOT):
                continue  # outside the repository (../shared): not ours to check
            if not os.path.exists(full):
                bad.append((lineno, target))
    return bad


def main():
    pages = sys.argv[1:] or ([os.path.join(ROOT, p) for p in ("README.md", "CONTRIBUTING.md", "python/README.md",
                                                               "tests/fuzz/README.md", "tools/sanitizers/README.md")] +
                             sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) +
                             sorted(glob.glob(os.path.join(ROOT, "experiments", "**", "README.md"), recursive=True)))
    failed = 0
    for page in pages:
        for lineno, token in check(page):
            print(f"{os.path.relpath(page, ROOT)}:{lineno}: {token}: no such file or folder in the repository")
            failed += 1
    if failed:
        print(f"doc_paths: {failed} reference(s) to files that do not exist")
        return 1
    print(f"doc_paths: {len(pages)} page(s), every repository path they name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
