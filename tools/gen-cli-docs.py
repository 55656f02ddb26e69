#!/usr/bin/env python3
"""docs/cli.md, the command-line reference, generated from the binaries' own --help.

    gen-cli-docs.py BIN_DIR             write docs/cli.md (via a temporary name and a rename)
    gen-cli-docs.py --check BIN_DIR     exit 1, with a unified diff, when docs/cli.md is stale
    gen-cli-docs.py --out PATH BIN_DIR  write (or --check) PATH instead of docs/cli.md

BIN_DIR is a build's runtime output directory (build/bin). The binaries are the project's
user-facing executables: every dmhnsw_executable()/add_executable() of the CMake tree reached by
add_subdirectory() from the top-level CMakeLists.txt, tests/ left out (tests and fuzz harnesses).
Each must have a one-line summary in SUMMARIES below: a new binary without one, or a summary of a
binary the CMake tree no longer has, is an error, so the page cannot silently leave one out. A
binary's CLI11 subcommands (its help's "Subcommands:" section, e.g. `computenode serve`) are
documented too, each with the description its parent's help gives it.

The ctest `docs_cli_md` (label docs, tests/docs/CMakeLists.txt) runs --check against the build's
bin directory. Exit status: 0 written / up to date, 1 stale (--check), 2 a binary is missing or
its --help failed, or a bad command line. Stdlib only.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path("docs") / "cli.md"
# What the page and --check tell a reader to run (relative, the same on every machine).
REGEN_COMMAND = "python3 tools/gen-cli-docs.py build/bin"
HELP_TIMEOUT_S = 60  # a sanitizer build starts slowly

# Binary -> one-line summary, in the page's order. The full description is the help's own.
SUMMARIES: dict[str, str] = {
    "memnode": "Memory node: holds a region of the index in registered memory and serves one-sided "
               "READ/WRITE/atomic operations to computenodes",
    "computenode": "Compute node: builds, inserts into, rebuilds, queries and serves (gRPC) the index held "
                   "by the memnodes, in shine or dhnsw mode",
    "shine-import": "Writes an hnswlib index file into empty memnodes as a shine index",
    "dhnsw-build": "Offline d-HNSW build (balanced partitions, sub-HNSWs, meta-HNSW) into memnode region images",
    "datagen": "Synthetic Gaussian-mixture base vectors and a query pool",
    "groundtruth": "Exact top-k neighbours of queries (Faiss flat index)",
    "workload": "Query workload file (uniform, Zipf, hot clusters) from a query pool and its ground truth",
    "kmeans": "Balanced k-means of a vector file (SHINE logical partitioning)",
    "fabric-bench": "Latency and throughput of one-sided operations against a live memnode",
    "cache-bench": "Microbenchmark of the SHINE node cache (hit/miss cost, admission, threads)",
    "hnswlib-bench": "Single-machine hnswlib 0.6.2 reference: recall@k, QPS and latency per efSearch",
    "faiss-bench": "Single-machine Faiss HNSW reference (flat, SQ8, PQ, re-ranked): recall@k, QPS, latency and "
                   "index bytes per efSearch",
    "serve-bench": "Load generator for `computenode serve`: QPS, latency percentiles, recall@k",
    "shine-route-sim": "CHR, CHR_max and CSP of simulated computenode caches under each routing, "
                       "over a stored shine index",
    "csp-report": "Per-computenode and shared-cache hit rates and the cache segmentation penalty of runs, "
                  "from their access traces",
}

# Machine independence of the help text. What was checked, and what is done about it:
#  - argv[0]: CLI11 prints argv[0] verbatim in "Usage:" ("./memnode", "/abs/build/bin/memnode"),
#    so each binary runs with argv[0] set to its bare name ("Usage: memnode [OPTIONS]").
#  - Paths: no help prints the build or source directory or $HOME today; should one, the path is
#    replaced by the placeholder <bin-dir>, <source-dir> or <home> (normalise() below).
#  - Core counts: no help prints an nproc-derived default ("--threads ... (0: all cores)" is
#    resolved after parsing). No number is rewritten: on a 2-core machine "--threads UINT=2" is
#    a fixed default, not nproc. A new option whose default is derived from the machine must
#    keep a fixed default in its help (e.g. 0 meaning "all cores") for this page to stay stable.
#  - Terminal width, locale: CLI11 2.1 formats with a fixed column width and does not read the
#    terminal; the binaries run with COLUMNS=100 and LC_ALL=C all the same.
#  - Environment: DMHNSW_* variables (DMHNSW_TOKEN, DMHNSW_PYTHON) are removed from the
#    binaries' environment; none shows in a help today.
#  - Trailing whitespace is stripped from every line (CLI11 prints none today).
# Not covered: csp_plot.py, which the build copies next to csp-report for `csp-report --png`;
# its --help needs matplotlib (it exits 3 without), so it depends on the machine's packages.


class Failure(Exception):
    pass


def cmake_executables(source_dir: Path) -> list[str]:
    """Executables declared in the CMake tree reached from the top level, tests/ excluded."""
    names: list[str] = []
    seen_dirs: set[Path] = set()
    exe = re.compile(r"^\s*(?:dmhnsw_executable|add_executable)\s*\(\s*([A-Za-z0-9_.+-]+)", re.M)
    subdir = re.compile(r"^\s*add_subdirectory\s*\(\s*([A-Za-z0-9_./-]+)", re.M)

    def walk(d: Path) -> None:
        if d in seen_dirs:
            return
        seen_dirs.add(d)
        lists = d / "CMakeLists.txt"
        if not lists.is_file():
            return
        text = re.sub(r"#[^\n]*", "", lists.read_text(encoding="utf-8"))
        for m in exe.finditer(text):
            if m.group(1) not in names:
                names.append(m.group(1))
        for m in subdir.finditer(text):
            sub = (d / m.group(1)).resolve()
            if sub == (source_dir / "tests").resolve():
                continue  # test executables and fuzz harnesses
            walk(sub)

    walk(source_dir)
    return names


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMHNSW_")}
    env.update(LC_ALL="C", LANG="C", COLUMNS="100", LINES="50")
    return env


def run_help(bin_dir: Path, binary: str, args: list[str]) -> str:
    path = bin_dir / binary
    cmd = " ".join([binary, *args, "--help"])
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise Failure(f"{path} is missing: build it (cmake --build {bin_dir.parent} --target {binary})")
    try:
        r = subprocess.run([binary, *args, "--help"], executable=str(path), cwd=bin_dir, env=child_env(),
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=HELP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Failure(f"`{cmd}` did not finish in {HELP_TIMEOUT_S} s") from None
    out = r.stdout.decode("utf-8", errors="replace")
    if r.returncode != 0 or not out.strip():
        err = r.stderr.decode("utf-8", errors="replace").strip()
        raise Failure(f"`{cmd}` exited {r.returncode} with {len(out)} bytes of help" + (f": {err}" if err else ""))
    return out


def normalise(text: str, bin_dir: Path) -> str:
    places = {}
    for p, name in ((bin_dir, "<bin-dir>"), (SOURCE_DIR, "<source-dir>"), (Path.home(), "<home>")):
        for form in {str(p), str(p.resolve())}:
            if len(form) > 1:
                places[form] = name
    for form in sorted(places, key=len, reverse=True):  # the bin dir before the source dir holding it
        text = text.replace(form, places[form])
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def subcommands(help_text: str) -> list[tuple[str, str]]:
    """(name, description) of each entry of a CLI11 help's "Subcommands:" section."""
    subs: list[tuple[str, str]] = []
    inside = False
    for line in help_text.splitlines():
        if line.strip() == "Subcommands:":
            inside = True
            continue
        if not inside:
            continue
        if not line.strip():
            break
        if line.startswith("  ") and not line.startswith("   "):
            name, _, desc = line.strip().partition(" ")
            subs.append((name, desc.strip()))
        elif subs:  # a description on the next line (long name) or continued
            name, desc = subs[-1]
            subs[-1] = (name, (desc + " " + line.strip()).strip())
    return subs


def anchor(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def fenced(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}{fence}\n"


def collect(bin_dir: Path, binary: str, args: list[str], summary: str, out: list[dict]) -> None:
    help_text = normalise(run_help(bin_dir, binary, args), bin_dir)
    out.append({"title": " ".join([binary, *args]), "depth": len(args), "summary": summary, "help": help_text})
    for name, desc in subcommands(help_text):
        collect(bin_dir, binary, [*args, name], desc, out)


def render(bin_dir: Path) -> str:
    declared = cmake_executables(SOURCE_DIR)
    unknown = [b for b in declared if b not in SUMMARIES]
    gone = [b for b in SUMMARIES if b not in declared]
    if unknown:
        raise Failure(f"executable(s) {', '.join(unknown)} of the CMake tree have no summary in "
                      f"{Path(__file__).name}'s SUMMARIES: add one")
    if gone:
        raise Failure(f"{', '.join(gone)} in {Path(__file__).name}'s SUMMARIES is no executable of the CMake tree")

    sections: list[dict] = []
    for binary, summary in SUMMARIES.items():
        collect(bin_dir, binary, [], summary, sections)

    page = [
        "# Command-line reference",
        "",
        "<!-- Generated by tools/gen-cli-docs.py from the binaries' --help: do not edit by hand. -->",
        "",
        "Every binary of the build (`build/bin`) with its `--help`, as printed, and each subcommand with",
        "its own. This page is generated: after changing a flag or a help text, rebuild and run",
        "",
        "```sh",
        REGEN_COMMAND,
        "```",
        "",
        "The ctest `docs_cli_md` (`ctest -L docs`) runs the same script with `--check` against the",
        "build's binaries and fails while this page differs from their help.",
        "",
        "## Contents",
        "",
    ]
    for s in sections:
        indent = "  " * s["depth"]
        page.append(f"{indent}- [`{s['title']}`](#{anchor(s['title'])}): {s['summary']}")
    for s in sections:
        page += ["", f"{'#' * (2 + min(s['depth'], 1))} {s['title']}", "", s["summary"].rstrip(".") + ".", ""]
        page.append(fenced(s["help"]).rstrip("\n"))
    return "\n".join(page) + "\n"


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir", type=Path, help="the build's bin directory (build/bin)")
    ap.add_argument("--check", action="store_true", help="do not write: exit 1 with a diff when the page is stale")
    ap.add_argument("--out", type=Path, default=SOURCE_DIR / DEFAULT_OUT, help="the page (default: docs/cli.md)")
    a = ap.parse_args()
    bin_dir = a.bin_dir.resolve()
    if not bin_dir.is_dir():
        print(f"gen-cli-docs: {a.bin_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        page = render(bin_dir)
    except Failure as e:
        print(f"gen-cli-docs: {e}", file=sys.stderr)
        return 2

    if not a.check:
        write_atomically(a.out, page)
        print(f"gen-cli-docs: wrote {a.out}")
        return 0
    try:
        current = a.out.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = ""
    if current == page:
        print(f"gen-cli-docs: {a.out} is up to date")
        return 0
    rel = os.path.relpath(a.out, SOURCE_DIR) if a.out.is_absolute() else str(a.out)
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(keepends=True), page.splitlines(keepends=True),
                                               f"{rel} (as it is)", f"{rel} (from the binaries' --help)"))
    regen = f"python3 {Path(__file__).resolve()} {bin_dir}"
    if a.out.resolve() != (SOURCE_DIR / DEFAULT_OUT).resolve():
        regen += f" --out {a.out.resolve()}"
    print(f"\ngen-cli-docs: {a.out} is stale (or missing): regenerate it with\n    {regen}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
