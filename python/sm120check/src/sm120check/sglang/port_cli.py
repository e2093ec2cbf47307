"""`sm120check sglang port-owner`: who listens on the server's port, and is it the server we started?

--before-start: the port must be free or held by the unit itself (its restart rebinds it); held by any other
process is a failure naming its pid and command line. --serving: the port must be answered by the unit's main
process or a process in its control group (systemd `show -p MainPID,ControlGroup`), or by --pid and its children;
a unit that has no running process while another answers is a failure naming both. Exit 0 ok, 1 not, 2 when it
cannot tell (no /proc, systemctl failed, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import sys

from sm120check import argtypes
from sm120check.exitcodes import Exit
from sm120check.safetext import terminal_text
from sm120check.sglang.port_owner import Owner, PortError, before_start, listeners, serving, tree_owner, unit_owner

SCHEMA = "sm120check.port-owner/1"
_port = argtypes.whole(1, 65535, unit="as a TCP port")
_pid = argtypes.whole(1, 1 << 22, unit="as a process id")


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = actions.add_parser(
        "port-owner",
        help="check that the server's port is free before a start, and answered by the started server after it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=_port, required=True, help="the server's TCP port")
    owner = p.add_mutually_exclusive_group(required=True)
    owner.add_argument("--unit", metavar="NAME", help="the systemd unit that runs the server")
    owner.add_argument("--pid", type=_pid, help="the server's process (its children count as it)")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--before-start", action="store_true", help="the port must be free or the owner's")
    when.add_argument("--serving", action="store_true", help="the port must be answered by the owner")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        owner: Owner = unit_owner(args.unit) if args.unit else tree_owner(args.pid)
        found = listeners(args.port)
    except PortError as exc:
        message = terminal_text(str(exc), one_line=True)
        if args.json:
            print(json.dumps({"schema": SCHEMA, "ok": False, "error": message, "problem": message}))
        print(f"sm120check sglang port-owner: {message}", file=sys.stderr)
        return Exit.USAGE
    who = f"unit {args.unit}" if args.unit else f"process {args.pid}"
    verdict = (before_start if args.before_start else serving)(found, owner, args.port, who)
    if args.json:
        doc = {
            "schema": SCHEMA,
            "ok": verdict.ok,
            "summary": verdict.summary,
            "fix": verdict.fix,
            "problem": "" if verdict.ok else verdict.line,
            "owner": {"description": owner.description, "main_pid": owner.main_pid, "cgroup": owner.cgroup},
            "listeners": [
                {"address": x.address, "port": x.port, "pid": x.pid, "cmdline": x.cmdline, "cgroup": x.cgroup}
                for x in verdict.listeners
            ],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(terminal_text(verdict.line, one_line=True))
    return Exit.OK if verdict.ok else Exit.FOUND
