#!/usr/bin/env python3
"""Every Rust file the repository tracks stays under 800 lines and every function in it at
120 lines or fewer (the style's bounds: a file or function past them wants splitting into named
parts). Functions are found as rustfmt writes them: a `fn` line, and the `}` that closes it at
the same indentation. Prints each one over its bound and exits 1 if there is any."""
import re
import subprocess
import sys

MAX_FILE_LINES = 800
MAX_FN_LINES = 120
FN = re.compile(r'^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')

files = subprocess.run(["git", "ls-files", "*.rs"], capture_output=True, text=True, check=True).stdout.split()
over = []
for path in files:
    with open(path, encoding="utf-8") as source:
        lines = source.read().splitlines()
    if len(lines) > MAX_FILE_LINES:
        over.append(f"{path}: {len(lines)} lines (at most {MAX_FILE_LINES})")
    for start, line in enumerate(lines):
        found = FN.match(line)
        if not found or line.rstrip().endswith(";"):
            continue
        close = found.group(1) + "}"
        end = next((at for at in range(start + 1, len(lines)) if lines[at].rstrip() == close), None)
        if end is not None and end - start + 1 > MAX_FN_LINES:
            over.append(f"{path}:{start + 1}: fn {found.group(8)} is {end - start + 1} lines (at most {MAX_FN_LINES})")
if over:
    print("\n".join(over))
    sys.exit(1)
print(f"{len(files)} Rust files within {MAX_FILE_LINES} lines, their functions within {MAX_FN_LINES}")
