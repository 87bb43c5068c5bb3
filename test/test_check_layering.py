"""`python -m sglang.check_layering`: the package's layering holds, and the checker does catch a cycle
and an upward arrow of every rule (on a throw-away package tree). Plus the two source rules of issue 14: no
`getattr(req, ...)` and no `getattr(server_args, name, default)` outside ServerArgs itself."""

import ast
import pathlib
import subprocess
import sys

from sglang import check_layering

SRC = pathlib.Path(check_layering.__file__).resolve().parent


def test_package_layering_is_clean():
    out = subprocess.run([sys.executable, "-m", "sglang.check_layering"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("layering OK:")


def _write(root: pathlib.Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in [path.parent, *path.parent.parents]:
        if parent == root.parent:
            break
        (parent / "__init__.py").touch()
    path.write_text(text)


def test_checker_finds_cycles_and_upward_imports(tmp_path):
    root = tmp_path / "sglang"
    _write(root, "srt/managers/scheduler.py", "from sglang.srt.disaggregation import decode\n")
    _write(root, "srt/disaggregation/decode.py", "def f():\n    from sglang.srt.managers import scheduler  # lazy: still an arrow\n")
    _write(root, "srt/mem_cache/pool.py", "import sglang.srt.entrypoints.http\n")
    _write(root, "srt/entrypoints/http.py", "")
    _write(root, "srt/models/m.py", "from ..managers.scheduler import X\n")
    _write(root, "srt/layers/linear.py", "import sglang.srt.managers.scheduler\n")
    _write(root, "srt/mem_cache/radix.py", "from sglang.srt.managers.scheduler import Scheduler\n")
    _write(root, "srt/mem_cache/backup.py", "def f():\n    from sglang.srt.disaggregation.decode import g\n")
    # Allowed arrows (downward): not reported.
    _write(root, "srt/configs/slices.py", "")
    _write(root, "srt/mem_cache/host.py", "from sglang.srt.configs.slices import X\n")
    _write(root, "srt/layers/attn.py", "from sglang.srt.mem_cache import host\n")
    graph = check_layering.import_graph(check_layering.module_files(root))
    cycles = check_layering.find_cycles(graph)
    assert cycles == [["sglang.srt.disaggregation.decode", "sglang.srt.managers.scheduler"]]
    # One arrow per rule, each reported, and nothing else.
    assert check_layering.upward_imports(graph) == sorted([
        ("sglang.srt.disaggregation.decode", "sglang.srt.managers.scheduler"),
        ("sglang.srt.layers.linear", "sglang.srt.managers.scheduler"),
        ("sglang.srt.mem_cache.backup", "sglang.srt.disaggregation.decode"),
        ("sglang.srt.mem_cache.pool", "sglang.srt.entrypoints.http"),
        ("sglang.srt.mem_cache.radix", "sglang.srt.managers.scheduler"),
        ("sglang.srt.models.m", "sglang.srt.managers.scheduler"),
    ])


def test_checker_finds_memory_internals_outside_mem_cache(tmp_path):
    """Each forbidden read outside mem_cache/ is reported: the tree, the allocator, a node's lock
    count, the retraction store, and a pool read off the memory manager; the same reads inside
    mem_cache/, a pool read off the DevicePools record, and code outside srt/ are not."""
    root = tmp_path / "sglang"
    _write(root, "srt/managers/policy.py", "def f(memory):\n    return memory.tree_cache.evictable_size()\n")
    _write(root, "srt/disaggregation/decode.py", "def f(self):\n    return self.s.memory.allocator.available_size()\n")
    _write(root, "srt/managers/adder.py", "def f(node):\n    return node.lock_ref == 0\n")
    _write(root, "srt/disaggregation/role.py", "def f(m):\n    return m.retraction_store.abort_reason()\n")
    _write(root, "srt/disaggregation/prefill.py", "def f(self):\n    return self.memory.req_to_token_pool\n")
    _write(root, "srt/model_executor/runner.py", "def f(memory):\n    return memory.mamba_pool, memory.token_to_kv_pool\n")
    _write(root, "srt/managers/alloc.py", "def f(x):\n    return x.token_to_kv_pool_allocator\n")
    # Allowed: inside mem_cache/, the DevicePools record, the forward batch's pools, outside srt/.
    _write(root, "srt/mem_cache/memory_manager.py", "def f(self):\n    return self.tree_cache, self.allocator\n")
    _write(root, "srt/model_executor/ok.py", "def f(pools, fb):\n    return pools.token_to_kv_pool, fb.mamba_pool\n")
    _write(root, "test/util.py", "def f(sched):\n    return sched.memory.allocator\n")
    bad = check_layering.memory_internal_accesses(check_layering.module_files(root))
    assert bad == sorted([
        ("sglang.srt.disaggregation.decode", 2, ".allocator"),
        ("sglang.srt.disaggregation.prefill", 2, ".req_to_token_pool"),
        ("sglang.srt.disaggregation.role", 2, ".retraction_store"),
        ("sglang.srt.managers.adder", 2, ".lock_ref"),
        ("sglang.srt.managers.alloc", 2, ".token_to_kv_pool_allocator"),
        ("sglang.srt.managers.policy", 2, ".tree_cache"),
        ("sglang.srt.model_executor.runner", 2, ".mamba_pool"),
        ("sglang.srt.model_executor.runner", 2, ".token_to_kv_pool"),
    ])


SERVER_ARGS_NAMES = {"server_args", "sa", "args"}
SERVER_ARGS_HOME = {"check_server_args.py"}  # and every file of srt/server_args/


def _receiver_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def test_no_defensive_getattr_on_requests_or_server_args():
    bad = []
    for path in SRC.rglob("*.py"):
        if "/test/" in str(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"):
                continue
            receiver = _receiver_name(node.args[0]) if node.args else ""
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            if receiver in ("req", "r"):
                bad.append(f"{where} getattr({receiver}, ...)")
            elif receiver in SERVER_ARGS_NAMES and len(node.args) == 3 and path.name not in SERVER_ARGS_HOME and "srt/server_args/" not in str(path):
                bad.append(f"{where} getattr({receiver}, name, default)")
    assert not bad, "declared fields are read directly:\n" + "\n".join(bad)
