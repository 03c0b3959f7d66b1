"""Test ordering for ``make test``, and its two groups (``--group``)."""

# The directories and files whose tests mostly start other Python processes (bench runs, the
# CLI, the wheel, mpiexec) run after the rest: on a fresh clone (an empty kernel cache) a
# process started early compiles the kernels it needs again, while one started late loads
# what the in-process tests and kernels.precompile compiled meanwhile.
LATE = ("tests/benchmarks/", "tests/cli/", "tests/test_wheel.py", "tests/test_distributed.py",
        "tests/test_distributed_buckets.py", "tests/test_distributed_lm.py",
        "tests/test_packaging.py")

# `make test` runs the two groups as two pytest processes at once (tests/run_groups.py): one
# process runs on one core, and most tests here are single-threaded.
GROUPS = ("in-process", "processes")


def pytest_addoption(parser):
    parser.addoption("--group", choices=GROUPS, default=None,
                     help="run only the tests that start other processes ('processes': "
                          + ", ".join(LATE) + ") or only the others ('in-process')")


def group_of(nodeid: str) -> str:
    """The group of a test, from its node id (a path from the project root)."""
    return GROUPS[1] if nodeid.startswith(LATE) else GROUPS[0]


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: group_of(item.nodeid) == GROUPS[1])  # stable: order kept within
    group = config.getoption("group")
    if group is None:
        return
    dropped = [item for item in items if group_of(item.nodeid) != group]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if group_of(item.nodeid) == group]
