"""The container lab: podman nodes, ansible-playbook runs against them, and the wheelhouse they install from.

Prepare a machine with `scripts/lab/setup` (root). Fixtures built on this live in tests/conftest.py and
tests/integration/conftest.py.
"""
