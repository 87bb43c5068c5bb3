"""`python -m sglang.check_layering`: the package's intended layering, checked from its imports.

Rules (docs/architecture.md):
  * no import cycles anywhere in `python/sglang` (every `import`, `TYPE_CHECKING` ones included);
  * `srt.models` and `srt.layers` never import `srt.managers`;
  * `srt.mem_cache` never imports `srt.managers`, `srt.disaggregation` or `srt.entrypoints`;
  * `srt.disaggregation` never imports the scheduler module (`srt.managers.scheduler`): PD roles
    see the scheduler through the narrow facade of `srt.managers.server_role`.
Imports inside functions count as well: a lazy import is still an arrow.

Exit code 0 when clean; otherwise every cycle and upward arrow is printed and the exit code is 1.
"""

from __future__ import annotations

import ast
import pathlib
import sys
from typing import Dict, List, Set, Tuple

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent
FORBIDDEN = [
    ("sglang.srt.models", "sglang.srt.managers"),
    ("sglang.srt.layers", "sglang.srt.managers"),
    ("sglang.srt.mem_cache", "sglang.srt.managers"),
    ("sglang.srt.mem_cache", "sglang.srt.disaggregation"),
    ("sglang.srt.mem_cache", "sglang.srt.entrypoints"),
    ("sglang.srt.disaggregation", "sglang.srt.managers.scheduler"),
]


def module_files(root: pathlib.Path = PACKAGE_ROOT) -> Dict[str, pathlib.Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = ("sglang",) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve_relative(module: str, is_package: bool, level: int, name: str) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def import_graph(files: Dict[str, pathlib.Path]) -> Dict[str, Set[str]]:
    """module -> the package modules it imports (a `from pkg import mod` counts as pkg.mod)."""
    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        deps: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = _resolve_relative(module, path.name == "__init__.py", node.level, base)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files and "." in t:  # `import a.b.c` imports a.b.c (or its nearest module)
                    t = t.rsplit(".", 1)[0]
                if t in files and t != module:
                    deps.add(t)
        graph[module] = deps
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    cycles: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    return cycles


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def upward_imports(graph: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    bad = []
    for module, deps in graph.items():
        for dep in deps:
            if any(_within(module, a) and _within(dep, b) for a, b in FORBIDDEN):
                bad.append((module, dep))
    return sorted(bad)


def main() -> int:
    graph = import_graph(module_files())
    cycles, upward = find_cycles(graph), upward_imports(graph)
    for comp in cycles:
        print(f"import cycle ({len(comp)} modules): {' <-> '.join(comp)}")
    for module, dep in upward:
        print(f"upward import: {module} -> {dep}")
    if cycles or upward:
        return 1
    print(f"layering OK: {len(graph)} modules, no cycle, no upward import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
