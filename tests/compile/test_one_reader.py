"""Every file jaxaot reads goes through one reader, ``jaxaot._src.files.read_regular``.

The attack this closes: the op-cost tables were read with ``Path.read_text``,
skipping every check the cache makes (a FIFO there hung ``jax.grad``, a symlink
to ``/dev/zero`` ate 4 GiB). The test reads the package's source: no module
but ``jaxaot._src.files`` opens, reads or maps a file, or makes a temporary one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jaxaot

ROOT = Path(jaxaot.__file__).resolve().parent
#: Calls that open or read a file, by the attribute they call (``x.read_text()``, ``os.open(...)``, ...).
READING_ATTRIBUTES = {"open", "read_text", "read_bytes", "readv", "fdopen", "mkstemp", "memmap", "fromfile",
                      "NamedTemporaryFile", "TemporaryFile"}
#: ``module.function`` calls that read files.
READING_FUNCTIONS = {("os", "read"), ("json", "load"), ("pickle", "load"), ("np", "load"), ("numpy", "load"),
                     ("marshal", "load"), ("mmap", "mmap")}


def file_reads(source: str) -> list[tuple[int, str]]:
    """``(line, call)`` of each call in ``source`` that opens, reads or maps a file, in the source's order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            found.append((node.lineno, node.col_offset, "open"))
        elif isinstance(f, ast.Attribute):
            owner = f.value.id if isinstance(f.value, ast.Name) else None
            if f.attr in READING_ATTRIBUTES or (owner, f.attr) in READING_FUNCTIONS:
                found.append((node.lineno, node.col_offset, f"{owner or '...'}.{f.attr}"))
    return [(line, call) for line, _, call in sorted(found)]


def test_the_scan_finds_the_ways_files_are_read():
    old = ("record = json.loads(path.read_text())\nwith open(p) as f: json.load(f)\nfd = os.open(p, 0)\n"
           "os.read(fd, 9)\nwith path.open('rb') as f: pass\nnp.load(p)\n")
    assert [call for _, call in file_reads(old)] == ["path.read_text", "open", "json.load", "os.open", "os.read",
                                                     "path.open", "np.load"]
    assert file_reads("json.loads(text)\nos.replace(a, b)\nbytes(buf)\n") == []


def test_no_module_but_the_one_reader_opens_a_file():
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("_src", "files"):
            continue
        found = file_reads(path.read_text())
        if found:
            offenders[str(rel)] = found
    assert not offenders, f"files opened outside jaxaot._src.files (use read_regular / atomic_write): {offenders}"
