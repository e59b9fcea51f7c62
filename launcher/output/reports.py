"""What the launcher reports in words: the plan table (--print_config), a worker's failure, and where
each rank was (its stacks) when a job failed or hung."""

from __future__ import annotations

import errno
import os
import shlex
import time

from launcher import envvars as ev
from launcher.output import error_file
from launcher.output.messages import log
from launcher.plan import node_ports
from launcher.plan.parsing import spoken_list
from launcher.plan.policy import describe_exit
from launcher.plan.roles import PS_ROLES, SERVER, TRAINER


def format_plan(plan) -> str:
    """The resolved plan as a small table (--print_config)."""
    if plan.parameter_server:
        return _format_ps_plan(plan)
    nodes = len(plan.node_ips)
    unverified = plan.gpus_not_found
    if plan.cpu_default:
        workers = "CPU worker(s) here (no GPU found: the default; --nproc_per_node sets it)"
    elif unverified:
        workers = ("worker(s) here, GPU ids passed on as given (no GPU detected on this machine; FLAGS_selected_gpus is set, "
                   "so a worker uses a GPU only if CUDA finds one)")
    else:
        workers = f"{plan.device.upper()} worker(s) here"
    lines = [
        f"launcher: node {plan.node_rank} of {nodes} ({plan.node_ip}), "
        f"{len(plan.workers)} {workers}, world size {plan.world_size}",
        f"  master (rank 0 store): {plan.workers[0].env['MASTER_ADDR']}:{plan.workers[0].env['MASTER_PORT']}",
    ]
    if plan.cluster:
        lines.append(f"  cluster: {plan.cluster}")
    if nodes > 1:
        shown = ",".join(plan.node_ips[:8]) + (f",... ({nodes} nodes)" if nodes > 8 else "")
        lines.append(f"  nodes: {shown}{_sharing(plan)}")
    placed = any(w.cpus is not None for w in plan.workers)
    rows = [("rank", "local", "endpoint", "device") + (("cpus",) if placed else ()) + ("log",)]
    for w in plan.workers:
        device = "cpu" if w.gpu is None else f"gpu {w.gpu} (not found)" if unverified else f"gpu {w.gpu}"
        cpus = (w.cpu_list or "any",) if placed else ()
        rows.append((str(w.rank), str(w.local_rank), w.endpoint, device) + cpus + (w.log_file or "console",))
    lines += table(rows)
    return "\n".join(lines + _plan_footer(plan))


def _sharing(plan) -> str:
    """`` (nodes 0 and 1 share 127.0.0.1, each with its own ports)`` where this node shares its host."""
    others = node_ports.sharing(plan.node_ips, plan.node_rank)
    if not others:
        return ""
    named = sorted(others + (plan.node_rank,))
    who = f"nodes {spoken_list(named)}" if len(named) <= 8 else f"{len(named)} nodes"
    return f" ({who} share {plan.node_ip}, each with its own ports)"


def _format_ps_plan(plan) -> str:
    nodes = len(plan.node_ips)
    here = {role: sum(w.kind == role for w in plan.workers) for role in PS_ROLES}
    lines = [
        f"launcher: parameter-server job, node {plan.node_rank} of {nodes} ({plan.node_ip}): "
        f"{here[SERVER]} server(s) and {here[TRAINER]} trainer(s) here, "
        f"{len(plan.servers)} and {len(plan.trainers)} in the job",
        f"  servers: {','.join(plan.servers)}",
        f"  trainers: {','.join(plan.trainers[:16])}" + (f",... ({len(plan.trainers)})" if len(plan.trainers) > 16 else ""),
    ]
    if nodes > 1:
        lines.append(f"  nodes: {','.join(plan.node_ips[:8])}" + (f",... ({nodes} nodes)" if nodes > 8 else ""))
    rows = [("role", "id", "endpoint", "log")]
    rows += [(w.role, str(w.role_index), w.endpoint, w.log_file or "console") for w in plan.workers]
    return "\n".join(lines + table(rows) + _plan_footer(plan))


def table(rows: list, indent: str = "  ") -> list:
    """``rows`` (tuples of texts, the first the headings) as aligned columns, a line each."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip() for r in rows]


def _plan_footer(plan) -> list:
    lines = [f"  command: {shlex.join(plan.workers[0].cmd)}"]
    if plan.control is not None:
        lines.append(f"  control: node 0 ({plan.node_ips[0]}) listens on port {plan.control.port}, job {plan.control.job_id}, "
                     f"heartbeat timeout {plan.control.heartbeat_timeout:g} s, join timeout {plan.control.join_timeout:g} s"
                     f"{', token set' if plan.control.token else ''}")
    if plan.max_restarts:
        lines.append(f"  restarts: up to {plan.max_restarts} (the whole job)")
    return lines


def format_failure(failure) -> str:
    where = failure.log_file or "console (no --log_dir)"
    label = failure.label or f"rank {failure.rank}"
    local = "" if failure.label else f"local rank {failure.local_rank}, "
    lines = [
        f"launcher: {label} ({local}pid {failure.pid}) failed: "
        f"{describe_exit(failure.returncode)} after {failure.run_time:.1f} s; log: {where}",
    ]
    if failure.last_lines:
        lines.append(f"launcher: last lines of {label}:")
        lines += [f"  | {line}" for line in failure.last_lines]
    recorded = error_file.traceback_of(failure.error).rstrip("\n").split("\n")
    if recorded != [""]:
        lines.append(f"launcher: root cause, as {label}'s @record wrote it ({ev.ERROR_FILE}):")
        lines += [f"  | {line}" for line in recorded[-error_file.SHOWN_LINES:]]
    return "\n".join(lines)


# ---------------------------------------------------------------- stacks of a stopped or hung job


def format_stacks(stacks, node_label: str, names=None) -> str:
    """Where each rank was (``launcher.run.stacks.Stack``), one line per rank, for the console.

    When no rank has a stack and all for the same reason (py-spy not installed), that reason is given once.
    """
    notes = {s.note for s in stacks}
    if stacks and not any(s.text for s in stacks) and len(notes) == 1:
        return f"launcher: no stacks of the {len(stacks)} worker(s) of {node_label}: {notes.pop()}"
    lines = [f"launcher: where each rank of {node_label} was:"]
    lines += [f"  {_name(s.rank, names)} (pid {s.pid}): {_stack_summary(s)}" for s in stacks]
    return "\n".join(lines)


def format_dumps(stacks, header: str, names=None) -> str:
    """The full py-spy dump of each rank under one dated header (for log_dir/stacks.txt, or the console)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    parts = [f"===== {when} launcher: {header}\n"]
    for s in stacks:
        parts.append(f"--- {_name(s.rank, names)} (pid {s.pid}): {_stack_summary(s)}\n")
        if s.text:
            parts.append(s.text if s.text.endswith("\n") else s.text + "\n")
    return "".join(parts)


def _name(rank: int, names) -> str:
    return (names or {}).get(rank, f"rank {rank}")


def write_stacks(path: str, stacks, header: str, names=None) -> None:
    """Append the full dumps to ``path`` in one write, so that the dumps of nodes sharing the log dir on one
    host (a hang stops them all at once) never interleave; a file that cannot be written is a warning, not an error."""
    data = format_dumps(stacks, header, names).encode("utf-8", errors="replace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        if written != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as e:
        log.warning("could not write the workers' stacks to %s (%s)", path, e.strerror or e)


def _stack_summary(stack) -> str:
    if stack.text is None:
        return f"no stack: {stack.note}"
    return stack.where or "no Python frame found in the dump"
