"""Find import cycles among the modules of a package, from their source (nothing is imported).

Why: the layers of trio_llm import only downward (http -> client -> ipc -> engine), and a cycle
is where that stops holding. Python tolerates many cycles at run time, and a function-level
import hides one from a reader and from `python -c "import ..."` alike, so the graph is built
from the AST: every `import` and `from ... import` statement counts, at module level, inside a
function, or under `if TYPE_CHECKING:` (a type-only cycle still ties two layers together).

An edge goes to the module an import names, not to the packages above it (their `__init__`s
re-export, and every module would otherwise close a cycle through its package): `import a.b`
and `from a import b` (b a module) point at `a.b`; `from a.b import name` points at `a.b`.

Usage: python scripts/import_cycles.py [SRC_PACKAGE_DIR] [--ignore PREFIX ...]
Prints each cycle (a strongly connected component of the graph, with one shortest loop through
it and every import edge inside it, by file and line) and exits 1 if there is any; `--ignore`
leaves out components whose modules all start with PREFIX (reported as ignored, not counted).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "src" / "trio_llm"


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int
    where: str
    """'module', 'function' or 'type-checking': where the import statement stands."""


def module_names(root: Path) -> dict[str, Path]:
    """Every module under the package directory `root`, by dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _where(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return "function"
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return "type-checking"
    return "module"


def _base(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a (possibly relative) `from` import's module."""
    if level == 0:
        return name or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (level - 1)]
    return ".".join([*package, name] if name else package)


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every import of one module of `modules` by another (or by itself)."""
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _base(module, is_package, node.level, node.module)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            else:
                continue
            where = _where(node, parents)
            for target in dict.fromkeys(targets):
                if target in modules:
                    edges.append(Edge(module, target, path, node.lineno, where))
    return edges


def strongly_connected(nodes: Iterable[str], successors: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(successors.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(successors.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return sorted(components)


def shortest_loop(component: Sequence[str], successors: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module, as a list of modules."""
    start = component[0]
    members = set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(successors.get(node, ())):
            if child == start:
                loop = [node]
                while loop[-1] != start:
                    loop.append(came_from[loop[-1]])
                return [*reversed(loop), start]
            if child in members and child not in came_from:
                came_from[child] = node
                queue.append(child)
    return [start, start]


def cycles(edges: Sequence[Edge]) -> list[list[str]]:
    """The modules of each cycle: components of two or more, and modules importing themselves."""
    successors: dict[str, set[str]] = {}
    for edge in edges:
        successors.setdefault(edge.source, set()).add(edge.target)
    nodes = {e.source for e in edges} | {e.target for e in edges}
    return [
        component
        for component in strongly_connected(nodes, successors)
        if len(component) > 1 or component[0] in successors.get(component[0], ())
    ]


def report(component: Sequence[str], edges: Sequence[Edge], repo: Path) -> str:
    successors: dict[str, set[str]] = {}
    for edge in edges:
        successors.setdefault(edge.source, set()).add(edge.target)
    members = set(component)
    lines = [" -> ".join(shortest_loop(component, successors))]
    for edge in edges:
        if edge.source in members and edge.target in members:
            try:
                path = edge.path.relative_to(repo)
            except ValueError:
                path = edge.path
            imports = f"{edge.source} imports {edge.target} ({edge.where})"
            lines.append(f"    {path}:{edge.line}: {imports}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--ignore", action="append", default=[], metavar="PREFIX")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    edges = import_edges(module_names(root))
    found = cycles(edges)
    ignored = [c for c in found if args.ignore and all(m.startswith(tuple(args.ignore)) for m in c)]
    counted = [c for c in found if c not in ignored]
    repo = root.parents[1] if len(root.parents) > 1 else root
    for component in counted:
        print("cycle: " + report(component, edges, repo))
    for component in ignored:
        print("cycle (ignored): " + report(component, edges, repo))
    modules = len({e.source for e in edges} | {e.target for e in edges})
    print(
        f"{len(counted)} import cycle(s) among the {modules} modules of {root.name} that import "
        f"one another ({len(edges)} imports)"
        + (f"; {len(ignored)} ignored ({', '.join(args.ignore)})" if ignored else "")
    )
    return 1 if counted else 0


if __name__ == "__main__":
    sys.exit(main())
