"""The advice for a missing extra (shardloader._extras): installable from where the user is."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardloader import _extras

ROOT = Path(__file__).resolve().parents[1]


def _pins():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _extra_packages(extra, pyproject):
    """The packages of ``extra`` in pyproject.toml, nested extras expanded."""
    body = re.search(rf"^{re.escape(extra)} = \[(.*?)\]$", pyproject, flags=re.M | re.S).group(1)
    names = []
    for name in re.findall(r'"([^"]+)"', body):
        nested = re.fullmatch(r"shardloader\[(.+)\]", name)
        names += _extra_packages(nested.group(1), pyproject) if nested else [name]
    return names


@pytest.mark.timeout(10)
@pytest.mark.parametrize("extra", sorted(_extras.EXTRAS))
def test_each_extra_lists_its_packages_at_the_pinned_versions(extra):
    pyproject = (ROOT / "pyproject.toml").read_text()
    pins = _pins()
    expected = [f"{n}=={pins[n.lower()]}" for n in _extra_packages(extra, pyproject)]
    assert list(_extras.EXTRAS[extra]) == expected


@pytest.mark.timeout(10)
def test_from_a_clone_the_hint_installs_the_extra_from_it_with_its_constraints():
    hint = _extras.install_hint("vision")
    assert _extras.clone_root() == str(ROOT)
    assert f"pip install -c '{ROOT / 'constraints.txt'}' -e '{ROOT}[vision]'" in hint
    assert hint.endswith("pip install simplejpeg==1.9.0 opencv-python-headless==4.11.0.86")
    assert "shardloader[" not in hint
    error = _extras.missing_extra("vision", "ImageRecordLoader")
    assert isinstance(error, ImportError)
    assert str(error).startswith("ImageRecordLoader needs the 'vision' extra, which is not")
    assert hint in str(error)


@pytest.mark.timeout(30)
def test_outside_a_clone_the_hint_names_the_pinned_packages(tmp_path):
    """An installed wheel has no pyproject.toml beside it: the packages, pinned."""
    package = tmp_path / "site" / "shardloader"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(ROOT / "shardloader" / "_extras.py", package / "_extras.py")
    code = "from shardloader import _extras; print(_extras.install_hint('vision'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(tmp_path),
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=25,
        check=True,
    ).stdout.strip()
    assert out == "pip install simplejpeg==1.9.0 opencv-python-headless==4.11.0.86"
