"""The import contract: docs/design.md's import order, checked on the source.

Every module of the package belongs to a layer, and may import only from lower layers, and
from its own layer only within its own package (``vision``'s modules use one another), at
module level or inside a function alike. A new module must be given a
layer here (the test fails for one it does not know), so the order stays written down.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "shardloader"

# Lowest first. A group is a module or a package (all its modules); the longest match wins.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    # imports nothing of ours (_compat: only MXNet; _folders: the folder-safety rules)
    ("_errors", "_validate", "_compat", "_extras", "_folders"),
    # the engine's leaves
    (
        "_engine",  # the package itself imports nothing
        "_engine.nest",
        "_engine.timing",
        "_engine.seeding",
        "_engine.reorder",
        "_engine.stage",
        "_engine.lifeline",
        "_engine.interrupts",
        "_engine.gluon_cpp",
        "_engine.pickling",
    ),
    # shared memory and allocation; what a batch's statistics count
    ("_engine.ipc", "_engine.stats"),
    # the samplers, batchify and RecordIO sit on those; so do messages and the batch maker
    ("sampler", "batchify", "recordio", "_engine.protocol", "_engine.batch"),
    ("_engine.worker", "_engine.device"),
    ("_engine.pools", "_engine.options"),
    ("_engine.router",),
    ("_engine.epoch", "_engine.consumer", "prefetch", "_checkpoint", "launch"),
    # the fused image path, wholly below the loader (which calls vision.recognise's
    # fuse_for_loader), and the DataIter adapters
    (
        "_pipeline",
        "dataiter",
        "vision._codecs",
        "vision._color",
        "vision._fused",
        "vision._ops",
        "vision._sources",
        "vision._step",
        "vision.device",
        "vision.pipeline",
        "vision.recognise",
    ),
    ("loader",),
    # the applications: ImageRecordIter's doors (loaders over the fused path) and distributed
    # training; then vision's front, which names image_record's doors lazily; then the
    # command line (whose demo trains through the fused path)
    ("image_record", "distributed"),
    ("vision",),
    ("tools",),
    # the package's front: what ``import shardloader`` and ``python -m shardloader`` run
    ("__init__", "__main__"),
)


def _rank_table() -> Dict[str, int]:
    return {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _group(module: str, table: Dict[str, int]) -> str:
    """The longest group name that ``module`` (dotted, without ``shardloader.``) is in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in table:
            return candidate
    raise KeyError(module)


def _modules() -> Iterator[Tuple[str, pathlib.Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(module: str, path: pathlib.Path) -> Set[str]:
    """The modules of ours that ``module`` imports (dotted, without ``shardloader.``)."""
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    if module == "__init__":
        package = []
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                prefix = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "shardloader":
                prefix = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # "from . import x" may name a module
                candidate = prefix + [alias.name]
                if (ROOT.joinpath(*candidate).with_suffix(".py")).exists() or (
                    ROOT.joinpath(*candidate) / "__init__.py"
                ).exists():
                    found.add(".".join(candidate))
                elif prefix:
                    found.add(".".join(prefix))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "shardloader" and len(parts) > 1:
                    found.add(".".join(parts[1:]))
    return found


def _violations():
    table = _rank_table()
    for module, path in _modules():
        own = _group(module, table)
        for target in sorted(_imports(module, path)):
            group = _group(target, table)
            if group == own or target.startswith(own + ".") or own.startswith(group + "."):
                continue  # within one group (a package and its own modules)
            peers = table[group] == table[own] and own.split(".")[0] == group.split(".")[0]
            if table[group] > table[own] or (table[group] == table[own] and not peers):
                yield f"{module} (layer {table[own]}) imports {target} (layer {table[group]})"


def test_every_module_has_a_layer():
    table = _rank_table()
    unknown = []
    for module, _ in _modules():
        try:
            _group(module, table)
        except KeyError:
            unknown.append(module)
    assert not unknown, f"give these modules a layer in tests/test_layers.py: {unknown}"


def test_lower_layers_never_import_higher_ones():
    bad = list(_violations())
    assert not bad, "imports against docs/design.md's order:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["_errors", "_validate", "_compat", "_engine"])
def test_the_bottom_imports_nothing_of_ours(module):
    path = ROOT / (module + ".py") if module != "_engine" else ROOT / "_engine" / "__init__.py"
    assert _imports(module, path) == set()
