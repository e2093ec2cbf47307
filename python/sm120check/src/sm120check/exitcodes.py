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


# What 1 means for each command (0, 2, 130 and 143 mean the same everywhere); `sm120check CMD --help` ends with it.
FOUND_MEANS = {
    "doctor": "a check failed",
    "sglang scan": "a gap the patch closes was found",
    "sglang patch": "with --check: a patch (or revert) is needed",
    "sglang verify-launch": "the launch is degraded (with --strict: or a verdict is unknown)",
    "sglang port-owner": "the port is held by another process, or not answered by the server's unit",
    "sglang": "what the subcommand found (a gap, a patch needed, a degraded launch: see its --help)",
    "bench": "a request failed, a level had no numbers, or the server stalled after a level",
    "crossover": "not used (no crossover in range is a result: 0)",
    "mock-server": "not used (it serves until --max-seconds or SIGTERM: 0)",
    "fleet": "the fleet is not ready",
    "stack": "the resolve or the plan found a conflict",
    "jit": "a bundle entry is refused or a module is not cached",
    "soak": "a soak verdict failed (an Xid, a GPU off the bus, NVML hung, the server died or stalled, a collapse)",
}


def epilog(command: str) -> str:
    """The exit-status table of `command` ("sglang scan"), as its --help prints it."""
    found = FOUND_MEANS.get(command) or FOUND_MEANS.get(command.split()[0], "the command found something")
    return (
        "exit status:\n"
        f"  {Exit.OK:<3}  done, nothing found\n"
        f"  {Exit.FOUND:<3}  {found}\n"
        f"  {Exit.USAGE:<3}  usage error, unreadable input, or the job could not be done\n"
        f"  {Exit.INTERRUPTED:<3}  interrupted (Ctrl-C); {Exit.TERMINATED}: terminated (SIGTERM: timeout, systemd)"
    )
