"""`make test`'s two groups (tests/conftest.py) and the runner that starts them at once."""
from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"blasnet_tests_{name}", TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(TESTS))  # run_groups imports conftest as its script folder's module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(TESTS))
    return module


conftest = _load("conftest")
run_groups = _load("run_groups")


def _test_files():
    return sorted(p.relative_to(ROOT).as_posix() for p in TESTS.rglob("test_*.py"))


def test_every_test_file_is_in_one_group_and_every_late_entry_names_files():
    files = _test_files()
    groups = {f: conftest.group_of(f + "::test_x") for f in files}
    assert set(groups.values()) == set(conftest.GROUPS)
    for prefix in conftest.LATE:  # a renamed folder would move its tests to the other group
        assert any(f.startswith(prefix) for f in files), prefix
    assert groups["tests/test_wheel.py"] == "processes"
    assert groups["tests/cli/test_cli.py"] == "processes"
    assert groups["tests/kernels/test_activations.py"] == "in-process"
    assert groups["tests/test_run_groups.py"] == "in-process"


class _Config:
    def __init__(self, group):
        self.group, self.deselected = group, []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

    def getoption(self, name):
        assert name == "group"
        return self.group


def _items():
    ids = ["tests/cli/test_cli.py::a", "tests/nn/test_x.py::b", "tests/test_wheel.py::c",
           "tests/kernels/test_y.py::d", "tests/test_data.py::e", "tests/benchmarks/test_z.py::f"]
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_without_a_group_every_test_runs_those_that_start_processes_last():
    items, config = _items(), _Config(None)
    conftest.pytest_collection_modifyitems(config, items)
    assert [i.nodeid[-1] for i in items] == list("bdeacf")
    assert config.deselected == []


@pytest.mark.parametrize("group, kept", [("in-process", "bde"), ("processes", "acf")])
def test_a_group_keeps_its_tests_in_order_and_reports_the_others_deselected(group, kept):
    items, config = _items(), _Config(group)
    conftest.pytest_collection_modifyitems(config, items)
    assert "".join(i.nodeid[-1] for i in items) == kept
    assert sorted(i.nodeid[-1] for i in items + config.deselected) == list("abcdef")


class _Runs:
    """Stands in for subprocess: records the commands, returns the given statuses."""

    def __init__(self, statuses, interrupt=False):
        self.statuses, self.interrupt, self.commands, self.killed = statuses, interrupt, [], False
        self.STDOUT = object()

    def call(self, cmd, cwd):
        self.commands.append(cmd)
        assert Path(cwd) == ROOT
        if self.interrupt:
            raise KeyboardInterrupt
        return self.statuses[cmd[-1]] if "--group" in cmd else self.statuses["all"]

    def Popen(self, cmd, stdout, stderr, cwd):  # noqa: N802 (subprocess's name)
        self.commands.append(cmd)
        stdout.write("report of the other group\n")
        runs = self

        class Child:
            def wait(self):
                return runs.statuses[cmd[-1]]

            def poll(self):
                return None if runs.interrupt else runs.statuses[cmd[-1]]

            def kill(self):
                runs.killed = True
        return Child()


@pytest.mark.parametrize("statuses, expected", [((0, 0), 0), ((1, 0), 1), ((0, 2), 2),
                                                ((1, 2), 1), ((5, 0), 0), ((0, 5), 0),
                                                ((5, 1), 1), ((5, 5), 5)])
def test_two_cpus_run_both_groups_at_once_and_fail_if_either_fails(monkeypatch, capsys,
                                                                   statuses, expected):
    runs = _Runs(dict(zip(conftest.GROUPS, statuses)))
    monkeypatch.setattr(run_groups, "subprocess", runs)
    monkeypatch.setattr(run_groups, "_cpus", lambda: 2)
    assert run_groups.main(["-q"]) == expected
    base = [sys.executable, "-m", "pytest", "tests", "-q", "--group"]
    assert sorted(runs.commands) == sorted([base + ["in-process"], base + ["processes"]])
    assert capsys.readouterr().out.endswith("report of the other group\n")


def test_one_cpu_runs_the_whole_suite_in_one_process(monkeypatch):
    runs = _Runs({"all": 3})
    monkeypatch.setattr(run_groups, "subprocess", runs)
    monkeypatch.setattr(run_groups, "_cpus", lambda: 1)
    assert run_groups.main(["-q", "-x"]) == 3
    assert runs.commands == [[sys.executable, "-m", "pytest", "tests", "-q", "-x"]]


def test_an_interrupt_stops_the_other_group_too(monkeypatch):
    runs = _Runs(dict.fromkeys(conftest.GROUPS, 0), interrupt=True)
    monkeypatch.setattr(run_groups, "subprocess", runs)
    monkeypatch.setattr(run_groups, "_cpus", lambda: 2)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with pytest.raises(KeyboardInterrupt):
        run_groups.main([])
    assert runs.killed
