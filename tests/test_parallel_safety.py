"""The suite runs on two pytest-xdist workers (README's test command): what must not run side by side does not.

A test that launches several processes meeting on one port (``accelerate launch``'s default 29500, a
torch.distributed store) must be in ``conftest.ONE_PORT``, whose modules share one xdist group: two such launches
at once would take each other's port and fail, or worse, meet each other's processes.
"""

from __future__ import annotations

import re
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent
# What starts processes that meet on a port: a multi-process launch, the fixture doing one, a store's port.
LAUNCHES = re.compile(r"--num_processes|launch_two_processes|MASTER_PORT|main_process_port|init_process_group")


def test_every_module_that_launches_processes_on_one_port_runs_on_one_worker():
    launching = {path.stem for path in TESTS.glob("test_*.py")
                 if path.stem != Path(__file__).stem and LAUNCHES.search(path.read_text())}
    assert "test_launcher" in launching  # the pattern finds what it is for
    assert launching - conftest.ONE_PORT == set(), "add these modules to conftest.ONE_PORT"
    assert conftest.ONE_PORT - {path.stem for path in TESTS.glob("test_*.py")} == set()  # no stale names


def test_the_longest_tests_are_named_by_their_ids():
    for nodeid in conftest.LONGEST_FIRST:
        module, name = nodeid.split("::")
        assert re.search(rf"^def {name}\(", (TESTS / module).read_text(), re.M), nodeid
