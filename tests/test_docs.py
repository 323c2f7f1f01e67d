"""The docs are tested: every ```python block in docs/*.md and README.md runs, and the site
builds with ``mkdocs build --strict`` when mkdocs is installed.

Each page runs in its own subprocess, in a temporary working directory, with its blocks
executed in order in one namespace (a block may use what an earlier block on the same page
defined). On the pages of ``_STANDALONE_PAGES`` each block gets a namespace of its own, so
that it runs when pasted alone (it may still read a file an earlier block wrote). A page
that hangs is killed, with everything it started, after ``_PAGE_TIMEOUT_S``, so a hanging
example fails its test instead of hanging the suite.

A block that must not run here (it needs a GPU, several machines or a cluster) is preceded
by an HTML comment, ``<!-- skip-test -->``, best with the reason in it::

    <!-- skip-test: needs two GPUs -->
    ```python
    ...
    ```

A block that only one MXNet version can run says which, with the reason, and is skipped
under the other (the suite runs under MXNet 1.9.1 and 2.0.0b1)::

    <!-- mxnet1-only: mx.mod.Module, which MXNet 2.x removed -->
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest
from conftest import MX2

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_leaks")]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Longest a single page may run; the slowest page takes a few seconds.
_PAGE_TIMEOUT_S = 120.0
# Longest the site build may take.
_BUILD_TIMEOUT_S = 240.0

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")
_SKIP = re.compile(
    r"^\s*<!--\s*(?P<kind>skip-test|mxnet1-only|mxnet2-only)\b(?P<reason>.*?)-->\s*$"
)
# Pages whose every example runs by itself: each block in a fresh namespace.
_STANDALONE_PAGES = ("docs/vision.md",)
# Which marker skips a block under the MXNet in use.
_SKIPPED_HERE = {"skip-test", "mxnet1-only" if MX2 else "mxnet2-only"}


class Block(NamedTuple):
    line: int  # 1-based line of the first code line in the page
    code: str
    skip: Optional[str]  # why it does not run, or None


def _pages() -> List[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    readme = ROOT / "README.md"
    if readme.exists():
        pages.append(readme)
    return pages


def _rel(page: Path) -> str:
    try:
        return page.relative_to(ROOT).as_posix()
    except ValueError:
        return str(page)


def python_blocks(page: Path) -> List[Block]:
    """The ```python blocks of a Markdown page, dedented, with their skip reasons."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: List[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].strip().split(" ")[0].lower()
        body = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if language in ("python", "py"):
            code = textwrap.dedent("\n".join(body))
            blocks.append(Block(i + 2, code, _skip_reason(page, lines, i, code)))
        i = j + 1
    return blocks


def _skip_reason(page: Path, lines: List[str], fence_line: int, code: str) -> Optional[str]:
    k = fence_line - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k >= 0:
        marker = _SKIP.match(lines[k])
        if marker and marker["kind"] in _SKIPPED_HERE:
            return marker["reason"].strip(" :-") or f"marked {marker['kind']}"
    return None


# Runs in the page's subprocess: reads the blocks as JSON on stdin and executes them in one
# module namespace, so functions and classes the page defines can be pickled by reference.
# Line numbers in tracebacks are the page's own.
_RUNNER = r"""
import json, sys, traceback, types
blocks = json.load(sys.stdin)
module = None
for block in blocks:
    if module is None or block["alone"]:
        module = types.ModuleType("docs_page")
        module.__file__ = "docs_page.py"
        sys.modules["docs_page"] = module
    code = "\n" * (block["line"] - 1) + block["code"]
    try:
        exec(compile(code, block["page"], "exec"), module.__dict__)
    except BaseException:
        traceback.print_exc()
        print(f"\n>>> the block at {block['page']}:{block['line']} failed", file=sys.stderr)
        sys.exit(1)
"""


def _run_page(page: Path, blocks: List[Block], cwd: Path) -> subprocess.CompletedProcess:
    alone = _rel(page) in _STANDALONE_PAGES
    payload = json.dumps(
        [
            {"page": _rel(page), "line": b.line, "code": b.code, "alone": alone}
            for b in blocks
            if b.skip is None
        ]
    )
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1", NO_MKDOCS_2_WARNING="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUNNER],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills its workers too
    )
    try:
        out, err = proc.communicate(payload, timeout=_PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        pytest.fail(
            f"{_rel(page)} did not finish within {_PAGE_TIMEOUT_S:.0f} s\n"
            f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"
        )
    _kill_group(proc.pid)  # anything the page started and left behind
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.mark.parametrize("page", _pages(), ids=_rel)
def test_code_blocks_run(page: Path, tmp_path: Path) -> None:
    blocks = python_blocks(page)
    runnable = [b for b in blocks if b.skip is None]
    if not runnable:
        return
    result = _run_page(page, blocks, tmp_path)
    assert result.returncode == 0, (
        f"a python block in {_rel(page)} failed\n"
        f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    )


def test_skip_markers_sit_right_before_python_blocks() -> None:
    problems = []
    for page in _pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if not _SKIP.match(line):
                continue
            k = n + 1
            while k < len(lines) and not lines[k].strip():
                k += 1
            fence = _FENCE.match(lines[k]) if k < len(lines) else None
            if not fence or fence["info"].strip().split(" ")[0].lower() not in ("python", "py"):
                problems.append(f"{_rel(page)}:{n + 1}: a skip marker is not before a python block")
    assert not problems, "\n".join(problems)


def test_block_extraction(tmp_path: Path) -> None:
    page_text = textwrap.dedent(
        """\
        Intro.

        ```python
        x = 1
        ```

        <!-- skip-test: needs a GPU -->
        ```python
        import this_does_not_exist
        ```

        <!-- mxnet1-only: mx.mod -->
        ```python
        z = 1
        ```

        - A list item with a block:

            ```python
            y = x + 1
            ```

        ```console
        $ echo not python
        ```
        """
    )
    path = tmp_path / "page.md"
    path.write_text(page_text, encoding="utf-8")
    blocks = python_blocks(path)
    assert [(b.line, b.code, b.skip) for b in blocks] == [
        (4, "x = 1", None),
        (9, "import this_does_not_exist", "needs a GPU"),
        (14, "z = 1", "mx.mod" if MX2 else None),
        (20, "y = x + 1", None),
    ]


_DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_docs_packages() -> List[str]:
    missing = []
    for name in _DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    missing = _missing_docs_packages()
    if missing:
        pytest.skip(
            f"the docs toolchain is not installed ({', '.join(missing)} missing): `make test` "
            "installs only the test extra; `make docs` installs the docs extra and runs "
            "`mkdocs build --strict`, which is the docs check"
        )
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=_BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-8000:]}"
    assert (tmp_path / "index.html").exists()


def test_the_api_reference_lists_every_key_of_stats() -> None:
    """docs/api/loader.md's table of ``stats()`` keys is the dict's keys, in its order."""
    from shardloader import ShardedDataLoader

    page = (DOCS / "api" / "loader.md").read_text(encoding="utf-8")
    table = page.split("<!-- stats-keys:start -->")[1].split("<!-- stats-keys:end -->")[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    with ShardedDataLoader(list(range(4)), batch_size=2) as loader:
        list(loader)
        keys = list(loader.stats())
    assert documented == keys


def test_worker_info_documents_every_field() -> None:
    from shardloader import WorkerInfo

    doc = WorkerInfo.__doc__ or ""
    attributes = doc.split("Attributes\n    ----------\n")[1]
    documented = re.findall(r"^    (\w+) : ", attributes, re.MULTILINE)
    assert documented == list(WorkerInfo._fields)


def test_switching_lists_every_argument_of_the_loader() -> None:
    """docs/switching.md promises every argument: each parameter of the loader has a row in
    its tables (``fuse_transforms`` had none), and its signature block names them all."""
    import inspect

    from shardloader import ShardedDataLoader

    page = (DOCS / "switching.md").read_text(encoding="utf-8")
    rows = set()
    for cell in re.findall(r"^\| ([^|]+) \|", page, re.MULTILINE):
        rows.update(re.findall(r"`(\w+)`", cell))
    signature = page.split("## The signature")[1].split("```")[1]
    for name in inspect.signature(ShardedDataLoader).parameters:
        assert name in rows, f"docs/switching.md has no row for {name}"
        assert re.search(rf"\b{name}\b", signature), f"the signature block lacks {name}"
