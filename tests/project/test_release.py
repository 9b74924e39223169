"""The release's promises that are not code: one version everywhere, the
frontmatter Open WebUI parses, and a filter that stands alone without Open
WebUI installed."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = (ROOT / "async_context_compression.py").read_text(encoding="utf-8")


def frontmatter() -> dict:
    block = SOURCE.split('"""', 2)[1]
    return dict(
        (key.strip(), value.strip())
        for key, value in (line.split(":", 1) for line in block.strip().splitlines() if ":" in line)
    )


def test_frontmatter_has_what_open_webui_reads():
    meta = frontmatter()
    assert meta["id"] == "async_context_compression"
    assert meta["required_open_webui_version"] == "0.9.0"
    assert meta["license"] == "MIT"
    assert meta["requirements"] == "tiktoken"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    for key in ("title", "author", "description"):
        assert meta[key]


def test_version_moves_together_in_changelog_and_docs():
    version = frontmatter()["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(r"^## (\S+)", changelog, re.M).group(1) == version
    for language in ("en", "zh"):
        docs = sorted((ROOT / "docs" / language).glob("*.md"))
        assert docs, f"docs/{language} is empty"
        for doc in docs:
            found = set(re.findall(r"\b\d+\.\d+\.\d+\b", doc.read_text(encoding="utf-8")))
            mentioned = {v for v in found if not v.startswith(("0.", "3."))}  # Open WebUI / Python versions
            assert mentioned <= {version}, f"{doc.relative_to(ROOT)} names {mentioned - {version}}"
    assert f"Version {version}" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_docs_exist_in_both_languages():
    english = {p.name for p in (ROOT / "docs" / "en").glob("*.md")}
    chinese = {p.name for p in (ROOT / "docs" / "zh").glob("*.md")}
    assert english - {"README.md"} <= chinese, f"missing in docs/zh: {english - chinese}"


def test_works_without_open_webui_installed(tmp_path):
    """Other hosts and isolated tests load the file with no open_webui
    package: then there is no database and no summarizer, but inlet, request
    and outlet still repair and cap."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.modules["open_webui"] = None  # any import of it now fails
        sys.path.insert(0, {str(ROOT)!r})
        import async_context_compression as acc
        from devkit.probes import messages_tokens

        async def main():
            f = acc.Filter()
            f.valves.max_context_tokens = 200
            chat = [{{"role": "system", "content": "sys"}},
                    {{"role": "tool", "tool_call_id": "x", "content": "orphan"}},
                    *[{{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 60}} for i in range(9)]]
            body = {{"model": "m", "messages": chat}}
            out = await f.inlet(body, __user__={{"id": "u"}}, __metadata__={{"chat_id": "c"}})
            assert [m["role"] for m in out["messages"]][0] == "system"
            assert not any(m["role"] == "tool" for m in out["messages"])
            assert out["messages"][-1] == chat[-1]
            assert messages_tokens(acc.TokenCounter(), out["messages"], "cl100k_base", exact=False) <= 200
            again = await f.request(out, __user__={{"id": "u"}})
            assert again["messages"] == out["messages"]
            stored = {{"model": "m", "chat_id": "c", "messages": [dict(m, id=str(i)) for i, m in enumerate(chat)]}}
            assert await f.outlet(stored, __user__={{"id": "u"}}) is stored
            await f.wait_for_background(5)
            print("standalone ok")

        asyncio.run(main())
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "standalone ok" in result.stdout


def test_test_modules_of_one_name_in_two_folders_are_collected_together():
    # Each folder names its modules for the feature they test, so names repeat
    # across folders; that works only while pytest.ini imports test modules by
    # path (--import-mode=importlib): by basename, the second one stops a
    # whole-suite run at collection.
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert repeated, "no module name repeats across folders: this test would prove nothing"
    paths = [str(p) for p in sorted((ROOT / "tests").rglob(repeated[0]))]
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
