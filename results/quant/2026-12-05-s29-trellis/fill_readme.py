"""Rewrites README.md's table (between the table header line and the first blank line after it)
from table.py's output: python3 fill_readme.py"""
import subprocess

t = subprocess.run(["python3", "table.py"], capture_output=True, text=True, check=True).stdout
open("table.md", "w").write(t)
lines = open("README.md").read().split("\n")
i = next(k for k, l in enumerate(lines) if l.startswith("| model (trellis-3"))
j = next(k for k in range(i, len(lines)) if lines[k] == "")
lines[i:j] = t.rstrip("\n").split("\n")
open("README.md", "w").write("\n".join(lines))
