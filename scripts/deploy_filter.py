#!/usr/bin/env python3
"""Install or update the Async Context Compression filter on a running Open WebUI.

    python scripts/deploy_filter.py --url http://localhost:8080 --api-key sk-... \\
        [--file async_context_compression.py] [--global] \\
        [--valves '{"max_context_tokens": 32000}']

The function id is read from the file's frontmatter (``id:``). An existing
function is updated in place and keeps the valves already stored; ``--valves``
is merged over them. The function is activated, and made global with
``--global`` (``--no-global`` takes that back; neither leaves it as it is).

The key is an admin's API key (Settings → Account → API keys; the admin must
have enabled API keys) or a session token; ``OPENWEBUI_API_KEY`` is read when
``--api-key`` is not given. Standard library only. Exit status: 0 done,
1 the server refused or could not be reached, 2 bad arguments or file.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import urllib.error
import urllib.request
from typing import Any, Optional

DEFAULT_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "async_context_compression.py")


class DeployError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def parse_frontmatter(source: str) -> dict:
    """``key: value`` lines of the leading docstring, as Open WebUI reads them."""
    m = re.match(r'\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', source, re.S)
    meta: dict = {}
    if not m:
        return meta
    for line in m.group(1).splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            key = key.strip()
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                meta[key] = value.strip()
    return meta


class Api:
    """Minimal JSON client: every failure becomes a DeployError with the HTTP status and detail."""

    def __init__(self, url: str, key: str, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "Authorization": f"Bearer {self.key}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            detail: Any = text.strip() or exc.reason
            try:
                parsed = json.loads(text)
                if isinstance(parsed, dict):
                    detail = parsed.get("detail", parsed.get("error", parsed))
            except ValueError:
                pass
            raise DeployError(f"{method} {path} failed: HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise DeployError(f"cannot reach Open WebUI at {self.url}: {exc.reason}") from None
        except (TimeoutError, OSError) as exc:
            raise DeployError(f"cannot reach Open WebUI at {self.url}: {exc}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise DeployError(
                f"{method} {path}: the answer is not JSON (is {self.url} an Open WebUI server?): "
                f"{raw[:200].decode('utf-8', 'replace')}"
            ) from None


def deploy(args: argparse.Namespace, out=print) -> dict:
    path = args.file
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError as exc:
        raise DeployError(f"cannot read {path}: {exc}", 2) from None
    meta = parse_frontmatter(source)
    function_id = (meta.get("id") or "").strip()
    if not function_id:
        raise DeployError(f"{path} has no 'id:' line in its frontmatter docstring", 2)
    if not function_id.isidentifier():
        raise DeployError(f"frontmatter id {function_id!r} is not a valid function id (letters, digits, _)", 2)
    function_id = function_id.lower()
    if "class Filter" not in source:
        raise DeployError(f"{path} does not define a Filter class", 2)
    new_valves: Optional[dict] = None
    if args.valves:
        try:
            new_valves = json.loads(args.valves)
        except ValueError as exc:
            raise DeployError(f"--valves is not valid JSON: {exc}", 2) from None
        if not isinstance(new_valves, dict):
            raise DeployError("--valves must be a JSON object", 2)

    # Prepared before anything on the server changes: the valves the new
    # code declares (read off its source), so unknown names are said once,
    # as ignored, and never sent.
    declared = declared_valves(source)
    ignored: list = []
    if new_valves is not None and declared is not None:
        ignored = sorted(k for k in new_valves if k not in declared)
        new_valves = {k: v for k, v in new_valves.items() if k in declared}
        if ignored:
            out(f"warning: not valves of this filter, ignored: {', '.join(ignored)}")

    api = Api(args.url, args.api_key, args.timeout)
    try:
        # admin-only: checks the key and lists what is installed in one call
        functions = api.call("GET", "/api/v1/functions/list") or []
    except DeployError as exc:
        if re.search(r"HTTP (401|403)\b", str(exc)):
            raise DeployError(f"{exc} (the key must be a valid API key or token of an admin account)") from None
        raise
    existing = next((f for f in functions if isinstance(f, dict) and f.get("id") == function_id), None)
    form = {
        "id": function_id,
        "name": meta.get("title") or function_id,
        "content": source,
        "meta": {"description": meta.get("description", "")},
    }
    version = meta.get("version", "?")
    report: dict = {"id": function_id, "version": version}
    previous: Optional[dict] = None
    if existing is None:
        api.call("POST", "/api/v1/functions/create", form)
        report["action"] = "created"
        stored_valves: dict = {}
    else:
        # what to restore if the valves are refused after the code changed
        previous = api.call("GET", f"/api/v1/functions/id/{function_id}") or {}
        old_version = ((previous.get("meta") or existing.get("meta") or {}).get("manifest") or {}).get("version", "?")
        stored_valves = api.call("GET", f"/api/v1/functions/id/{function_id}/valves") or {}
        api.call("POST", f"/api/v1/functions/id/{function_id}/update", form)
        report["action"] = "updated"

    if new_valves:
        merged = {**stored_valves, **new_valves}
        try:
            saved = api.call("POST", f"/api/v1/functions/id/{function_id}/valves/update", merged) or {}
        except DeployError as exc:
            hints = _valve_problems(_valves_spec(api, function_id), merged)
            reason = f"{exc}" + (f" ({'; '.join(hints)})" if hints else "")
            raise DeployError(f"{reason}; {_roll_back(api, function_id, previous)}") from None
        report["valves"] = saved
        # what the server did not store (a value the filter's Valves replaced
        # by its default) is not reported as set
        not_stored = sorted(k for k in new_valves if isinstance(saved, dict) and k not in saved)
        new_valves = {k: v for k, v in new_valves.items() if k not in not_stored}
        if not_stored:
            report["not_stored"] = not_stored

    if existing is None:
        out(f"created function {function_id} ({form['name']} {version})")
    else:
        out(f"updated function {function_id} ({old_version} -> {version})")
    if new_valves:
        kept = sorted(k for k in stored_valves if k not in new_valves)
        out(f"valves set: {json.dumps(new_valves, sort_keys=True)}" + (f"; kept: {', '.join(kept)}" if kept else ""))
    elif stored_valves:
        out(f"valves kept: {', '.join(sorted(stored_valves))}")
        report["valves"] = stored_valves
    else:
        out("valves: defaults (none stored)")
        report["valves"] = {}
    if report.get("not_stored"):
        out(f"warning: not stored, the filter's default applies: {', '.join(report['not_stored'])}")
    if ignored:
        report["ignored"] = ignored

    function = api.call("GET", f"/api/v1/functions/id/{function_id}") or {}
    if function.get("type") not in (None, "filter"):
        raise DeployError(f"Open WebUI loaded {function_id} as a {function.get('type')}, not a filter")
    if not function.get("is_active"):
        function = api.call("POST", f"/api/v1/functions/id/{function_id}/toggle") or {}
        out("activated")
    else:
        out("already active")
    if args.make_global is not None and bool(function.get("is_global")) != args.make_global:
        function = api.call("POST", f"/api/v1/functions/id/{function_id}/toggle/global") or {}
        out("enabled globally (every model)" if args.make_global else "global flag removed (enable it per model)")
    elif function.get("is_global"):
        out("global: yes")
    else:
        out("global: no (enable it per model in Workspace -> Models, or rerun with --global)")
    if not function.get("is_active") or (
        args.make_global is not None and bool(function.get("is_global")) != args.make_global
    ):
        raise DeployError(
            f"the function's state did not change as asked: {json.dumps({k: function.get(k) for k in ('is_active', 'is_global')})}"
        )
    report["is_active"] = bool(function.get("is_active"))
    report["is_global"] = bool(function.get("is_global"))
    return report


def declared_valves(source: str) -> Optional[set]:
    """Names of the fields of ``Filter.Valves`` in ``source`` (None when the
    file cannot be read that way; the server then decides alone)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def fields(cls: ast.ClassDef, seen: frozenset) -> set:
        """The class's own fields and those of its bases defined in the file (the filter's layer 4 holds them)."""
        own = {
            item.target.id
            for item in cls.body
            if isinstance(item, ast.AnnAssign)
            and isinstance(item.target, ast.Name)
            and not item.target.id.startswith("_")  # private attributes, not valves
        }
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else None
            if name in classes and name not in seen:
                own |= fields(classes[name], seen | {name})
        return own

    for inner in classes["Filter"].body if "Filter" in classes else ():
        if isinstance(inner, ast.ClassDef) and inner.name == "Valves":
            return fields(inner, frozenset())
    return None


def _roll_back(api: Api, function_id: str, previous: Optional[dict]) -> str:
    """Undo the code change of a deploy whose valves were refused; says what the server holds now."""
    try:
        if previous is None:
            api.call("DELETE", f"/api/v1/functions/id/{function_id}/delete")
            return "the function just created was removed again; nothing changed"
        form = {
            "id": function_id,
            "name": previous.get("name") or function_id,
            "content": previous.get("content") or "",
            "meta": previous.get("meta") or {},
        }
        api.call("POST", f"/api/v1/functions/id/{function_id}/update", form)
        return "the previous code was restored; nothing changed"
    except DeployError as exc:
        return (
            f"AND restoring the previous state failed ({exc}): the server now runs the new code "
            "with its old valves; rerun the deploy with valid --valves"
        )


def _valves_spec(api: Api, function_id: str) -> dict:
    try:
        spec = api.call("GET", f"/api/v1/functions/id/{function_id}/valves/spec")
    except DeployError:
        return {}
    return spec if isinstance(spec, dict) else {}


def _valve_problems(spec: dict, valves: dict) -> list:
    """Why Open WebUI may have refused ``valves``, read off the Valves JSON schema."""
    problems = []
    props = spec.get("properties", {}) if isinstance(spec, dict) else {}
    kinds = {"integer": int, "number": (int, float), "boolean": bool, "string": str}
    for key, value in valves.items():
        prop = props.get(key)
        if not isinstance(prop, dict):
            continue
        kind = kinds.get(prop.get("type"))
        if kind is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
            problems.append(f"{key} must be of type {prop.get('type')}, got {value!r}")
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in prop and value < prop["minimum"]:
                problems.append(f"{key} must be >= {prop['minimum']}, got {value}")
            if "maximum" in prop and value > prop["maximum"]:
                problems.append(f"{key} must be <= {prop['maximum']}, got {value}")
    return problems


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Install or update the Async Context Compression filter on a running Open WebUI."
    )
    ap.add_argument("--url", required=True, help="Open WebUI base URL, e.g. http://localhost:8080")
    ap.add_argument(
        "--api-key",
        default=os.environ.get("OPENWEBUI_API_KEY"),
        help="an admin's API key (sk-...) or token; default $OPENWEBUI_API_KEY",
    )
    ap.add_argument("--file", default=DEFAULT_FILE, help="the filter source (default: %(default)s)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument(
        "--global",
        dest="make_global",
        action="store_const",
        const=True,
        default=None,
        help="enable the filter for every model",
    )
    g.add_argument(
        "--no-global",
        dest="make_global",
        action="store_const",
        const=False,
        help="remove the global flag (enable it per model instead)",
    )
    ap.add_argument(
        "--valves", help="JSON object merged over the stored valves, e.g. '{\"max_context_tokens\": 32000}'"
    )
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per HTTP request (default 60)")
    return ap


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.api_key:
        print("error: --api-key (or OPENWEBUI_API_KEY) is required", file=sys.stderr)
        return 2
    try:
        deploy(args)
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
