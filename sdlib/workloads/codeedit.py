"""A deterministic code-editing workload derived from the Python standard library.

InstructCoder-like triples (instruction, input code, edited output) where the
output copies most of the input: functions and methods of 8-60 lines are parsed
with :mod:`ast` from the standard library's own ``.py`` files, and each gets one
mechanical edit whose result is fully determined by the instruction:

- ``rename_variable``: rename a local variable or parameter everywhere in the function;
- ``rename_function``: rename the function (and its recursive calls);
- ``add_docstring``: insert a given one-line docstring;
- ``change_constant``: change every occurrence of an integer literal.

An edit is only made when every textual occurrence of the old word is exactly the
syntax node being edited (no mentions in strings, comments or attributes), so
the output is a plain word substitution of the input (or one inserted line).

The sample depends on ``seed`` and on the stdlib sources of the running Python
(file lists are sorted, so file-system order does not matter; a patch release
that edits a stdlib file changes the examples drawn from that file only).

Usage:
    sdlib codeedit 3 --seed 0          # print 3 examples as JSON lines
    from sdlib.workloads.codeedit import generate_code_edits
    rows = generate_code_edits(500, seed=42)      # [{'id', 'instruction', 'input', 'output', ...}]
"""

from __future__ import annotations

import ast
import builtins
import functools
import itertools
import keyword
import os
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

#: The edit kinds, in a fixed order (each function gets the first that applies
#: from a per-function shuffle of this tuple).
EDIT_KINDS: tuple[str, ...] = ("rename_variable", "rename_function", "add_docstring", "change_constant")
#: Function length bounds in lines (decorators included).
MIN_LINES, MAX_LINES = 8, 60
#: Functions taken from each file per pass over the (shuffled) file list: keeps
#: consecutive examples from different modules.
PER_FILE_PER_PASS = 2
#: The instruction suffix used by InstructCoder in the paper.

_EXCLUDED_DIRS = {
    "test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages", "dist-packages",
    "__pycache__", "ensurepip", "encodings", "pydoc_data", "lib-dynload", "__phello__",
}
_BUILTINS = frozenset(dir(builtins))

# Readable replacements; anything else falls back to a suffixed/prefixed name.
_VAR_SYNONYMS = {
    "i": "idx", "j": "jdx", "k": "key_", "n": "count", "s": "text", "x": "value", "c": "char",
    "f": "fobj", "fp": "file_obj", "d": "mapping", "l": "items", "e": "exc", "v": "val",
    "result": "res", "res": "result_value", "data": "payload", "name": "label", "path": "file_path",
    "line": "text_line", "lines": "text_lines", "key": "dict_key", "value": "val", "values": "vals",
    "args": "arguments", "kwargs": "keyword_args", "items": "entries", "item": "entry",
    "index": "position", "obj": "target", "msg": "message", "buf": "buffer", "size": "length",
    "start": "begin", "end": "stop", "parts": "pieces", "text": "content", "node": "current_node",
}
_VERB_SYNONYMS = {
    "get": "fetch", "set": "assign", "make": "build", "create": "build", "read": "load",
    "write": "save", "find": "locate", "remove": "delete", "check": "verify", "compute": "calculate",
    "format": "render", "handle": "process", "update": "refresh", "load": "read", "parse": "decode",
    "add": "insert", "is": "check_is", "has": "check_has", "to": "convert_to", "open": "open_",
    "close": "shutdown", "run": "execute", "start": "begin", "init": "setup", "copy": "clone",
}


@dataclass(frozen=True)
class _Func:
    """A function's source, dedented so that its ``def`` starts at column 0."""

    file: str  # path relative to the stdlib root (posix)
    qualname: str
    source: str


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=4)
def stdlib_files(root: Optional[str] = None) -> tuple[str, ...]:
    """Sorted relative paths (posix) of the stdlib ``.py`` files used as sources."""
    base = Path(root) if root else stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith("config-"))
        for fn in filenames:
            if not fn.endswith(".py") or fn.startswith(("test_", "_sysconfigdata")):
                continue
            out.append(Path(dirpath, fn).relative_to(base).as_posix())
    return tuple(sorted(out))


def _dedent_exact(lines: list[str]) -> Optional[str]:
    """Strip the first line's indentation from every line; None if a line has less."""
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip(" "))]
    out = []
    for ln in lines:
        if not ln.strip():
            out.append("\n")
        elif ln.startswith(indent):
            out.append(ln[len(indent):])
        else:
            return None
    return "".join(out)


_DEF_RE = re.compile(r"(?:async[ \t]+)?def[ \t]+(\w+)")
_CLASS_RE = re.compile(r"class[ \t]+(\w+)")


def _functions_in(rel: str, root: Path) -> list[_Func]:
    """Candidate top-level functions and methods of one file, in source order.

    A line scan, not a full parse (parsing every file costs seconds): a ``def``
    at column 0, or at column 4 under a column-0 ``class``, runs until the next
    code line indented as little as it. Candidates whose snippet does not parse
    to exactly that function are dropped later, in :func:`make_edits`.
    """
    try:
        text = (root / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    lines = text.splitlines(keepends=True)
    code = [bool(ln.strip()) and not ln.lstrip().startswith("#") for ln in lines]
    indent = [len(ln) - len(ln.lstrip(" ")) for ln in lines]
    out: list[_Func] = []
    seen: dict[str, int] = {}
    top_class: Optional[str] = None
    for i, ln in enumerate(lines):
        if not code[i]:
            continue
        body = ln[indent[i]:]
        if indent[i] == 0 and not body.startswith(("@", ")", "]", "}")):
            m = _CLASS_RE.match(body)
            top_class = m.group(1) if m else None
        m = _DEF_RE.match(body)
        if not m or indent[i] not in (0, 4) or (indent[i] == 4 and top_class is None):
            continue
        qual = m.group(1) if indent[i] == 0 else f"{top_class}.{m.group(1)}"
        start = i
        while start > 0 and code[start - 1] and lines[start - 1].startswith(" " * indent[i] + "@"):
            start -= 1
        end = i  # last code line of the function
        for j in range(i + 1, len(lines)):
            if not code[j]:
                continue
            if indent[j] <= indent[i] and not lines[j][indent[j]:].startswith((")", "]", "}")):
                break
            end = j
        if not (MIN_LINES <= end - start + 1 <= MAX_LINES):
            continue
        src = _dedent_exact(lines[start:end + 1])
        if src is None or not src.isascii() or "\t" in src or "\\\n" in src:
            continue
        seen[qual] = seen.get(qual, 0) + 1
        name = qual if seen[qual] == 1 else f"{qual}#{seen[qual]}"  # property setters etc.
        out.append(_Func(rel, name, src if src.endswith("\n") else src + "\n"))
    return out


# ---------------------------------------------------------------------------
# Positions: an edit is made only when the regex matches and the AST nodes agree.

def _line_starts(src: str) -> list[int]:
    starts, pos = [0], 0
    for ln in src.splitlines(keepends=True):
        pos += len(ln)
        starts.append(pos)
    return starts


def _word_re(word: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w]){re.escape(word)}(?![\w])")


def _int_re(value: int) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){value}(?![\w.])")


def _match_offsets(pattern: re.Pattern[str], src: str) -> set[int]:
    return {m.start() for m in pattern.finditer(src)}


def _in_fstring(tree: ast.AST) -> set[int]:
    """ids of nodes inside f-strings (their positions are unreliable before 3.12)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.update(id(n) for n in ast.walk(node))
    return out


def _own_scope(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested defs, lambdas or classes."""
    stack = list(fn.body)  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _fn_name(fn: ast.AST) -> str:
    return fn.name  # type: ignore[attr-defined]


def _kind_word(fn: ast.AST, qualname: str) -> str:
    return "method" if "." in qualname.split("#")[0] else "function"


def _new_var_name(old: str, used: set[str], rng: random.Random) -> Optional[str]:
    opts = []
    if old in _VAR_SYNONYMS:
        opts.append(_VAR_SYNONYMS[old])
    core = old.strip("_")
    lead = old[: len(old) - len(old.lstrip("_"))]
    if "_" in core:
        parts = core.split("_")
        opts.append(lead + parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:]))
    opts += [f"{old}_value", f"new_{core}" if not lead else f"{lead}new_{core}", f"{old}_obj"]
    opts = [o for o in opts if o.isidentifier() and not keyword.iskeyword(o)
            and o not in _BUILTINS and o not in used and o != old]
    return rng.choice(opts) if opts else None


def _new_func_name(old: str, used: set[str], rng: random.Random) -> Optional[str]:
    lead = old[: len(old) - len(old.lstrip("_"))]
    core = old.lstrip("_")
    parts = core.split("_")
    opts = []
    if parts[0] in _VERB_SYNONYMS and len(parts) > 1:
        opts.append(lead + "_".join([_VERB_SYNONYMS[parts[0]]] + parts[1:]))
    opts += [f"{old}_impl", f"{lead}do_{core}", f"{old}_helper"]
    opts = [o for o in opts if o.isidentifier() and not keyword.iskeyword(o)
            and o not in _BUILTINS and o not in used and o != old]
    return rng.choice(opts) if opts else None


def _identifiers(src: str) -> set[str]:
    """Every identifier-like word in ``src`` (strings and comments included)."""
    return set(re.findall(r"[A-Za-z_]\w*", src))


# ---------------------------------------------------------------------------
# The edits. Each returns (instruction, output, details) or None.

def _edit_rename_variable(f: _Func, tree: ast.Module, rng: random.Random):
    fn = tree.body[0]
    src = f.source
    starts = _line_starts(src)
    bad = _in_fstring(tree)
    a = fn.args  # type: ignore[attr-defined]
    params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    # names bound in the function's own scope: every read of them inside the
    # function then refers to this binding (or to a nested one renamed alike)
    bound = set(params) | {n.id for n in _own_scope(fn)
                           if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names = sorted(n for n in bound if n not in ("self", "cls") and n != _fn_name(fn))
    rng.shuffle(names)
    used = _identifiers(src)
    for old in names:
        nodes = [n for n in ast.walk(fn)
                 if (isinstance(n, ast.Name) and n.id == old) or (isinstance(n, ast.arg) and n.arg == old)]
        if len(nodes) < 2 or any(id(n) in bad for n in nodes):
            continue
        node_pos = {starts[n.lineno - 1] + n.col_offset for n in nodes}
        if node_pos != _match_offsets(_word_re(old), src):
            continue
        new = _new_var_name(old, used, rng)
        if new is None:
            continue
        out = _word_re(old).sub(new, src)
        what = "parameter" if old in params else "variable"
        instr = f"Rename the {what} `{old}` to `{new}` in the {_kind_word(fn, f.qualname)} `{_fn_name(fn)}`."
        return instr, out, {"old": old, "new": new}
    return None


def _edit_rename_function(f: _Func, tree: ast.Module, rng: random.Random):
    fn = tree.body[0]
    old = _fn_name(fn)
    if old.startswith("__") and old.endswith("__"):
        return None
    src = f.source
    starts = _line_starts(src)
    bad = _in_fstring(tree)
    refs = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == old]
    if any(id(n) in bad for n in refs):
        return None
    def_line = src.splitlines(keepends=True)[fn.lineno - 1]
    m = re.match(rf"(\s*(?:async\s+)?def\s+){re.escape(old)}\b", def_line)
    if not m:
        return None
    pos = {starts[fn.lineno - 1] + m.end(1)} | {starts[n.lineno - 1] + n.col_offset for n in refs}
    if pos != _match_offsets(_word_re(old), src):
        return None
    new = _new_func_name(old, _identifiers(src), rng)
    if new is None:
        return None
    out = _word_re(old).sub(new, src)
    kind = _kind_word(fn, f.qualname)
    extra = " and update its recursive calls" if refs else ""
    return f"Rename the {kind} `{old}` to `{new}`{extra}.", out, {"old": old, "new": new}


def _docstring_text(fn: ast.AST, rng: random.Random) -> str:
    name = _fn_name(fn)
    if name == "__init__":
        return "Initialize the instance."
    if name.startswith("__") and name.endswith("__"):
        return f"Implement the {name} protocol."
    words = [w for w in re.sub(r"([a-z])([A-Z])", r"\1_\2", name).strip("_").split("_") if w]
    phrase = " ".join(w.lower() for w in words) or name
    args = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]  # type: ignore[attr-defined]
    templates = [f"{phrase[:1].upper()}{phrase[1:]}.", f"Helper that handles {phrase}."]
    if args:
        templates.append(f"{phrase[:1].upper()}{phrase[1:]} using {', '.join(args[:3])}.")
    return rng.choice(templates)


def _edit_add_docstring(f: _Func, tree: ast.Module, rng: random.Random):
    fn = tree.body[0]
    if ast.get_docstring(fn, clean=False) is not None:
        return None
    first = fn.body[0]  # type: ignore[attr-defined]
    first_line = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    if first_line <= fn.lineno:  # one-line body on the def line
        return None
    lines = f.source.splitlines(keepends=True)
    # the signature must end on the line just before the body (no comments in between)
    if not lines[first_line - 2].rstrip().endswith(":"):
        return None
    target = lines[first_line - 1]
    indent = target[: len(target) - len(target.lstrip(" "))]
    doc = _docstring_text(fn, rng)
    new_line = f'{indent}"""{doc}"""\n'
    out = "".join(lines[: first_line - 1] + [new_line] + lines[first_line - 1:])
    kind = _kind_word(fn, f.qualname)
    instr = f'Add the docstring "{doc}" to the {kind} `{_fn_name(fn)}`.'
    return instr, out, {"docstring": doc, "line": first_line}


def _edit_change_constant(f: _Func, tree: ast.Module, rng: random.Random):
    fn = tree.body[0]
    src = f.source
    starts = _line_starts(src)
    bad = _in_fstring(tree)
    by_value: dict[int, list[ast.Constant]] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Constant) and type(n.value) is int and abs(n.value) >= 2:
            by_value.setdefault(n.value, []).append(n)
    values = sorted(by_value)
    rng.shuffle(values)
    for v in values:
        nodes = by_value[v]
        if any(id(n) in bad for n in nodes):
            continue
        if any(ast.get_source_segment(src, n) != str(v) for n in nodes):
            continue
        if {starts[n.lineno - 1] + n.col_offset for n in nodes} != _match_offsets(_int_re(v), src):
            continue
        opts = [m for m in (v * 2, v + 1, v * 10, v - 1, v + 10) if m >= 2 and m != v]
        opts = [m for m in opts if not _int_re(m).search(src)]
        if not opts:
            continue
        new = rng.choice(opts)
        out = _int_re(v).sub(str(new), src)
        kind = _kind_word(fn, f.qualname)
        which = "every occurrence of the constant" if len(nodes) > 1 else "the constant"
        instr = f"Change {which} {v} to {new} in the {kind} `{_fn_name(fn)}`."
        return instr, out, {"old": v, "new": new, "count": len(nodes)}
    return None


_EDITS = {
    "rename_variable": _edit_rename_variable,
    "rename_function": _edit_rename_function,
    "add_docstring": _edit_add_docstring,
    "change_constant": _edit_change_constant,
}


def make_edits(f: _Func, seed: int, kinds: tuple[str, ...] = EDIT_KINDS, limit: int = 1) -> list[dict]:
    """Up to ``limit`` examples (of different kinds) for one function; [] when none applies."""
    rng = random.Random(f"codeedit:{seed}:{f.file}:{f.qualname}")
    try:
        tree = ast.parse(f.source)
    except SyntaxError:
        return []
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name != f.qualname.split("#")[0].split(".")[-1]:
        return []
    if (fn.end_lineno or 0) != len(f.source.splitlines()):  # the line scan took too much
        return []
    order = list(kinds)
    rng.shuffle(order)
    out = []
    for kind in order:
        res = _EDITS[kind](f, tree, rng)
        if res is None:
            continue
        instr, edited, details = res
        if edited == f.source:
            continue
        try:
            ast.parse(edited)
        except SyntaxError:  # never expected; be safe
            continue
        out.append({
            "id": f"{f.file}::{f.qualname}::{kind}",
            "instruction": instr,
            "input": f.source,
            "output": edited,
            "kind": kind,
            "edit": details,
        })
        if len(out) >= limit:
            break
    return out


def iter_code_edits(seed: int = 0, kinds: tuple[str, ...] = EDIT_KINDS, edits_per_function: int = 1,
                    root: Optional[str | os.PathLike[str]] = None) -> Iterator[dict]:
    """Yield examples in a deterministic order.

    Each function gives at most ``edits_per_function`` examples, each of a
    different kind (1 gives ~5,000 examples on CPython 3.11; up to 4 gives more,
    with inputs repeated).

    Files are shuffled by ``seed``; each pass takes the next
    :data:`PER_FILE_PER_PASS` functions (in a per-file seeded order) from every
    file, so the first examples come from many modules. ``generate_code_edits(n)``
    is always a prefix of ``generate_code_edits(m)`` for ``m > n``.
    """
    unknown = set(kinds) - set(EDIT_KINDS)
    if unknown:
        raise ValueError(f"unknown edit kinds {sorted(unknown)}; choose from {EDIT_KINDS}")
    if edits_per_function < 1:
        raise ValueError("edits_per_function must be >= 1")
    base = Path(root) if root else stdlib_root()
    order = list(stdlib_files(str(base)))
    random.Random(seed).shuffle(order)
    funcs: dict[str, list[_Func]] = {}
    for p in itertools.count():
        took = False
        for rel in order:
            if rel not in funcs:
                fl = _functions_in(rel, base)
                random.Random(f"codeedit-file:{seed}:{rel}").shuffle(fl)
                funcs[rel] = fl
            chunk = funcs[rel][p * PER_FILE_PER_PASS:(p + 1) * PER_FILE_PER_PASS]
            for f in chunk:
                took = True
                yield from make_edits(f, seed, kinds, edits_per_function)
        if not took:
            return


def generate_code_edits(n: int, seed: int = 0, kinds: tuple[str, ...] = EDIT_KINDS,
                        edits_per_function: int = 1) -> list[dict]:
    """``n`` examples (fewer only if the stdlib runs out) with keys id, instruction,
    input, output, kind, edit (the edit's parameters, e.g. ``{"old": "x", "new": "y"}``)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return list(itertools.islice(iter_code_edits(seed, kinds, edits_per_function), n))
