#!/usr/bin/env python3
"""Issue #29's closing figures for a source tree: lines per crate (`src/` and `tests/` apart),
the 15 largest source files, the import circles among each crate's modules, `Other(` sites and
`Result<_, String>` lines per crate, and the words of the README and of docs/*.md.

    python3 xtask/stats/consolidation_figures.py [ROOT]

ROOT defaults to the current directory (a checkout, or `git archive REV | tar -x` of one).
Duplicate pairs come from the workplace `duplicates` tool, not from here. Prints Markdown.

The counting rules (each is one grep, so a column can be checked by hand):
- lines: every line of every `*.rs` file under `CRATE/src` (and, apart, `CRATE/tests`);
- `Other(`: textual occurrences, as `grep -o "Other(" -r --include=*.rs CRATE/src | wc -l`;
- `Result<_, String>`: lines matching `Result<[^;{]*, ?String>`, as
  `grep -rnE "Result<[^;{]*, ?String>" --include=*.rs mlx-*/src | grep -v "^mlx-cli/"` counts
  them (the library crates: every crate but mlx-cli; xtask is not counted);
- words: `len(text.split())`, as `wc -w`.
"""
import os
import re
import sys


def rs_files(root, sub):
    for d, _, fs in os.walk(os.path.join(root, sub)):
        for f in fs:
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def lines(p):
    with open(p, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def crates(root):
    return sorted(
        c for c in os.listdir(root)
        if os.path.isfile(os.path.join(root, c, "Cargo.toml")) and os.path.isdir(os.path.join(root, c, "src"))
    )


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def strip_macro_bodies(text):
    """Drops `macro_rules!` bodies: a path inside one is resolved where the macro expands."""
    out, i = [], 0
    for m in re.finditer(r"macro_rules!\s*\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def import_graph(src):
    """Edges between module files of one crate: a file naming `crate::a::b` (or `super::`,
    `self::`, or a glob import `super::*`) depends on the longest module prefix of that path
    that is a file. Bare paths (`pub use child::X` in a parent, `moe::Model` after
    `use super::*`) are not followed, as the earlier figures did not follow them."""
    files = {module_of(src, p): p for p in rs_files(src, "")}
    edges = {m: set() for m in files}
    for m, p in files.items():
        text = open(p, encoding="utf-8", errors="replace").read()
        text = re.sub(r"//[^\n]*", "", text)
        text = strip_macro_bodies(text)
        is_dir_mod = os.path.basename(p) in ("mod.rs", "lib.rs")
        here = m if is_dir_mod else m[:-1]
        paths = []
        # `use crate::x::{a, b::c}` groups, one level deep, and plain `crate::x::y` paths.
        for g in re.finditer(r"(crate|super|self)((?:::\w+)*)::\{([^{}]*)\}", text):
            for item in g.group(3).split(","):
                item = item.strip().split(" as ")[0]
                if item:
                    paths.append((g.group(1), g.group(2) + "::" + item))
        for g in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", text):
            paths.append((g.group(1), g.group(2)))
        # Glob imports (`use super::*`) depend on the module they name.
        for g in re.finditer(r"\b(crate|super|self)((?:::\w+)*)::\*", text):
            paths.append((g.group(1), g.group(2)))
        for head, tail in paths:
            parts = [x for x in tail.split("::") if x and x != "self"]
            base = () if head == "crate" else (here if head == "self" else here[:-1])
            while parts and parts[0] == "super":
                base = base[:-1]
                parts = parts[1:]
            full = base + tuple(parts)
            for k in range(len(full), -1, -1):
                if full[:k] in files:
                    if full[:k] != m:
                        edges[m].add(full[:k])
                    break
    return files, edges


def sccs(edges):
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in edges:
        if v not in index:
            visit(v)
    return out


RESULT_STRING = re.compile(r"Result<[^;{]*, ?String>")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    print("| crate | src lines | tests lines | `Other(` sites | `Result<_, String>` lines |")
    print("| --- | ---: | ---: | ---: | ---: |")
    total = [0, 0, 0, 0]
    allfiles = []
    for c in crates(root):
        ls, lt, oth, rs = 0, 0, 0, 0
        for p in rs_files(root, os.path.join(c, "src")):
            n = lines(p)
            ls += n
            allfiles.append((n, os.path.relpath(p, root)))
            text = open(p, encoding="utf-8", errors="replace").read()
            oth += text.count("Other(")
            if c.startswith("mlx-") and c != "mlx-cli":
                rs += sum(1 for line in text.splitlines() if RESULT_STRING.search(line))
        for p in rs_files(root, os.path.join(c, "tests")):
            lt += lines(p)
        for i, v in enumerate((ls, lt, oth, rs)):
            total[i] += v
        lib = "" if c.startswith("mlx-") and c != "mlx-cli" else " (not counted)"
        print(f"| {c} | {ls} | {lt} | {oth} | {rs if not lib else '-'}{lib} |")
    print(f"| total | {total[0]} | {total[1]} | {total[2]} | {total[3]} |")
    print()
    print("Largest source files (lines, `src/` of every crate):")
    print()
    for n, p in sorted(allfiles, reverse=True)[:15]:
        print(f"- {p}: {n}")
    print()
    print("Import circles (strongly connected sets of 2 or more module files, by `crate::`,")
    print("`super::` and `self::` paths and glob imports, outside comments and macro bodies;")
    print("bare paths such as a parent's `pub use child::X` are not followed):")
    print()
    for c in crates(root):
        files, edges = import_graph(os.path.join(root, c, "src"))
        comps = sorted((k for k in sccs(edges) if len(k) > 1), key=len, reverse=True)
        if not comps:
            continue
        print(f"- {c}: {len(comps)}")
        for k in comps:
            names = sorted("::".join(m) or "lib" for m in k)
            print(f"  - {len(k)} files: {', '.join(names)}")
    print()
    print("Words (`wc -w`):")
    print()
    docs = ["README.md"]
    if os.path.isdir(os.path.join(root, "docs")):
        docs += sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    for d in docs:
        p = os.path.join(root, d)
        if os.path.exists(p):
            print(f"- {d}: {len(open(p, encoding='utf-8').read().split())}")


if __name__ == "__main__":
    main()
