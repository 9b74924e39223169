"""scripts/test.sh runs the whole suite in three lanes at once (issue 45): the e2e modules listed in its
OWN_DEPLOYMENTS run beside the unit and database tests, those in THIRD_LANE in a lane of their own, away from the
session's Open WebUIs. A module listed in either must exist and start its own deployment: one that asked for a session
server would start another Open WebUI in that lane (20-25 s of CPU each) instead of using the first lane's. The
deployment with fake local servers (conftest's ``local_servers``) is shared by modules of the second lane: one of
another lane asking for it would start it twice."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSION_SERVERS = {
    "acc",
    "admin",
    "owui_server",
    "owui_version",
    "installed_filter",
    "two_workers",
    "shared_two_workers",
}


def own_deployments(name: str = "OWN_DEPLOYMENTS") -> list:
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    block = re.search(rf"^{name}=\(\n(.*?)^\)", script, re.M | re.S)
    assert block, f"scripts/test.sh no longer lists {name}"
    return block.group(1).split()


def fixtures_asked(path: Path) -> set:
    """The arguments of the module's tests and fixtures (the fixtures pytest gives them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        arg.arg
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (node.name.startswith("test_") or any("fixture" in ast.unparse(d) for d in node.decorator_list))
        for arg in node.args.args
    }


@pytest.mark.parametrize("lane", ["OWN_DEPLOYMENTS", "THIRD_LANE"])
def test_every_module_of_the_second_and_third_lanes_exists_and_starts_its_own_deployment(lane):
    modules = own_deployments(lane)
    assert modules
    for module in modules:
        path = ROOT / module
        assert path.is_file() and module.startswith("tests/e2e/test_"), module
        assert not fixtures_asked(path) & SESSION_SERVERS, f"{module} asks for a session server"


def test_the_deployment_with_local_servers_is_asked_for_in_the_second_lane_only():
    second = set(own_deployments())
    asking = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests" / "e2e").glob("test_*.py"))
        if "local_servers" in fixtures_asked(path)
    ]
    assert asking, "no module asks for local_servers any more"
    assert set(asking) <= second, f"asked for outside the second lane: {sorted(set(asking) - second)}"
