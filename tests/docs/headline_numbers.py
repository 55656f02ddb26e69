#!/usr/bin/env python3
"""Fails when a number of README.md's headline table is not in the experiment README it links to.

Usage:

    tests/docs/headline_numbers.py [--readme README.md] [--verbose]

It reads the table under "## Headline numbers" of the README (columns "what", "number",
"experiment"), and for each row takes every number of its "number" column and looks for it in
the README(s) that the row's "experiment" column links to (relative Markdown links, resolved
from the README's folder; anchors dropped). A number not found is printed with the README's
line and the row's "what"; the exit status is 1 if any was not found, 0 otherwise (2 for a
table it cannot read). --verbose also prints every number found and where. tests/docs/
CMakeLists.txt runs it as `docs_headline_numbers`, so that a headline and the experiment it
summarises cannot drift apart silently: change a number in either place and it fails.

Which numbers are checked (the same rule reads the experiment READMEs):

- Every number of the "number" cell: integers, decimals, percentages, ratios (1.15x or 1.15×),
  both ends of a range (0.94–1.11×, 0.94-1.11× or "−0.002 to +0.016"), numbers with units
  (6.0 ms, 1.1 KB, 48 K deletes/s).
- Except a number that is part of a name: one glued to a letter on either side (10M, 1M, 10K,
  syn100k, bigann10k, p50, r1.03) or followed by a hyphen and a letter (384-d, 768-d); a
  version (0.6.2); and every number inside a `code span` (flags and their values, such as
  `--upper-ef 16`).

How two numbers compare (the formatting may differ, the value may not):

- by value: thousands separators (4,286 = 4286), trailing zeros (0.980 = 0.98, 4.0 = 4) and
  e-notation (5.2e3 = 5200) do not matter, nor does the sign (−0.018, -0.018 and 0.018 are one
  number: the READMEs say "0.018 lower" as often as "−0.018");
- by kind: a ratio (a number followed by × or x, directly or after one space, with no digit
  after the sign: "50,000 × 384" is a size; in a range the first end takes the second's ×) is
  found only as a ratio, a percentage (followed by %, with or without a space) only as a
  percentage; any other number is found as any kind of the same value. So "1.03×" in the
  headline needs "1.03×" (or "1.03x") in the experiment's README, not a bare "1.03".

Small integers (2 threads, 4 computenodes) are checked the same way, and so are almost always
found; what the rule catches is a changed measurement, which is a decimal, a ratio, a percentage
or a larger integer that rarely appears by chance.
"""
import argparse
import os
import re
import sys
from decimal import Decimal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A number: an optional sign, digits with optional comma groups, a fraction, an exponent. Not
# preceded by a letter, digit, '.' or ',' (the middle of a name, a version or a list).
NUMBER = re.compile(r"(?<![\w.,])([+\-\u2212]?)(\d+(?:,\d+)*)(\.\d+)?([eE][+-]?\d+)?")
RANGE = re.compile(r"^(\s*[\u2013\u2014-]\s*|\s+to\s+)$")
CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def numbers(text):
    """[(value, kind, text, start)] for every number of `text` that is not part of a name.
    value: the number's digits without sign, separators or trailing zeros; kind: 'x' (ratio), '%' or ''."""
    text = CODE.sub(lambda m: " " * len(m.group(0)), text)  # keep offsets, drop code spans
    found = []
    for m in NUMBER.finditer(text):
        whole, frac, exp = m.group(2), m.group(3) or "", m.group(4) or ""
        groups = whole.split(",")
        if len(groups) > 1 and not (1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])):
            # a list (16,32,64,128), not thousands: each item is a number; the last keeps the fraction
            pos = m.start(2)
            for i, g in enumerate(groups):
                last = i == len(groups) - 1
                end = pos + len(g) + (len(frac + exp) if last else 0)
                found.append(_item(g + (frac + exp if last else ""), text[end:], pos, end, text[pos:end]))
                pos += len(g) + 1
            continue
        found.append(_item(whole.replace(",", "") + frac + exp, text[m.end():], m.start(), m.end(),
                           text[m.start(2):m.end()]))
    found = [f for f in found if f is not None]
    # a range's first end takes the kind of its second: 0.94–1.11× is 0.94× and 1.11×
    for i in range(len(found) - 1, 0, -1):
        a, b = found[i - 1], found[i]
        if a[1] == "" and b[1] != "" and RANGE.match(text[a[4]:b[3]]):
            found[i - 1] = (a[0], b[1], a[2], a[3], a[4])
    return [(v, k, t, s) for v, k, t, s, _ in found]


def _item(digits, after, start, end, shown):
    """(value, kind, text, start, end) or None when the number is part of a name."""
    # 1.15×, 1.15x, "0.54 × the sum": a ratio; "50,000 × 384" (a digit after the sign) is a size
    ratio = re.match(r" ?[\u00d7x](?![A-Za-z0-9])(?! ?\d)", after)
    if not ratio and (re.match(r"[A-Za-z\u00b5]", after) and not re.match(r"[\u00b5]s\b", after)):
        return None  # 10M, syn100k, 256MiB: glued to a letter (µs excepted)
    if re.match(r"-[A-Za-z]", after) or re.match(r"\.\d", after):
        return None  # 384-d; a version (0.6.2)
    kind = "x" if ratio else ("%" if re.match(r"\s?%", after) else "")
    value = format(Decimal(digits).normalize(), "f")  # 4,286 -> 4286, 0.980 -> 0.98, 5.2e3 -> 5200
    return (value, kind, shown, start, end)


def cells(line):
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|"):
        line = line[:-1]
    return [c.strip() for c in line.split("|")]


def table(readme):
    """[(lineno, {column: cell})] of the table under '## Headline numbers'."""
    rows, header, section = [], None, False
    for lineno, line in enumerate(open(readme, encoding="utf-8"), 1):
        if line.startswith("## "):
            if section:
                break
            section = line.strip() == "## Headline numbers"
            continue
        if not section or not line.lstrip().startswith("|"):
            continue
        c = cells(line)
        if header is None:
            header = [h.lower() for h in c]
            continue
        if all(re.fullmatch(r":?-+:?", x) for x in c):
            continue
        rows.append((lineno, dict(zip(header, c))))
    return header, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    header, rows = table(args.readme)
    if not rows or not header or not {"what", "number", "experiment"} <= set(header):
        print(f"headline_numbers: {args.readme}: no table with columns what | number | experiment "
              "under '## Headline numbers'")
        return 2
    here = os.path.dirname(os.path.abspath(args.readme))
    cache, missing, checked = {}, 0, 0
    for lineno, row in rows:
        what = re.sub(r"\s+", " ", row["what"])
        targets = [t.split("#", 1)[0] for t in LINK.findall(row["experiment"])]
        targets = [os.path.normpath(os.path.join(here, t))
                   for t in targets if t and not re.match(r"^[a-z]+:", t)]
        if not targets:
            print(f"{os.path.relpath(args.readme)}:{lineno}: row '{what}' links no experiment README")
            missing += 1
            continue
        pool = set()
        for t in targets:
            if t not in cache:
                if not os.path.isfile(t):
                    print(f"{os.path.relpath(args.readme)}:{lineno}: {t}: no such file")
                    missing += 1
                    cache[t] = set()
                else:
                    cache[t] = {(v, k) for v, k, _, _ in numbers(open(t, encoding="utf-8").read())}
            pool |= cache[t]
        names = ", ".join(os.path.relpath(t, here) for t in targets)
        for value, kind, text, _ in numbers(row["number"]):
            checked += 1
            ok = (value, kind) in pool if kind else any(v == value for v, _ in pool)
            shown = text + {"x": "×", "%": " %", "": ""}[kind]
            if not ok:
                missing += 1
                print(f"{os.path.relpath(args.readme)}:{lineno}: {shown} (row '{what[:70]}') "
                      f"is not in {names}")
            elif args.verbose:
                print(f"{os.path.relpath(args.readme)}:{lineno}: {shown} found in {names}")
    if missing:
        print(f"headline_numbers: {missing} of {checked} headline number(s) not found in the experiment "
              "README(s) their rows link to")
        return 1
    print(f"headline_numbers: {len(rows)} row(s), all {checked} numbers found in the experiment README(s) "
          "they link to")
    return 0


if __name__ == "__main__":
    sys.exit(main())
