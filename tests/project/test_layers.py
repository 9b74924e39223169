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
            for name in named(sub, local):
                other = defined.get(name)
                if other not in (None, "appendix") and rank[other] > rank[mine]:
                    found.add((getattr(node, "name", f"line {node.lineno}"), mine, name, other))
            for name in patched(sub, local):  # a lower layer setting an attribute of a higher one's definition
                other = defined.get(name)
                if other not in (None, "appendix") and rank[other] < rank[mine]:
                    found.add((getattr(node, "name", f"line {node.lineno}"), mine, f"{name}.<set>", other))
    return sorted(found)


_BY_STRING = {"getattr", "hasattr", "setattr", "delattr"}


def named(node: ast.AST, local: set) -> list:
    """The module-level names ``node`` may reach: a bare name, an attribute's name (``x.RequestPath``), or a constant
    string handed to getattr and its kind (``getattr(x, "RequestPath")``)."""
    if isinstance(node, ast.Name) and node.id not in local:
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BY_STRING:
        return [a.value for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return []


def patched(node: ast.AST, local: set) -> list:
    """Module-level names whose attributes ``node`` sets: ``Upper.attr = ...`` or ``setattr(Upper, ...)``."""
    targets = []
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        targets = [t.value for t in targets if isinstance(t, ast.Attribute)]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
        targets = node.args[:1]
    return [t.id for t in targets if isinstance(t, ast.Name) and t.id not in local]


def test_the_file_has_its_layers_in_order():
    labels = [label for _, label in layer_heads(SOURCE.splitlines())]
    assert labels[:2] == ["1", "2"] and labels[-2:] == ["9", "appendix"], labels


def test_no_definition_names_one_further_down_the_layers():
    assert upward_references(SOURCE) == []


def open_webui_readers(source: str) -> set:
    """The layers whose code imports Open WebUI's modules (``owui_module("...")``), below the shared head."""
    lines = source.splitlines()
    heads = layer_heads(lines)
    return {
        next(label for start, label in reversed(heads) if start <= number)
        for number, line in enumerate(lines, 1)
        if 'owui_module("' in line and number > heads[0][0]
    }


def test_open_webui_is_imported_by_its_adapters_only():
    """Issue 46: the adapters (layer 7b) hold every call on Open WebUI's modules but the async engine (layer 5) and
    the output converter (layer 2), which lower layers need."""
    assert open_webui_readers(SOURCE) == {"2", "5", "7b"}


def test_a_parameter_named_like_a_lower_definition_is_no_reference():
    lines = [RULE, "# 1. Low", RULE, "def low(high):", "    return high", "", RULE, "# 2. High", RULE, "def high():"]
    assert upward_references("\n".join(lines) + "\n    return 1\n") == []


def test_an_upward_reference_is_found():
    lines = [RULE, "# 1. Low", RULE, "def low():", "    return high()", "", RULE, "# 2. High", RULE, "def high():"]
    assert upward_references("\n".join(lines) + "\n    return 1\n") == [("low", "1", "high", "2")]


def _layers(*bodies: str) -> str:
    """A file of layers 1, 2, ... with these bodies."""
    return "\n".join(f"{RULE}\n# {k}. Layer\n{RULE}\n{body}\n" for k, body in enumerate(bodies, 1))


def test_a_lower_layer_feeding_a_higher_one_at_run_time_is_found():
    """Issue 46: 1.6's ``_TolerantValves.admin = Filter.Valves`` (layer 9 setting what layer 4 reads) passed the
    bare-name check; the shape is caught now."""
    high = "class _TolerantValves:\n    admin = None\n\ndef defaults():\n    return _TolerantValves.admin"
    low = "class Filter:\n    class Valves(_TolerantValves):\n        pass\n\n_TolerantValves.admin = Filter.Valves"
    assert upward_references(_layers(high, low)) == [("line 17", "2", "_TolerantValves.<set>", "1")]
    via_setattr = low.replace("_TolerantValves.admin = Filter.Valves", "setattr(_TolerantValves, 'admin', Filter)")
    assert upward_references(_layers(high, via_setattr)) == [("line 17", "2", "_TolerantValves.<set>", "1")]


def test_an_attribute_or_a_getattr_string_naming_a_lower_definition_is_a_reference():
    high = "def low(x):\n    return x.Lower, getattr(x, 'Lower2', None)"
    low = "class Lower:\n    pass\n\nclass Lower2:\n    pass"
    assert upward_references(_layers(high, low)) == [("low", "1", "Lower", "2"), ("low", "1", "Lower2", "2")]
