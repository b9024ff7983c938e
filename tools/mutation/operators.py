"""Which nodes of a module change and how; the source of a mutant.

Operator mutants are generated from the AST of the selected lines (`generate`);
*edits* are text replacements named in a preset (`edit_mutant`), for changes
no operator makes (a variable for another, a line dropped, a default moved).
"""

import ast
import copy
import dataclasses
import os
import re
from typing import List, Optional, Sequence, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_BINOP_SWAP = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd, ast.Mod: ast.FloorDiv,
}
_CMP_SWAP = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot,
    ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_CALL_SWAP = {
    "minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min",
    "argmin": "argmax", "argmax": "argmin", "floor": "ceil", "ceil": "floor",
    "any": "all", "all": "any", "sum": "mean",
}


@dataclasses.dataclass
class Mutant:
  """One change to one node (or, for an edit, one text span) of one module."""
  index: int  # Run-wide number, stable for the same sources and targets.
  path: str
  line: int
  kind: str  # binop | compare | ... | edit
  before: str
  after: str
  node_pos: int  # Position of the node in `_walk(tree)` (-1 for an edit).
  variant: int  # Which of the node's mutations.
  # killed | survived | timeout (CPU limit: killed) | starved (undecided) |
  # error
  status: str = "pending"
  seconds: float = 0.0  # Wall time of its tests.
  cpu_seconds: Optional[float] = None  # Their CPU time (in-process only).
  failed: str = ""  # First failing test (killed mutants).
  old: str = ""  # An edit's replaced text (exact, once in its function).
  new: str = ""  # An edit's replacement.
  why: str = ""  # An edit's name: the defect it reproduces.


def _walk(tree: ast.AST) -> List[ast.AST]:
  """Every node, depth-first in source order (deterministic)."""
  out = []

  def visit(node):
    out.append(node)
    for child in ast.iter_child_nodes(node):
      visit(child)

  visit(tree)
  return out


def find_function(tree: ast.Module, dotted: str) -> ast.AST:
  scope: Sequence[ast.AST] = tree.body
  node = None
  for part in dotted.split("."):
    node = next((n for n in scope if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and
                 n.name == part), None)
    if node is None:
      raise SystemExit(f"error: no function {dotted!r} (missing {part!r})")
    scope = [n for n in ast.walk(node) if n is not node]
    # Direct children first, so a nested name finds the nearest definition.
    scope = list(node.body) + scope
  return node



def core_lines(tree: ast.Module, spec: Optional[str]) -> Set[int]:
  """Lines selected by the part of a target after the colon: comma-separated
  function names (their bodies), line ranges `A-B` and names of module-level
  constants (`NAME = ...`); `*` is every top-level function and constant."""
  if spec is None:
    return set(range(1, max(getattr(n, "end_lineno", 0) or 0
                            for n in ast.walk(tree)) + 1))
  lines = set()
  names = [n.strip() for n in spec.split(",")]
  if names == ["*"]:  # Every top-level function and module constant.
    names = [n.name if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             else n.targets[0].id for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                 isinstance(n, ast.Assign) and len(n.targets) == 1 and
                 isinstance(n.targets[0], ast.Name))]
  for name in names:
    m = re.fullmatch(r"(\d+)-(\d+)", name)
    if m:
      lines.update(range(int(m.group(1)), int(m.group(2)) + 1))
      continue
    constant = next((n for n in tree.body if isinstance(n, ast.Assign) and [
        getattr(t, "id", None) for t in n.targets] == [name]), None)
    if constant is not None:
      lines.update(range(constant.lineno, constant.end_lineno + 1))
      continue
    fn = find_function(tree, name)
    body = list(fn.body)
    if (body and isinstance(body[0], ast.Expr) and
        isinstance(body[0].value, ast.Constant) and
        isinstance(body[0].value.value, str)):
      body = body[1:]  # Docstring.
    for stmt in body:
      lines.update(range(stmt.lineno, stmt.end_lineno + 1))
  return lines


# Shape plumbing: a mutation there only crashes at trace time (or, for a
# constant index, is silently clamped by JAX), so it is not generated.
_PLUMBING_CALLS = {"reshape", "astype", "broadcast_to", "transpose",
                   "split", "fold_in", "one_hot"}
_PLUMBING_KEYWORDS = {"axis", "axes", "axis1", "axis2", "keepdims", "dtype",
                      "in_axes", "out_axes", "batch_size", "precision"}


def _excluded_nodes(tree: ast.Module) -> Set[int]:
  """ids of nodes never mutated: raise/assert, f-strings, docstrings,
  annotations and shape plumbing (see `_PLUMBING_CALLS`)."""
  skip = set()
  for node in ast.walk(tree):
    roots = []
    if isinstance(node, ast.Call):
      func = node.func
      name = (func.attr if isinstance(func, ast.Attribute) else
              func.id if isinstance(func, ast.Name) else None)
      if name in _PLUMBING_CALLS:
        roots.extend(node.args)
      roots.extend(k.value for k in node.keywords
                   if k.arg in _PLUMBING_KEYWORDS)
    if isinstance(node, ast.Subscript):
      if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        roots.append(node)  # x.shape[0], x.shape[2:]
      elif isinstance(node.slice, ast.Constant):
        roots.append(node.slice)  # x[0]
      elif isinstance(node.slice, ast.Tuple):
        roots.extend(e for e in node.slice.elts if isinstance(e, ast.Constant))
    if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)):
      roots.append(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      roots.extend(a.annotation for a in (node.args.args +
                                          node.args.kwonlyargs)
                   if a.annotation is not None)
      if node.returns is not None:
        roots.append(node.returns)
    if isinstance(node, ast.AnnAssign):
      roots.append(node.annotation)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
      roots.append(node)
    for r in roots:
      skip.update(id(n) for n in ast.walk(r))
  return skip


def _variants(node: ast.AST) -> List[Tuple[str, ast.AST]]:
  """(kind, replacement node) for every mutation of `node`."""
  out = []
  if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(
      node.op) in _BINOP_SWAP:
    new = copy.deepcopy(node)
    new.op = _BINOP_SWAP[type(node.op)]()
    out.append(("binop", new))
  elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(
      node.ops[0]) in _CMP_SWAP:
    new = copy.deepcopy(node)
    new.ops = [_CMP_SWAP[type(node.ops[0])]()]
    out.append(("compare", new))
  elif isinstance(node, ast.UnaryOp) and isinstance(
      node.op, (ast.USub, ast.Invert, ast.Not)):
    if not (isinstance(node.op, ast.USub) and
            isinstance(node.operand, ast.Constant)):
      out.append(("drop-unary", copy.deepcopy(node.operand)))
    elif isinstance(node.operand.value, (int, float)) and not isinstance(
        node.operand.value, bool):  # -1 -> -2 (constant tweak).
      new = copy.deepcopy(node)
      new.operand.value = node.operand.value + 1
      out.append(("constant", new))
  elif isinstance(node, ast.BoolOp):
    new = copy.deepcopy(node)
    new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    out.append(("boolop", new))
  elif isinstance(node, ast.Constant):
    v = node.value
    if isinstance(v, bool):
      out.append(("constant", ast.Constant(not v)))
    elif isinstance(v, (int, float)):
      out.append(("constant", ast.Constant(v + 1)))
  elif isinstance(node, ast.Call):
    func = node.func
    name = (func.attr if isinstance(func, ast.Attribute) else
            func.id if isinstance(func, ast.Name) else None)
    if name in _CALL_SWAP:
      new = copy.deepcopy(node)
      if isinstance(new.func, ast.Attribute):
        new.func.attr = _CALL_SWAP[name]
      else:
        new.func.id = _CALL_SWAP[name]
      out.append(("call", new))
    if name == "where" and len(node.args) == 3:
      new = copy.deepcopy(node)
      new.args = [new.args[0], new.args[2], new.args[1]]
      out.append(("where-swap", new))
  elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
    elts = node.slice.elts
    is_none = lambda e: isinstance(e, ast.Constant) and e.value is None
    is_all = lambda e: (isinstance(e, ast.Slice) and e.lower is None and
                        e.upper is None and e.step is None)
    if len(elts) == 2 and ((is_none(elts[0]) and is_all(elts[1])) or
                           (is_all(elts[0]) and is_none(elts[1]))):
      new = copy.deepcopy(node)
      new.slice.elts = [new.slice.elts[1], new.slice.elts[0]]
      out.append(("transpose-index", new))
  return out


def _is_constant_under_unary(node, parents) -> bool:
  parent = parents.get(id(node))
  return (isinstance(parent, ast.UnaryOp) and
          isinstance(parent.op, ast.USub))


def generate(path: str, spec: Optional[str], start: int) -> List[Mutant]:
  """Mutants of the selected lines of `path` (relative to the repo)."""
  tree = ast.parse(_read(path))
  lines = core_lines(tree, spec)
  skip = _excluded_nodes(tree)
  parents = {}
  for node in ast.walk(tree):
    for child in ast.iter_child_nodes(node):
      parents[id(child)] = node
  mutants = []
  for pos, node in enumerate(_walk(tree)):
    line = getattr(node, "lineno", None)
    if line is None or line not in lines or id(node) in skip:
      continue
    if isinstance(node, ast.Constant) and _is_constant_under_unary(
        node, parents):
      continue  # Handled as the unary expression (-1 -> -2).
    for variant, (kind, new) in enumerate(_variants(node)):
      before = ast.unparse(node)
      after = ast.unparse(new)
      mutants.append(Mutant(start + len(mutants), path, line, kind,
                            before[:120], after[:120], pos, variant))
  return mutants



def _read(path: str) -> str:
  return open(os.path.join(REPO, path), encoding="utf-8").read()


def _span(source: str, function: Optional[str]) -> Tuple[int, int]:
  """Character range of `function` (dotted; None: the whole module)."""
  if function is None:
    return 0, len(source)
  node = find_function(ast.parse(source), function)
  starts = [0]
  for line in source.split("\n"):
    starts.append(starts[-1] + len(line) + 1)
  return starts[node.lineno - 1], starts[node.end_lineno]


def edit_mutant(path: str, function: Optional[str], old: str, new: str,
                why: str, index: int) -> Mutant:
  """The edit replacing `old` (exactly once in `function`) by `new`."""
  source = _read(path)
  lo, hi = _span(source, function)
  count = source[lo:hi].count(old)
  if count != 1:
    raise SystemExit(
        f"error: edit {why!r}: {old!r} occurs {count} times in "
        f"{path}:{function or '<module>'} (must be exactly once)")
  at = source.index(old, lo)
  line = source.count("\n", 0, at) + 1
  return Mutant(index, path, line, "edit", old[:120], new[:120], -1, 0,
                old=old, new=new, why=why)


def _edited_source(m: Mutant) -> str:
  source = _read(m.path)
  lines = source.split("\n")
  at = source.find(m.old, sum(len(x) + 1 for x in lines[:m.line - 1]))
  if at < 0 or source.count("\n", 0, at) + 1 != m.line:
    raise RuntimeError(f"edit {m.why!r} no longer applies at {m.path}:"
                       f"{m.line}")
  return source[:at] + m.new + source[at + len(m.old):]


def mutated_source(m: Mutant) -> str:
  """The module's source with mutant `m` applied (operator mutants via
  `ast.unparse`; an edit on the file's own text, so its lines stay put)."""
  if m.kind == "edit":
    return _edited_source(m)
  tree = ast.parse(_read(m.path))
  nodes = _walk(tree)
  target = nodes[m.node_pos]
  _, new = _variants(target)[m.variant]
  ast.copy_location(new, target)
  parents = {}
  for node in ast.walk(tree):
    for child in ast.iter_child_nodes(node):
      parents[id(child)] = node
  parent = parents[id(target)]
  for field, value in ast.iter_fields(parent):
    if value is target:
      setattr(parent, field, new)
      break
    if isinstance(value, list) and any(v is target for v in value):
      setattr(parent, field, [new if v is target else v for v in value])
      break
  else:
    raise RuntimeError(f"cannot place mutant {m.index}")
  return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def unparsed_source(path: str) -> str:
  """The module as `ast.unparse` writes it (what every mutant is based on)."""
  return ast.unparse(ast.parse(_read(path))) + "\n"

