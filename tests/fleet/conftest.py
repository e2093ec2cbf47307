"""The fleet fixture: three core nodes converged in one ansible-playbook run, one of them broken in two ways, a
node that was never provisioned, and an inventory host without a container; playbooks/doctor.yml run over all of
them once, shared by the module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.converge import converge
from lab.fleet_lab import FleetLab, break_node, cu12_wheel, run_doctor, write_inventory
from lab.podman import Mount, NodeFactory
from lab.wheelhouse import NODE_PATH, WheelhouseError, build_wheelhouse


@pytest.fixture(scope="module")
def fleet(make_module_node: NodeFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetLab]:
    try:
        directory, _ = build_wheelhouse("core")
    except WheelhouseError as error:
        pytest.fail(str(error), pytrace=False)
    wheelhouse = [Mount(directory, NODE_PATH)]
    first, second, third = (make_module_node(f"fleet{i}", mounts=wheelhouse) for i in (1, 2, 3))
    bare = make_module_node("fleetbare")
    ghost = f"{bare.name}-ghost"
    provisioned = write_inventory("converge", [first.name, second.name, third.name])
    everything = write_inventory("doctor", [first.name, second.name, third.name, bare.name, ghost])
    try:
        converged = converge(provisioned)
        if converged.rc != 0:
            pytest.fail(f"converging the three fleet nodes failed:\n{converged.tail()}", pytrace=False)
        break_node(second, cu12_wheel())
        runs = tmp_path_factory.mktemp("fleet-runs")
        doctor = run_doctor(everything, runs)
        yield FleetLab((first, third), second, bare, ghost, everything, runs, converged, doctor)
    finally:
        provisioned.unlink(missing_ok=True)
        everything.unlink(missing_ok=True)
