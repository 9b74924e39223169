"""The product file's layering, as its reading guide promises: each layer uses
only the layers above it. Shared names before layer 1 may be used by all; the
appendix (the status texts, data) may be read from anywhere."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = (ROOT / "async_context_compression.py").read_text(encoding="utf-8")
RULE = "# " + "-" * 75


def layer_heads(lines: list) -> list:
    """(line number, label) of each layer's header: a numbered title between two rules, or the appendix."""
    heads = []
    for number, line in enumerate(lines, 1):
        title = re.match(r"# (\d+b?)\. |# (Appendix):", line)
        if title and number > 1 and lines[number - 2] == RULE:
            heads.append((number, title.group(1) or "appendix"))
    return heads


def local_names(node: ast.AST) -> set:
    """Names a definition binds itself (parameters, assignments inside it): they shadow the module's."""
    names = {
        a.arg
        for sub in ast.walk(node)
        if isinstance(sub, ast.arguments)
        for a in (*sub.posonlyargs, *sub.args, *sub.kwonlyargs, *(x for x in (sub.vararg, sub.kwarg) if x))
    }
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names |= {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)}
    return names


def upward_references(source: str) -> list:
    """(definition, its layer, the name it uses, that name's layer) for every module-level name a definition uses
    from a layer further down the file."""
    lines = source.splitlines()
    heads = layer_heads(lines)
    rank = {label: k for k, (_, label) in enumerate(heads)}

    def layer_of(lineno: int):
        return next((label for start, label in reversed(heads) if start <= lineno), None)

    tree = ast.parse(source)
    defined = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            names = []
        for name in names:
            defined.setdefault(name, layer_of(node.lineno))
    found = set()
    for node in tree.body:
        mine = layer_of(node.lineno)
        if mine is None:
            continue
        local = local_names(node)
        for sub in ast.walk(node):
            other = defined.get(sub.id) if isinstance(sub, ast.Name) and sub.id not in local else None
            if other not in (None, "appendix") and rank[other] > rank[mine]:
                found.add((getattr(node, "name", f"line {node.lineno}"), mine, sub.id, other))
    return sorted(found)


def test_the_file_has_its_layers_in_order():
    labels = [label for _, label in layer_heads(SOURCE.splitlines())]
    assert labels[:2] == ["1", "2"] and labels[-2:] == ["9", "appendix"], labels


def test_no_definition_names_one_further_down_the_layers():
    assert upward_references(SOURCE) == []


def test_a_parameter_named_like_a_lower_definition_is_no_reference():
    lines = [RULE, "# 1. Low", RULE, "def low(high):", "    return high", "", RULE, "# 2. High", RULE, "def high():"]
    assert upward_references("\n".join(lines) + "\n    return 1\n") == []


def test_an_upward_reference_is_found():
    lines = [RULE, "# 1. Low", RULE, "def low():", "    return high()", "", RULE, "# 2. High", RULE, "def high():"]
    assert upward_references("\n".join(lines) + "\n    return 1\n") == [("low", "1", "high", "2")]
