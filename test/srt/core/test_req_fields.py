"""Every attribute set on a `Req` anywhere in `sglang.srt` is declared in `Req.__init__`
(`srt/core/req.py`): a field attached at run time (as PD code and the cache once did) is invisible
to readers of the class, has no default on the paths that never set it, and invites
`getattr(req, name, default)`. Found from the source with `ast`, by how the code names requests:

  * receivers named `req`, `r`, `rq`, `last`, `victim`, or anything ending in `_req`
    (`self.chunked_req.x = ...`, `w.req.x = ...`);
  * loop variables over request lists and queues (`for x in self.running_reqs`, `..._queue`);
  * `self.x = ...` inside class `Req` itself, and `setattr(req, "x", ...)`;
  * writes into a request's sub-records (`req.pd.x`, `req.logprobs.x`, `req.grammar.x`), which
    must be fields of that record's dataclass (`PDTransfer`, `LogprobState`, `GrammarState`).

Names that hold something else in a file are listed in NOT_REQ with the reason.
"""

import ast
import dataclasses
import pathlib
import re
from typing import Iterator, Set, Tuple

from sglang.srt.core import req as req_module

SRT = pathlib.Path(req_module.__file__).resolve().parents[1]
REQ_NAMES = {"req", "r", "rq", "last", "victim"}
REQ_ITERABLE = re.compile(r"reqs\b|reqs\(\)|_queue\b")
# (file relative to srt/, name): objects of another type that happen to use a request-like name.
NOT_REQ: Set[Tuple[str, str]] = set()
# A request's sub-records (one owner each): their fields count as declared, as `record.field`.
SUB_RECORDS = {"kv": req_module.KVState, "pd": req_module.PDTransfer, "logprobs": req_module.LogprobState, "grammar": req_module.GrammarState}


def _receiver(node: ast.AST) -> str:
    """The last name of the object written to: `req` -> req, `self.chunked_req` -> chunked_req."""
    return ast.unparse(node).rsplit(".", 1)[-1]


def _is_req_name(name: str) -> bool:
    return name in REQ_NAMES or name.endswith("_req")


def _loop_req_names(tree: ast.AST) -> Set[str]:
    """Targets of `for x in <request list or queue>` (a literal tuple of queues is not one)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            if not isinstance(node.iter, (ast.Tuple, ast.List)) and REQ_ITERABLE.search(ast.unparse(node.iter)):
                names.add(node.target.id)
    return names


def _stores(node: ast.AST) -> Iterator[ast.Attribute]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                yield sub


def req_attribute_writes(source: str, rel: str) -> Iterator[Tuple[int, str, str]]:
    """(line, receiver, attribute) of every attribute written on a request in `source`."""
    tree = ast.parse(source)
    req_names = {n for n in REQ_NAMES | _loop_req_names(tree) if (rel, n) not in NOT_REQ}
    req_classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Req"]
    in_req_class = {id(n) for cls in req_classes for n in ast.walk(cls)}
    for node in ast.walk(tree):
        for attr in _stores(node):
            name = _receiver(attr.value)
            if (rel, name) in NOT_REQ:
                continue
            if name in SUB_RECORDS and isinstance(attr.value, ast.Attribute):
                owner = _receiver(attr.value.value)
                if owner in req_names or _is_req_name(owner):
                    yield node.lineno, owner, f"{name}.{attr.attr}"
                continue
            if name in req_names or _is_req_name(name) or (name == "self" and id(node) in in_req_class):
                yield node.lineno, name, attr.attr
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and (_receiver(node.args[0]) in req_names or _is_req_name(_receiver(node.args[0])))):
            yield node.lineno, _receiver(node.args[0]), node.args[1].value


def declared_fields() -> Set[str]:
    tree = ast.parse(pathlib.Path(req_module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Req")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    own = {a.attr for node in ast.walk(init) for a in _stores(node)
           if isinstance(a.value, ast.Name) and a.value.id == "self"}
    return own | {f"{name}.{f.name}" for name, cls in SUB_RECORDS.items() for f in dataclasses.fields(cls)}


def _all_writes():
    for path in sorted(SRT.rglob("*.py")):
        rel = str(path.relative_to(SRT))
        for line, name, attr in req_attribute_writes(path.read_text(), rel):
            yield f"{rel}:{line}", name, attr


def test_every_attribute_set_on_a_req_is_declared_in_its_init():
    declared = declared_fields()
    undeclared = [f"{where} {name}.{attr}" for where, name, attr in _all_writes() if attr not in declared]
    assert not undeclared, "declare these in Req.__init__ (srt/core/req.py):\n" + "\n".join(undeclared)


def test_the_scan_sees_the_writes_it_guards():
    """The scan is not vacuous: it finds the PD, cache, grammar and loop-variable writes."""
    seen = {(where.split(":")[0], attr) for where, _, attr in _all_writes()}
    for expected in [("disaggregation/prefill.py", "pd.kv_sender"), ("disaggregation/decode.py", "pd.kv_receiver"),
                     ("core/req.py", "_abort_reason"), ("constrained/grammar_manager.py", "grammar.matcher"),
                     ("managers/scheduler_output.py", "logprobs.sent_len"),
                     ("mem_cache/memory_manager.py", "kv.req_pool_idx"),
                     ("managers/scheduler_output.py", "is_chunked"), ("core/req.py", "num_retractions")]:
        assert expected in seen, expected
    assert {"rid", "pd.kv_sender", "kv.retraction_backup", "grammar", "grammar.matcher"} <= declared_fields()


def test_an_undeclared_attribute_is_reported():
    source = (
        "def f(req, batch, self):\n"
        "    req.bogus = 1\n"
        "    self.chunked_req.bogus_chunk += 1\n"
        "    setattr(req, 'bogus_set', 2)\n"
        "    for x in batch.reqs:\n"
        "        x.bogus_loop = 3\n"
        "    for q in (self.waiting_queue, self.running_reqs):\n"
        "        q.not_a_req = 4\n"
        "    other.fine = 5\n"
        "    req.pd.bogus_pd = 6\n"
        "    other.pd.fine = 7\n"
    )
    found = [attr for _, _, attr in req_attribute_writes(source, "x.py")]
    assert sorted(found) == ["bogus", "bogus_chunk", "bogus_loop", "bogus_set", "pd.bogus_pd"], found
    assert "pd.bogus_pd" not in declared_fields()
