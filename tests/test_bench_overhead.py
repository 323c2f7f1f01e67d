"""``benchmarks.overhead``: W1's time per batch across git revisions, paired by round."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import overhead  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_one_round_reports_every_revision_and_gluon(capsys):
    assert (
        overhead.main(["--rounds", "1", "--epochs", "1", "--samples", "3200", "HEAD", "HEAD~0"])
        == 0
    )
    out = capsys.readouterr().out
    assert "round 1/1" in out
    rows = dict(re.findall(r"^\s+(HEAD|gluon): (\d+) \(", out, re.M))
    assert set(rows) == {"HEAD", "gluon"}, out
    assert all(int(us) > 0 for us in rows.values()), out
    # A revision against itself: its paired ratio is printed, and near 1 within noise.
    ratio = re.search(r"HEAD~0: .*this / HEAD: ([\d.]+)", out)
    assert ratio is not None and 0.2 < float(ratio.group(1)) < 5, out
    assert re.search(r"Gluon's time / this: [\d.]+ \(", out), out


@pytest.mark.parametrize("option", ["--rounds", "--epochs", "--samples"])
def test_counts_below_one_are_refused(option, capsys):
    with pytest.raises(SystemExit) as exc:
        overhead.main([option, "0", "HEAD"])
    assert exc.value.code == 2
    assert f"{option} must be >= 1, got 0" in capsys.readouterr().err


def test_an_unknown_revision_fails_before_measuring(capsys):
    with pytest.raises(SystemExit) as exc:
        overhead.main(["--rounds", "1", "no-such-revision-xyz"])
    assert "cannot read shardloader at revision 'no-such-revision-xyz'" in str(exc.value)
    assert "round 1" not in capsys.readouterr().out


@pytest.mark.parametrize("revs", [["HEAD", "HEAD"], ["gluon"]])
def test_repeated_or_reserved_revisions_are_refused(revs, capsys):
    with pytest.raises(SystemExit) as exc:
        overhead.main(revs)
    assert exc.value.code == 2
    assert "revs must be distinct and not 'gluon', got" in capsys.readouterr().err
