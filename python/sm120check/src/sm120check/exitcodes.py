"""The exit status of every `sm120check` command, one meaning per number."""

from __future__ import annotations

import enum
import signal


class Exit(enum.IntEnum):
    OK = 0
    # The command ran and found something: a check failed, a patch (or revert) is needed, the fleet is not ready,
    # a bundle entry is refused, the launch is degraded.
    FOUND = 1
    # The command could not do its job: bad arguments or input files, an unreadable or unwritable path, a tree it
    # does not understand, an internal error.
    USAGE = 2
    INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C
    TERMINATED = 128 + signal.SIGTERM  # 143: `timeout`, systemd, Ansible

    @classmethod
    def signalled(cls, signum: int) -> int:
        """The status of a run stopped by `signum` (128 + its number, as the shell reports it)."""
        return 128 + signum
