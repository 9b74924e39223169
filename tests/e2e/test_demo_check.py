"""scripts/demo.sh --check: the README's demo, in its self-testing form, with its own fake provider and Open WebUI.

A module of its own (before issue 45 a test of test_deploy_and_demo.py): it needs no server of the session's, so
scripts/test.sh runs it in the second lane (OWN_DEPLOYMENTS), beside the unit tests, not in the longer first one."""

from __future__ import annotations

import os
import subprocess

import pytest

from devkit.openwebui import REPO_ROOT

pytestmark = pytest.mark.e2e

DEMO = os.path.join(REPO_ROOT, "scripts", "demo.sh")


def test_demo_check_passes():
    """The README's demo, in its self-testing form: its own fake provider and Open WebUI, a scripted chat."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    proc = subprocess.run(
        ["bash", DEMO, "--check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, env=env
    )
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "CHECK PASSED" in proc.stdout
