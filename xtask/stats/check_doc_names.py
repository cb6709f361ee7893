#!/usr/bin/env python3
"""Checks that what a Markdown page names in backquotes exists in the tree: a path (a name
with `/` or a known file suffix) must be a file or folder, from the root or as the end of some
path in the tree (`kit.rs`, `models/kit.rs`), a symbol (an identifier, `a::b`,
`Type::method`, `name!`) must occur as a word in some source file. Flags, commands, shell
lines and JSON are skipped.

    python3 xtask/stats/check_doc_names.py [ROOT] [PAGE.md ...]

ROOT defaults to `.`, the page to `docs/ARCHITECTURE.md`. Prints each name not found and
exits 1 if there is any.
"""
import os
import re
import sys

SUFFIXES = (".rs", ".py", ".sh", ".md", ".toml", ".h", ".hpp", ".cpp", ".cu", ".json", ".html")
SOURCE = (".rs", ".py", ".sh", ".h", ".hpp", ".cpp", ".cu", ".toml")


def sources(root):
    out = []
    for d, dirs, fs in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git", "results") and not x.startswith(".")]
        for f in fs:
            if f.endswith(SOURCE):
                out.append(os.path.join(d, f))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    pages = sys.argv[2:] or ["docs/ARCHITECTURE.md"]
    tree = []
    for d, dirs, fs in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git") and not x.startswith(".")]
        rel = os.path.relpath(d, root)
        tree.append("/" + rel)
        tree.extend("/" + os.path.join(rel, f) for f in fs)
    text = "\n".join(open(os.path.join(root, p), encoding="utf-8", errors="replace").read() for p in sources(root))
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    missing = []
    for page in pages:
        body = open(os.path.join(root, page), encoding="utf-8").read()
        body = re.sub(r"```.*?```", "", body, flags=re.S)
        for name in re.findall(r"`([^`\n]+)`", body):
            n = name.strip()
            if not n or n.startswith(("-", "$", "{", "[", "<", "/", "target", "cargo ", "mlx ", "python")) or " " in n:
                continue
            if "/" in n or n.endswith(SUFFIXES):
                p = n.rstrip("/").split(" ")[0]
                if "*" in p or "<" in p:
                    continue
                if not (os.path.exists(os.path.join(root, p)) or any(t.endswith("/" + p) for t in tree)):
                    missing.append((page, n, "path"))
                continue
            ident = re.sub(r"\(.*\)$", "", n).rstrip("!")
            parts = [x for x in re.split(r"::|\.", ident) if x]
            if not parts or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", x) for x in parts):
                continue
            if not all(x in words for x in parts):
                missing.append((page, n, "symbol"))
    for page, n, kind in missing:
        print(f"{page}: {kind} not found: `{n}`")
    print(f"{len(missing)} not found")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
