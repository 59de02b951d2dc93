#!/usr/bin/env python3
"""The facade an embedder reads in one sitting (#54): at most 40 names at the root of
`rdma_hint`, every public item reachable by one path (no whole crate or module re-exported,
no name meaning two things), and the error types it hands out counted.

Reads the rustdoc HTML of the facade built with every feature; run after
`cargo doc -p rdma-hint --lib --no-deps --all-features`.
"""
import collections
import pathlib
import re
import sys

MAX_ROOT_NAMES = 40
MAX_ERROR_TYPES = 3
# The error types that are not yet folded into the three (hint `Error`, `TransportError`,
# `TransferError`): what is left of #54's item 4. The check fails if any other appears, and
# reports these until they are gone.
NOT_YET_FOLDED = {"HintError", "PlanError", "RequestError", "Refused", "TransportIdError"}
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

errors = sorted(
    path
    for href, path in listed
    if re.search(r'id="impl-Error-for-', (docs / href).read_text())
)
print(f"{len(errors)} error types: {' '.join(errors)}")
unexpected = [e for e in errors if e.rsplit("::", 1)[-1] not in NOT_YET_FOLDED]
if len(unexpected) > MAX_ERROR_TYPES:
    failures.append(f"{len(unexpected)} error types besides those still to fold: {' '.join(unexpected)}")
left = [e for e in errors if e.rsplit("::", 1)[-1] in NOT_YET_FOLDED]
if left:
    print(f"still to fold into the three (#54): {' '.join(left)}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print("the facade holds")
