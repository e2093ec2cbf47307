"""The container lab: podman nodes, ansible-playbook runs against them, and the wheelhouse they install from.

Prepare a machine with `scripts/lab/setup` (root). Fixtures built on this live in tests/conftest.py and
tests/integration/conftest.py.
"""

from __future__ import annotations

import os


def in_ci() -> bool:
    """CI=true (as .ci/run sets it): a missing lab or lab input is then a failure, never a skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}
