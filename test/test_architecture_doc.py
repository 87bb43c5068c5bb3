"""docs/architecture.md stays true: every path it names exists, every `file.py::name` is defined in
that file, every `Class` / `Class.member` exists, every `sglang.x.y` module exists, and every other
identifier it quotes is defined somewhere in the package (or is one of upstream's JSON keys)."""

import ast
import builtins
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "python" / "sglang"
SRT = PKG / "srt"
DOC = ROOT / "docs" / "architecture.md"
# Quoted words that are wire / JSON names, not code names.
WIRE_WORDS = {"text", "output_ids", "meta_info", "usage", "chat.completion", "default", "bootstrap_host/port/room",
              "cpu_tensor", "host_pool", "none", "config.json", "max_new_tokens=1", "disable=True", "fcfs", "lpm"}


def _index():
    files = sorted(PKG.rglob("*.py"))
    classes, bases, names = {}, {}, set(dir(builtins))
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = classes.setdefault(node.name, set())
                bases.setdefault(node.name, set()).update(b.id for b in node.bases if isinstance(b, ast.Name))
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        members.add(item.name)
                    elif isinstance(item, ast.Assign):
                        members.update(t.id for t in item.targets if isinstance(t, ast.Name))
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    def with_bases(cls, seen=()):
        out = set(classes.get(cls, ()))
        for b in bases.get(cls, ()):
            if b not in seen:
                out |= with_bases(b, seen + (cls,))
        return out

    return files, {c: with_bases(c) for c in classes}, names


def _resolve(path_text: str, files):
    """A doc path: relative to srt/ (or sglang/ for 'sglang/...', or the repo for 'test/...'),
    else the one file or folder whose path ends with it."""
    p = path_text.rstrip("/")
    for base in (SRT, PKG.parent, ROOT):
        if (base / p).exists():
            return base / p
    hits = [f for f in files if str(f).endswith("/" + p)]
    hits += [d for d in SRT.rglob("*") if d.is_dir() and str(d).endswith("/" + p)]
    return hits[0] if hits else None


def test_every_name_in_the_architecture_doc_exists():
    files, classes, names = _index()
    text = DOC.read_text()
    quoted = re.findall(r"`([^`\n]+)`", text)
    # the diagram's file names count too
    block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    quoted += re.findall(r"[\w/]+\.py", block)
    missing = []
    for q in quoted:
        q = q.strip()
        if q.startswith(("-", "python ", "/")) or " " in q or q in WIRE_WORDS or "[" in q or q.startswith("@"):
            continue
        if "::" in q:
            file_part, name = q.split("::", 1)
            path = _resolve(file_part, files)
            if path is None or not re.search(rf"^\s*(def|class|async def) {re.escape(name)}\b", path.read_text(), re.M):
                missing.append(q)
        elif "/" in q or q.endswith(".py"):
            if _resolve(q, files) is None:
                missing.append(q)
        elif q.startswith("sglang."):
            mod = PKG.parent / q.replace(".", "/")
            owner, _, attr = q.rpartition(".")
            owner_file = PKG.parent / (owner.replace(".", "/") + ".py")
            if not owner_file.exists():
                owner_file = PKG.parent / owner.replace(".", "/") / "__init__.py"
            if not (mod.with_suffix(".py").exists() or mod.is_dir()
                    or (owner_file.exists() and re.search(rf"\b{attr}\b", owner_file.read_text()))):
                missing.append(q)
        elif re.fullmatch(r"[A-Z]\w*\.\w+", q):
            cls, member = q.split(".")
            if member not in classes.get(cls, set()):
                missing.append(q)
        elif re.fullmatch(r"[A-Z]\w*", q):
            if q not in classes and q not in dir(builtins):
                missing.append(q)
        elif re.fullmatch(r"[a-z_]\w*", q):
            if q not in names:
                missing.append(q)
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
