"""The table of scenario wall times printed after the run (tests/test_scenarios.py records
them), kept apart from conftest.py so that a pytest run can load it without importing MXNet:
tests/test_scenarios.py checks the table in pytest processes of its own, each started in
about a second instead of the seconds MXNet's import takes."""

from __future__ import annotations

import pytest

# (case, wall time in s, outcome) of each scenario program run (tests/test_scenarios.py).
SCENARIO_TIMES = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # After every test, with the summary: printed between the dots, the table made the run
    # look finished. Not with -q.
    times = config.stash.get(SCENARIO_TIMES, None)
    if not times or config.option.verbose < 0:
        return
    terminalreporter.write_sep("-", "scenario wall times")
    for name, wall, outcome in times:
        terminalreporter.write_line(f"{name:50s} {wall:6.1f} s  {outcome}")
    terminalreporter.write_line(f"{'total':50s} {sum(t for _, t, _ in times):6.1f} s")
