"""A host's answer to the check of ``--hostfile``'s command (``launcher.plan.over_ssh``): its Python and launcher
versions, whether the script and config file are in the working directory, its GPUs, the address the command
reached it at (and the command's own, as this host sees it), and how many ports are free in a row from each port it is asked about.
Read-only looks."""

from __future__ import annotations

import os
import platform
from typing import Mapping

import launcher
from launcher.host import preflight

MAX_STARTS, MAX_RUN = 16, 4096  # at most this many ports asked about, each with at most this many after it


def facts(request: Mapping, env: Mapping[str, str]) -> dict:
    """This host's facts for ``request`` (``over_ssh.probe_request``'s; any field may be missing or wrong)."""
    server, client = _ssh_ends(env.get("SSH_CONNECTION", ""))
    address = server or "127.0.0.1"
    starts = request.get("starts") if isinstance(request.get("starts"), list) else []
    limit = request.get("limit") if isinstance(request.get("limit"), int) else 0
    return {
        "python": platform.python_version(),
        "launcher": launcher.__version__,
        "directory": os.getcwd(),
        "script_found": _is_file(request.get("script")),
        "config_found": _is_file(request.get("config")),
        "gpus": preflight.count_gpus(),
        "address": address,
        "command_address": client,
        "free": [_free_run(address, start, min(limit, MAX_RUN)) for start in starts[:MAX_STARTS]],
    }


def _ssh_ends(connection: str) -> tuple:
    """(this host's address, the client's) from SSH_CONNECTION ("client port server port"); (None, None) without."""
    parts = connection.split()
    return (parts[2], parts[0]) if len(parts) == 4 else (None, None)


def _is_file(path) -> bool:
    return isinstance(path, str) and bool(path) and os.path.isfile(path)


def _free_run(address: str, start, limit: int) -> int:
    """How many ports from ``start`` on (at most ``limit``) can be bound on ``address`` now, one after another."""
    if not isinstance(start, int) or isinstance(start, bool) or not 1 <= start <= 65535:
        return 0
    count = 0
    while count < limit and start + count <= 65535 and preflight.port_taken(address, start + count) is None:
        count += 1
    return count
