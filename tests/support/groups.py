"""``xdist_group`` marks that keep their tests on one pytest-xdist worker, whatever the pytest.

``--dist loadgroup`` reads a test's group from a ``@group`` suffix that xdist's worker adds to
the test's node id; pytest 9.2 builds node ids another way and the suffix no longer sticks,
so every marked test was scheduled on its own (``test_cluster.py``'s cluster and
``test_sentinel.py``'s Sentinel set started once per worker; the tests sharing the fixed port
6399 could run at once). Here the workers write each marked test's group to a file, and the
controller's scheduler (``loadgroup``'s, with that file's groups) reads it once every worker
has collected. Loaded by ``tests/conftest.py`` (``pytest_plugins``); inert without xdist.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

DIR = pytest.StashKey[Path]()
INPUT = "aioqueue_groups_dir"  # the directory, as the controller hands it to each worker


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or getattr(config.option, "dist", "no") != "loadgroup":
        return
    config.stash[DIR] = Path(tempfile.mkdtemp(prefix="aioqueue-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if DIR in config.stash:
        shutil.rmtree(config.stash[DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(controller) Tell a worker where to write its groups."""
    config: pytest.Config = node.config
    if DIR in config.stash:
        node.workerinput[INPUT] = str(config.stash[DIR])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """(controller) ``loadgroup``'s scheduler, with the groups the workers wrote."""
    if DIR not in config.stash:
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    directory = config.stash[DIR]

    class FileGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first called once every worker has collected
                self.groups = {}
                for path in directory.glob("*.json"):
                    self.groups.update(json.loads(path.read_text()))
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after the conftest's marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """(worker) Write the group of each test marked ``xdist_group`` for the controller."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if not workerinput or INPUT not in workerinput:
        return
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name"))
    path = Path(workerinput[INPUT]) / f"{workerinput['workerid']}.json"
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(groups))
    os.replace(partial, path)  # whole or absent when the controller reads it
