"""The hosts of a job started over ssh: a hostfile, horovodrun's ``-H`` list, DeepSpeed's --include and --exclude, and
each host's worker count and ranks. Pure.

A hostfile has one host a line, in any of three forms, mixed at will: DeepSpeed's and Open MPI's ``node1 slots=4``
(Open MPI's ``max_slots=N`` is taken and ignored, as the launcher never puts more workers on a host than its slots;
any other ``key=value`` is refused), horovodrun's ``node1:4``, and a bare ``node1`` (the node's default: one worker
per GPU, or its CPU default). ``#`` starts a comment, to the end of the line; blank lines are skipped. A host is a
name or an IP address (``launcher.addresses``); an IPv6 address takes its slots in brackets, ``[fd00::1]:4``, as a
port does, and a bare IPv6 address (``fd00::1``, ``fd00::1 slots=4``) is never split at a colon. Two lines that
name one host (names compared without case, addresses as addresses) are refused.

--include and --exclude take DeepSpeed's syntax, ``node1:0,2@node2``: hosts separated by ``@``, each alone (the
whole host) or with the GPU ids after a colon. A GPU id is one --selected_gpus takes on that host. Where a host's
slots are known, its ids are 0 to slots - 1 (DeepSpeed's rule); where they are not, the ids are checked when the
host's GPUs are known (``resolve``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Dict, Iterable, Optional, Sequence, Tuple

from launcher import addresses
from launcher.errors import LaunchError

FORMS = "HOST slots=N, HOST:N or HOST alone"
IGNORED_KEYS = ("max_slots", "max-slots")  # Open MPI's cap for oversubscribing a host, which the launcher never does
_EQUALS = re.compile(r"\s*=\s*")  # Open MPI takes "slots = 4" too
BOM = "\ufeff"  # what some editors write first in a UTF-8 file


@dataclass(frozen=True)
class Host:
    """One host of the job, as the hostfile (or --hosts) and --include/--exclude left it."""

    name: str
    slots: Optional[int] = None  # None: the node's default (one worker per GPU, or its CPU default)
    gpus: Optional[tuple] = None  # the GPU ids to use (--include, or --exclude where slots are known); None: all
    excluded: tuple = ()  # GPU ids --exclude removes where slots are not known yet, checked by ``resolve``


# ---------------------------------------------------------------- reading hosts


def parse_hostfile(text: str, source: str) -> Tuple[Host, ...]:
    """The hosts of a hostfile, in its order; ``source`` names the file in refusals (``hosts.txt:3``)."""
    placed = []
    for number, line in enumerate(text.removeprefix(BOM).split("\n"), 1):
        words = _EQUALS.sub("=", line.partition("#")[0]).split()
        if words:
            where = f"{source}:{number}"
            placed.append((where, _line_host(words, where)))
    if not placed:
        raise LaunchError(f"the hostfile {source} names no host; write one host a line ({FORMS}).")
    return _once_each(placed)


def parse_hosts(value: str, option: str = "--hosts") -> Tuple[Host, ...]:
    """horovodrun's ``-H node1:4,node2:2,node3``: the hosts in their order, a bare one with its node's default."""
    placed = []
    for item in value.split(","):
        if not item.strip():
            raise LaunchError(f"{option} {value} has an empty item; give comma-separated hosts such as node1:4,node2:4.")
        where = f"{option} {value}"
        placed.append((where, Host(*_host_word(item.strip(), where))))
    return _once_each(placed)


def _line_host(words: Sequence[str], where: str) -> Host:
    name, slots = _host_word(words[0], where)
    for word in words[1:]:
        key, equals, value = word.partition("=")
        if key == "slots" and equals:
            if slots is not None:
                raise LaunchError(f"{where} gives the slots of {name} twice; give them once ({FORMS}).")
            slots = _count(value, name, where)
        elif key in IGNORED_KEYS and equals:
            _count(value, name, where)
        else:
            raise LaunchError(f"{where} has {word!r} after {name}, which a hostfile line does not take; write {FORMS}.")
    return Host(name, slots)


def _host_word(word: str, where: str) -> Tuple[str, Optional[int]]:
    """``host``, ``host:N``, ``[v6]:N`` or a bare IPv6 address: (host, slots or None)."""
    try:
        name, tail = addresses.parts(word)
    except addresses.NotAnAddress:
        name, tail = "", None
    if not addresses.is_host(name) or name.startswith("-"):
        raise LaunchError(f"{where} has {word!r}, which is no host name or IP address; write {FORMS} (an IPv6 address "
                          "takes its slots in brackets, [fd00::1]:4; a login user goes in ~/.ssh/config).")
    return name, None if tail is None else _count(tail, name, where)


def _count(text: str, name: str, where: str) -> int:
    if not (addresses.DIGITS.fullmatch(text) and int(text) >= 1):
        raise LaunchError(f"{where} gives {name} the slots {text!r}; give a whole number of 1 or more, such as "
                          f"{addresses.joined(name, 4) if ':' in name else name + ':4'}.")
    return int(text)


def _once_each(placed: Iterable[Tuple[str, Host]]) -> Tuple[Host, ...]:
    first: Dict[str, str] = {}
    for where, host in placed:
        key = same_host_key(host.name)
        if key in first:
            again = "" if where == first[key] else f" (first at {first[key]})"
            raise LaunchError(f"{where} names {host.name} again{again}; give each host once, with all its slots.")
        first[key] = where
    return tuple(host for _, host in placed)


def same_host_key(name: str) -> str:
    """What two spellings of one host share: a name without case, an IP address as ``ipaddress`` writes it."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


# ---------------------------------------------------------------- --include and --exclude


def select(hosts: Sequence[Host], include: Optional[str], exclude: Optional[str]) -> Tuple[Host, ...]:
    """The hosts --include keeps or --exclude leaves (DeepSpeed's ``host1:0,2@host2``), in their order; a host whose
    every GPU is excluded is left out. Neither given (or empty): the hosts as they are."""
    if include and exclude:
        raise LaunchError(f"--include {include} and --exclude {exclude} were both given; give one of them "
                          "(--include keeps only what it names, --exclude keeps all but what it names).")
    option, text = ("--include", include) if include else ("--exclude", exclude)
    if not text:
        return tuple(hosts)
    named = _named(hosts, text, option)
    if option == "--include":
        kept = [_included(h, named[same_host_key(h.name)]) for h in hosts if same_host_key(h.name) in named]
    else:
        kept = [h for h in (_less(h, named.get(same_host_key(h.name), ())) for h in hosts) if h is not None]
    if not kept:
        raise LaunchError(f"--exclude {text} leaves no host to run on; exclude fewer hosts or GPUs.")
    return tuple(kept)


def _named(hosts: Sequence[Host], text: str, option: str) -> Dict[str, Optional[tuple]]:
    """Each host ``text`` names (its key) with its GPU ids, or None for the whole host; a host named twice takes both."""
    known = {same_host_key(h.name): h for h in hosts}
    named: Dict[str, Optional[tuple]] = {}
    for spec in text.split("@"):
        try:
            name, tail = addresses.parts(spec.strip())
        except addresses.NotAnAddress:
            name, tail = spec, None
        host = known.get(same_host_key(name))
        if host is None:
            raise LaunchError(f"{option} {text} names {name!r}, which is not one of the job's hosts; write "
                              "HOST[:GPU,GPU...] items joined by @, each host as the hostfile (or --hosts) names it.")
        ids = None if tail is None else _gpu_ids(tail, host, f"{option} {text}")
        key = same_host_key(name)
        if key in named:
            ids = None if ids is None or named[key] is None else named[key] + ids
        named[key] = None if ids is None else tuple(dict.fromkeys(ids))
    return named


def _gpu_ids(text: str, host: Host, where: str) -> tuple:
    ids = text.split(",")
    if not all(addresses.DIGITS.fullmatch(i) for i in ids):
        raise LaunchError(f"{where} gives {host.name} the GPU ids {text!r}; give comma-separated whole numbers, "
                          f"such as {host.name}:0,1.")
    beyond = [int(i) for i in ids if host.slots is not None and int(i) >= host.slots]
    if beyond:
        raise LaunchError(f"{where} names GPU {beyond[0]} of {host.name}, which has slots={host.slots}; give GPU ids "
                          f"from 0 to {host.slots - 1}.")
    return tuple(int(i) for i in ids)


def _included(host: Host, ids: Optional[tuple]) -> Host:
    return host if ids is None else replace(host, gpus=ids)


def _less(host: Host, ids: Optional[tuple]) -> Optional[Host]:
    """``host`` without the GPU ids ``ids`` (None: the whole host); None where nothing is left."""
    if ids is None:
        return None
    if not ids:
        return host
    if host.slots is None:
        return replace(host, excluded=tuple(sorted(set(host.excluded) | set(ids))))
    left = tuple(g for g in range(host.slots) if g not in ids)
    return replace(host, gpus=left) if left else None


# ---------------------------------------------------------------- each host's workers and ranks


def resolve(host: Host, default_slots: int, gpu_ids: Sequence[int]) -> Tuple[int, Optional[tuple]]:
    """(the host's worker count, the GPU ids to give it as --selected_gpus or None for the node's default), once the
    node's own facts are known: ``default_slots``, its worker count when nothing is said (one per GPU, or its CPU
    default), and ``gpu_ids``, the ids --selected_gpus takes there (empty: no GPU). ``slots=N`` on a GPU host is its
    first N GPUs (DeepSpeed's GPUs 0 to N-1), on a CPU host N CPU workers; GPU ids on a host with no GPU are refused."""
    gpu_ids = tuple(gpu_ids)
    if not gpu_ids:
        if host.gpus is not None or host.excluded:
            raise LaunchError(f"{host.name} has no GPU, but --include or --exclude names GPU ids of it; name the host "
                              "alone to keep or leave out the whole host.")
        return (host.slots or default_slots), None
    if host.gpus is not None or host.excluded:
        _all_there(host.gpus or host.excluded, host.name, gpu_ids)
        chosen = host.gpus or tuple(g for g in gpu_ids if g not in host.excluded)
        if not chosen:
            raise LaunchError(f"--exclude leaves {host.name} no GPU (it has {_listed(gpu_ids)}); exclude the whole "
                              f"host by its name alone, {host.name}, to run without it.")
    elif host.slots is not None:
        if host.slots > len(gpu_ids):
            raise LaunchError(f"{host.name} has slots={host.slots} but {len(gpu_ids)} GPU(s) ({_listed(gpu_ids)}); "
                              f"give it slots={len(gpu_ids)} or fewer.")
        chosen = gpu_ids[:host.slots]
    else:
        return default_slots, None
    return len(chosen), (None if chosen == gpu_ids else chosen)


def _all_there(ids: tuple, name: str, gpu_ids: tuple) -> None:
    missing = [g for g in ids if g not in gpu_ids]
    if missing:
        raise LaunchError(f"--include or --exclude names GPU {missing[0]} of {name}, which has the GPUs "
                          f"{_listed(gpu_ids)}; name only those.")


def _listed(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


def ranks(counts: Sequence[int]) -> Tuple[range, ...]:
    """Each node's global ranks, in node (hostfile) order: the running sum of the workers of the nodes before it, as
    torchrun gives them to nodes of different --nproc-per-node."""
    return tuple(range(start, start + count) for start, count in zip(accumulate(counts, initial=0), counts))
