#!/usr/bin/env python3
"""Issue #29's closing figures for a source tree: lines per crate, the largest files, the
import circles among mlx-models' modules, `Other(` sites per crate and README words.

    python3 xtask/stats/consolidation_figures.py [ROOT]

ROOT defaults to the current directory (a checkout, or `git archive REV | tar -x` of one).
Duplicate pairs come from the workplace `duplicates` tool, not from here. Prints Markdown.
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
    `self::`) depends on the longest module prefix of that path that is a file."""
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


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    print("| crate | src lines | `Other(` sites |")
    print("| --- | ---: | ---: |")
    total = [0, 0]
    allfiles = []
    for c in crates(root):
        ls, oth = 0, 0
        for p in rs_files(root, os.path.join(c, "src")):
            n = lines(p)
            ls += n
            allfiles.append((n, os.path.relpath(p, root)))
            oth += open(p, encoding="utf-8", errors="replace").read().count("Other(")
        total[0] += ls
        total[1] += oth
        print(f"| {c} | {ls} | {oth} |")
    print(f"| total | {total[0]} | {total[1]} |")
    print()
    print("Largest source files (lines):")
    print()
    for n, p in sorted(allfiles, reverse=True)[:10]:
        print(f"- {p}: {n}")
    print()
    files, edges = import_graph(os.path.join(root, "mlx-models", "src"))
    comps = sorted((c for c in sccs(edges) if len(c) > 1), key=len, reverse=True)
    print(f"mlx-models import circles (strongly connected module sets of 2 or more files): {len(comps)}")
    for c in comps:
        names = sorted("::".join(m) or "lib" for m in c)
        print(f"- {len(c)} files: {', '.join(names)}")
    print()
    readme = os.path.join(root, "README.md")
    if os.path.exists(readme):
        print(f"README.md words: {len(open(readme, encoding='utf-8').read().split())}")


if __name__ == "__main__":
    main()
