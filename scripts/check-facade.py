#!/usr/bin/env python3
"""The facade an embedder reads in one sitting (#54): at most 40 names at the root of
`rdma_hint`, every public item reachable by one path (no whole crate or module re-exported,
no name meaning two things), and the error types it hands out (every `E` of a `Result` its
functions and methods return) at most three (the hint `Error`, `TransportError`,
`TransferError`), each nameable.

Reads the rustdoc HTML of the facade built with every feature; run after
`cargo doc -p rdma-hint --lib --no-deps --all-features`.
"""
import collections
import pathlib
import re
import sys

MAX_ROOT_NAMES = 40
MAX_ERROR_TYPES = 3
# Third-party crates handed out whole, on purpose: the cudarc the GPU paths are built with (an
# application allocates its `CudaSlice`s with that very version).
WHOLE_CRATES = {"cudarc"}


def whole_reexports(html):
    """What a page re-exports without listing it (`pub use x::y;` rustdoc did not inline),
    less the third-party crates allowed."""
    found = re.findall(r'<dt id="reexport\.(\w+)"><code>pub use ([^<]+);</code>', html)
    return [f"{name} ({what})" for name, what in found if name not in WHOLE_CRATES]

docs = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/doc/rdma_hint")
failures = []

root = (docs / "index.html").read_text()
for whole in whole_reexports(root):
    failures.append(f"the root re-exports {whole} whole: list its items instead")
names = sorted(set(re.findall(r'<dt><a class="(?:mod|struct|enum|trait|fn|type|constant|macro|union|traitalias|static)" href="[^"]+" title="\w+ rdma_hint::(\w+)"', root)))
print(f"{len(names)} names at the root (at most {MAX_ROOT_NAMES}): {' '.join(names)}")
if len(names) > MAX_ROOT_NAMES:
    failures.append(f"{len(names)} names at the root, more than {MAX_ROOT_NAMES}")

for page in sorted(docs.rglob("index.html")):
    if page != docs / "index.html":
        for whole in whole_reexports(page.read_text()):
            failures.append(f"{page.parent.relative_to(docs)} re-exports {whole} whole: list its items instead")

listed = re.findall(r'<li><a href="([^"]+)">([^<]+)</a></li>', (docs / "all.html").read_text())
paths = collections.defaultdict(list)
for _href, path in listed:
    paths[path.rsplit("::", 1)[-1]].append(path)
twice = {name: where for name, where in paths.items() if len(where) > 1}
for name, where in sorted(twice.items()):
    failures.append(f"`{name}` is reachable as {' and '.join(where)}: one path, one meaning")
print(f"{len(listed)} public items, each by one path" if not twice else f"{len(twice)} names by two paths")

# The error types an embedder handles: the `E` of every `Result<_, E>` a public function or
# method of the facade returns (the standard traits' associated errors aside).
STD_ERRORS = re.compile(r"(::Error|::Err)$|^(__|String$|CallerMemory$|IntoIter|NonZero)")


def returned_errors(html):
    """The error types of the `Result`s in a page's signatures."""
    found = set()
    for start in re.finditer(r'title="enum core::result::Result">Result</a>&lt;', html):
        at, depth, commas = start.end(), 1, []
        while depth and at < len(html):
            if html.startswith("&lt;", at):
                depth, at = depth + 1, at + 4
            elif html.startswith("&gt;", at):
                depth, at = depth - 1, at + 4
            else:
                if html[at] == "," and depth == 1:
                    commas.append(at)
                at += 1
        if commas:
            found.add(re.sub(r"<[^>]+>", "", html[commas[-1] + 1 : at - 4]).strip())
    return {name for name in found if not STD_ERRORS.search(name)}


errors = set()
for page in docs.rglob("*.html"):
    errors |= returned_errors(page.read_text())
named = {path.rsplit("::", 1)[-1] for _href, path in listed}
print(f"{len(errors)} error types handed out: {' '.join(sorted(errors))}")
# Error types carried inside those (a refusal's reason in `TransferError::Refused`), which
# no function hands out itself.
carried = {path.rsplit("::", 1)[-1] for href, path in listed if 'id="impl-Error-for-' in (docs / href).read_text()}
if carried - errors:
    print(f"carried inside them only: {' '.join(sorted(carried - errors))}")
unnamed = sorted(errors - named)
if unnamed:
    failures.append(f"returned but not reachable by any path: {' '.join(unnamed)}")
if len(errors) > MAX_ERROR_TYPES:
    failures.append(f"{len(errors)} error types handed out, more than {MAX_ERROR_TYPES}: {' '.join(sorted(errors))}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print("the facade holds")
