"""`python -m sglang.check_layering`: the package's intended layering, checked from its imports.

Rules (docs/architecture.md):
  * no import cycles anywhere in `python/sglang` (every `import`, `TYPE_CHECKING` ones included);
  * `srt.models` and `srt.layers` never import `srt.managers`;
  * `srt.mem_cache` never imports `srt.managers`, `srt.disaggregation` or `srt.entrypoints`;
  * `srt.disaggregation` never imports the scheduler module (`srt.managers.scheduler`): PD roles
    see the scheduler through the narrow facade of `srt.managers.server_role`.
Imports inside functions count as well: a lazy import is still an arrow.

And one rule on attribute reads, memory behind one door: outside `srt.mem_cache`, no code in
`srt` reaches the radix tree, the KV allocator, a tree node's lock count or the retraction store
(`.tree_cache`, `.allocator`, `.token_to_kv_pool_allocator`, `.lock_ref`, `.retraction_store`),
nor a pool through the memory manager (`memory.req_to_token_pool`, `.token_to_kv_pool`,
`.mamba_pool`): it asks `MemoryManager`, and the pools leave `mem_cache/` only as its
`DevicePools` record (for the forward and the KV transfer engines).

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


MEMORY_PACKAGE = "sglang.srt.mem_cache"
MEMORY_INTERNALS = ("tree_cache", "allocator", "token_to_kv_pool_allocator", "lock_ref", "retraction_store")
MEMORY_POOLS = ("req_to_token_pool", "token_to_kv_pool", "mamba_pool")  # private when read off the manager


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


def _is_memory_manager(node: ast.AST) -> bool:
    """`memory` or `<anything>.memory`: how the code names its MemoryManager."""
    return (isinstance(node, ast.Name) and node.id == "memory") or (isinstance(node, ast.Attribute)
                                                                     and node.attr == "memory")


def memory_internal_accesses(files: Dict[str, pathlib.Path]) -> List[Tuple[str, int, str]]:
    """(module, line, what) for every read of memory internals outside `srt.mem_cache`."""
    bad = []
    for module, path in files.items():
        if not _within(module, "sglang.srt") or _within(module, MEMORY_PACKAGE):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr in MEMORY_INTERNALS or (node.attr in MEMORY_POOLS and _is_memory_manager(node.value)):
                bad.append((module, node.lineno, f".{node.attr}"))
    return sorted(bad)


def main() -> int:
    files = module_files()
    graph = import_graph(files)
    cycles, upward, memory = find_cycles(graph), upward_imports(graph), memory_internal_accesses(files)
    for comp in cycles:
        print(f"import cycle ({len(comp)} modules): {' <-> '.join(comp)}")
    for module, dep in upward:
        print(f"upward import: {module} -> {dep}")
    for module, line, what in memory:
        print(f"memory internals outside mem_cache/: {module}:{line} reads {what} (ask MemoryManager)")
    if cycles or upward or memory:
        return 1
    print(f"layering OK: {len(graph)} modules, no cycle, no upward import, memory behind MemoryManager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
