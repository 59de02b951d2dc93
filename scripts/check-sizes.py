#!/usr/bin/env python3
"""Every Rust file the repository tracks has at most 800 lines and every function in it at most
120 (#54's bounds: a file or function past them wants splitting into named parts). Functions
are read as rustfmt writes them: a `fn` line, its signature up to the `{` that opens its body
(a signature that ends in `;` has none), and the `}` that closes it at the `fn` line's
indentation. Prints each one over its bound, and each body whose end it cannot find, and
exits 1 if there is any."""
import os
import re
import subprocess
import sys

MAX_FILE_LINES = 800
MAX_FN_LINES = 120
FN = re.compile(r'^(\s*)(pub(\([^)]*\))?\s+)?(default\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"\w+"\s+)?fn\s+(\w+)')


def body_start(lines, start):
    """The line whose `{` opens the body of the fn declared at `start`; None if it has none
    (it ends in `;`) or its body closes on the line that opens it."""
    for at in range(start, len(lines)):
        code = lines[at].split("//")[0].rstrip()
        if code.endswith(";"):
            return None
        if code.endswith("{"):
            return at
        if code.endswith("}"):
            return None
    return None


listed = subprocess.run(["git", "ls-files", "-z", "*.rs"], capture_output=True, text=True, check=True).stdout
files = [path for path in listed.split("\0") if path and os.path.exists(path)]
problems = []
for path in files:
    with open(path, encoding="utf-8") as source:
        lines = source.read().splitlines()
    if len(lines) > MAX_FILE_LINES:
        problems.append(f"{path}: {len(lines)} lines (at most {MAX_FILE_LINES})")
    for start, line in enumerate(lines):
        found = FN.match(line)
        if not found or body_start(lines, start) is None:
            continue
        close = found.group(1) + "}"
        end = next(
            (at for at in range(start + 1, len(lines)) if lines[at].split("//")[0].rstrip() == close),
            None,
        )
        if end is None:
            problems.append(f"{path}:{start + 1}: fn {found.group(9)}: no closing brace at its indentation")
        elif end - start + 1 > MAX_FN_LINES:
            problems.append(f"{path}:{start + 1}: fn {found.group(9)} is {end - start + 1} lines (at most {MAX_FN_LINES})")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"{len(files)} Rust files of at most {MAX_FILE_LINES} lines, their functions of at most {MAX_FN_LINES}")
