"""The package's layers import one way (docs/ARCHITECTURE.md), and translating never loads the
training package."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transformer_mt"

# What each part may import from the package (besides itself); everything else is a violation.
# Floors, bottom up: errors, fileio, host_memory, text -> config -> devices, data, model,
# evaluation -> checkpoint, decoding -> engines, training -> documents, convert -> serve -> cli.
BASE = {"errors", "fileio", "config"}
LOWER = {"data", "model", "decoding", "checkpoint", "evaluation", "devices", "host_memory", "text"}
ALLOWED = {
    "errors": set(),
    "fileio": {"errors"},
    "text": {"errors"},
    "config": {"errors", "fileio"},
    "data": BASE,
    "model": BASE,
    "evaluation": BASE,
    "devices": {"errors", "config"},  # a device name's spelling: config.check_device_name
    "host_memory": set(),
    "checkpoint": BASE | {"data", "model"},
    "decoding": BASE | {"data", "model", "text"},
    # engines never import serve, documents, convert or training
    "engines": BASE | LOWER,
    "training": BASE | LOWER,
    # documents never import serve (nor torch: see test_torch_free_parts)
    "documents": BASE | {"engines", "text"},
    "convert": BASE | LOWER | {"engines"},
    # serve never imports training or convert
    "serve": BASE | LOWER | {"engines", "documents"},
    "cli": BASE | LOWER | {"engines", "documents", "convert", "serve", "training"},
    "__main__": {"cli"},
    "__init__": set(),
}


def _part(module: str) -> str:
    """The top-level part of a package module name: transformer_mt.data.prepare -> data."""
    return module.split(".")[1] if module.count(".") else "__init__"


def _module_name(path: Path) -> tuple[str, bool]:
    """A package file's module name, and whether it is a package's __init__ (which the name
    stands for): transformer_mt/data/__init__.py -> ("transformer_mt.data", True)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if package else parts), package


def _from_module(node: ast.ImportFrom, module: str, package: bool) -> str:
    """The absolute name of the module a ``from ... import`` reads, in the module ``module``.

    A relative one (``from .x import y``, ``from .. import z``) is resolved as Python resolves
    it: from the module's package (the module itself where it is a package's __init__)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if package else module.split(".")[:-1]
    if node.level > len(base):
        raise ValueError(f"{module}: `from {'.' * node.level}` goes above the package")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _import_statements(source: str, module: str, package: bool) -> list[tuple[str, list[str]]]:
    """Each import of ``source`` (the module ``module``) at any depth, lazy ones too, as (the
    module it reads, the names it takes from it: none for a plain ``import``); relative imports
    resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found.append((_from_module(node, module, package), [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return found


def _imports(path: Path) -> set[str]:
    """The transformer_mt modules a file imports, at any depth (lazy and relative imports too)."""
    statements = _import_statements(path.read_text(encoding="utf-8"), *_module_name(path))
    ours = {name for name, _ in statements}
    return {name for name in ours if name == "transformer_mt" or name.startswith("transformer_mt.")}


def test_imports_run_one_way():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        part = _part(".".join(relative.parts))
        for imported in _imports(path):
            target = _part(imported)
            # The package root holds only __version__: anyone may read it.
            if target not in (part, "__init__") and target not in ALLOWED[part]:
                violations.append(f"{relative}: {part} imports {imported}")
    assert violations == []


def test_translating_never_imports_training(tmp_path):
    fixture = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
    code = f"""
import sys
from typer.testing import CliRunner
from transformer_mt.cli import app
result = CliRunner().invoke(app, ["translate", "-c", {str(fixture / "old_last.pt")!r},
                                  "-i", {str(fixture / "src.txt")!r}, "--beam", "2"])
assert result.exit_code == 0, result.output
loaded = sorted(m for m in sys.modules if m.startswith("transformer_mt.training"))
print(loaded)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


MAX_BODY_LINES = 60
# The functions allowed a longer body, each with the most lines it may have and the reason in
# its docstring on a line 'Length: ...'. A new one is a decision, written down here.
LONG_FUNCTIONS = {
    # one loop over the output projection's blocks, which share their buffers
    "training/loss.py:_LinearLabelSmoothedNLL.forward": 120,
}


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring left out (a Typer command's options are its
    signature, not its body)."""
    body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
    return node.end_lineno - body[0].lineno + 1


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef]]:
    """Every function in ``tree`` with its qualified name (``Class.method``, ``outer.inner``)."""
    found: list = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                found.append((name, node))
            found += _functions(node, name + ".")
        else:
            found += _functions(node, prefix)
    return found


def _long_functions(files: dict[str, str], allowed: dict[str, int]) -> list[str]:
    """What breaks the length rule in ``files`` (a path in the package -> its source).

    A body over 60 lines that ``allowed`` does not name, that is longer than it allows, or whose
    docstring has no line 'Length: ...'; and an entry of ``allowed`` that names no long function
    (left behind)."""
    problems, seen = [], set()
    for path, source in sorted(files.items()):
        for name, node in _functions(ast.parse(source)):
            key, n = f"{path}:{name}", _body_lines(node)
            if n <= MAX_BODY_LINES:
                continue
            seen.add(key)
            said = "\nLength: " in "\n" + (ast.get_docstring(node) or "")
            if key not in allowed:
                problems.append(f"{key} has {n} lines: split it")
            elif n > allowed[key]:
                problems.append(f"{key} has {n} lines, more than its {allowed[key]}: split it")
            elif not said:
                problems.append(f"{key} has {n} lines: give the reason on a line 'Length: '")
    problems += [f"{key} is not a long function: drop it" for key in sorted(set(allowed) - seen)]
    return problems


def test_no_function_does_several_jobs():
    """No function body over 60 lines, but those LONG_FUNCTIONS names (within their lines, the
    reason in their docstrings)."""
    files = {
        str(path.relative_to(PACKAGE)): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    problems = _long_functions(files, LONG_FUNCTIONS)
    assert not problems, "split these, or write the exception down:\n" + "\n".join(problems)


def test_the_length_rule_counts_what_it_says():
    source = "def f():\n    '''Doc.\n\n    More.\n    '''\n" + "    x = 1\n" * 61
    node = ast.parse(source).body[0]
    assert _body_lines(node) == 61


def test_the_length_rule_allows_only_the_functions_it_names():
    body = "    x = 1\n" * 61
    said = '    """Doc.\n\n    Length: one loop.\n    """\n'
    indented = "".join("    " + line for line in (said + body).splitlines(keepends=True))
    files = {
        "a.py": "class C:\n    def f(self):\n" + indented,
        "b.py": "def g():\n" + said + body,
        "c.py": "def h():\n" + body,
    }
    assert _long_functions(files, {"a.py:C.f": 61, "b.py:g": 70}) == [
        "c.py:h has 61 lines: split it"
    ]
    assert _long_functions(files, {"a.py:C.f": 60, "b.py:g": 61, "c.py:h": 61, "d.py:k": 80}) == [
        "a.py:C.f has 61 lines, more than its 60: split it",
        "c.py:h has 61 lines: give the reason on a line 'Length: '",
        "d.py:k is not a long function: drop it",
    ]


def _summary_problem(doc: str) -> str | None:
    """What is wrong with a docstring's opening, or None when it opens with a one-line summary."""
    lines = doc.split("\n")
    if not lines[0].strip().endswith("."):
        return "its first line is not a sentence ending with a period"
    if len(lines) > 1 and lines[1].strip():
        return "no blank line after the one-line summary"
    return None


def _docstring_problems(source: str) -> list[str]:
    """``line name: problem`` for each module, class or function docstring of ``source`` that
    does not open with a one-line summary."""
    found = []
    tree = ast.parse(source)
    for node in [tree, *ast.walk(tree)]:
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node)
        problem = None if doc is None else _summary_problem(doc)
        if problem is not None:
            name = getattr(node, "name", "<module>")
            found.append(f"{getattr(node, 'lineno', 1)} {name}: {problem}")
    return sorted(set(found))


def test_every_docstring_opens_with_a_one_line_summary():
    """Module, class and function docstrings start with one line, a sentence, then a blank line."""
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{problem}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in _docstring_problems(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "open these docstrings with a one-line summary:\n" + "\n".join(bad)


def test_the_docstring_rule_flags_what_it_says():
    good = 'def f():\n    """Sum up.\n\n    More words\n    here.\n    """\n'
    assert _docstring_problems(good) == []
    run_on = 'class C:\n    """A summary.\n    More at once."""\n'
    assert _docstring_problems(run_on) == ["1 C: no blank line after the one-line summary"]
    wrapped = 'def g():\n    """A summary that\n    wraps."""\n'
    assert _docstring_problems(wrapped) == [
        "1 g: its first line is not a sentence ending with a period"
    ]
    no_period = '"""Module summary"""\n'
    assert _docstring_problems(no_period) == [
        "1 <module>: its first line is not a sentence ending with a period"
    ]


def _module_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports (lazy imports included; a package's
    name stands for its __init__)."""
    modules = {_module_name(path)[0]: path for path in sorted(PACKAGE.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        found = set()
        source = path.read_text(encoding="utf-8")
        for module, names in _import_statements(source, *_module_name(path)):
            # `from package import module` imports the module
            found |= {f"{module}.{n}" for n in names} & modules.keys()
            found.add(module)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    """No circle of imports between modules (lazy imports count: they hide a circle, not cut it).

    A package's __init__ that re-exports its modules is left out (its modules never import it)."""
    graph = _module_graph()
    packages = {name for name in graph if (PACKAGE.parent / name.replace(".", "/")).is_dir()}
    graph = {name: targets - packages for name, targets in graph.items() if name not in packages}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_relative_imports_are_read_as_the_modules_they_name():
    source = "from . import lines\nfrom .options import X\nfrom ..config import Y\nimport os\n"
    module = "transformer_mt.engines.torch_engine"
    assert _import_statements(source, module, package=False) == [
        ("transformer_mt.engines", ["lines"]),
        ("transformer_mt.engines.options", ["X"]),
        ("transformer_mt.config", ["Y"]),
        ("os", []),
    ]
    package = _import_statements("from .base import Engine\n", "transformer_mt.engines", True)
    assert package == [("transformer_mt.engines.base", ["Engine"])]
    with pytest.raises(ValueError, match="above the package"):
        _import_statements("from ... import x\n", "transformer_mt.cli", package=False)


# Parts that load without torch: documents are read, pasted text cut, and the commands' and the
# server's options parsed, before (or without) a model. Every module of these packages ...
TORCH_FREE_PACKAGES = ["config", "documents", "text"]
# ... and these modules (the command line: `mt --help` and a mistyped option load no torch).
TORCH_FREE_MODULES = [
    "transformer_mt.cli",
    "transformer_mt.engines.alignment",
    "transformer_mt.engines.options",
    "transformer_mt.engines.results",
    "transformer_mt.serve.settings",
]


def _torch_free() -> list[str]:
    """The modules that load without torch: those of TORCH_FREE_PACKAGES, and
    TORCH_FREE_MODULES."""
    in_packages = [
        _module_name(path)[0]
        for part in TORCH_FREE_PACKAGES
        for path in sorted((PACKAGE / part).rglob("*.py"))
    ]
    return [*in_packages, *TORCH_FREE_MODULES]


def test_torch_free_parts():
    modules = _torch_free()
    assert {"transformer_mt.text.split", "transformer_mt.documents.limits"} <= set(modules)
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


BENCHMARKS_MAX_BYTES = 30_000


def test_the_benchmarks_page_stays_short():
    """docs/BENCHMARKS.md holds the current numbers and how to rerun them, within 30,000 bytes:
    a new measurement replaces an old one rather than adding to the page."""
    size = (PACKAGE.parent / "docs" / "BENCHMARKS.md").stat().st_size
    assert size <= BENCHMARKS_MAX_BYTES, f"docs/BENCHMARKS.md is {size} bytes: shorten it"


def _mapped_files(doc: str) -> set[str]:
    """The module files the map in ARCHITECTURE.md names, relative to the package.

    The map is the first code block. A line starting in column 0 with ``name/`` opens a folder; a
    bare ``file.py`` belongs to the folder open at that line (or, where that folder has no such
    file, to the package's top: ``host_memory.py`` named in training's lines), ``folder/file.py``
    to the package."""
    block = doc.split("```\n", 2)[1]
    folder, named = "", set()
    for line in block.splitlines():
        opened = re.match(r"(\w+)/(\s|$)", line)
        if opened:
            folder = opened.group(1) + "/"
        elif line[:1] not in ("", " "):
            folder = ""  # a file at the package's top, e.g. checkpoint.py
        for token in re.findall(r"(?<![\w./])((?:\w+/)*\w+\.py)\b", line):
            if "/" not in token and (PACKAGE / folder / token).exists():
                token = folder + token
            named.add(token)
    return named


def test_the_architecture_map_names_every_module_and_only_modules_that_exist():
    doc = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = _mapped_files(doc)
    tree = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }
    assert sorted(named - tree) == [], "the map names files that do not exist"
    assert sorted(tree - named) == [], "the map leaves these modules out"
