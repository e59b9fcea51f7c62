"""Changes to the files of one folder, as they happen: reported by the kernel (inotify, through
ctypes) where it can, else found by polling their sizes and times; a look only, nothing is written.

Both ways give the same ``Changed`` batches behind one interface, ``FolderChanges``: the names of
the files made or changed, in the order they were first reported; the names deleted or renamed
away (a file under that name later is another one); whether anything at all may have changed (the
kernel's queue overflowed); and whether the folder itself is gone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import selectors
import stat
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

IN_MODIFY, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x2, 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x2000, 0x4000, 0x8000
IN_ONLYDIR = 0x01000000
ENTRY = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
REMOVED = IN_MOVED_FROM | IN_DELETE
WATCHED = IN_MODIFY | ENTRY | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
FOLDER_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
READ_SIZE = 1 << 16

# File systems whose files other machines write (or another kernel: a VM's host) without this
# kernel seeing it: inotify reports only what is written from here.
REMOTE = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "beegfs", "glusterfs", "9p",
          "afs", "coda", "ocfs2", "gfs2", "pvfs2", "orangefs", "panfs", "wekafs", "virtiofs", "fuse", "fuseblk"}

POLL = 0.2  # how often polling looks, at the least
POLL_SHARE = 0.1  # the most of a core polling may take: a look that costs more waits longer for the next


@dataclass(frozen=True)
class Changed:
    names: tuple = ()  # files made or whose contents changed, in the order first reported
    removed: frozenset = frozenset()  # names deleted or renamed away (or, polling, now another file)
    everything: bool = False  # anything may have changed (the kernel's queue overflowed)
    gone: bool = False  # the folder itself was deleted, moved or unmounted


class FolderChanges(Protocol):
    how: str  # "inotify" or "polling"

    def wait(self, timeout: float) -> Changed:
        """The changes seen within ``timeout`` seconds (an empty batch when none)."""

    def close(self) -> None: ...


class Unwatchable(Exception):
    """Why the kernel cannot report a folder's changes, as the end of a sentence; ``limit`` when a
    limit of the system was reached (which the user can raise), not a missing feature."""

    def __init__(self, why: str, limit: bool = False) -> None:
        super().__init__(why)
        self.limit = limit


def _libc():
    if not sys.platform.startswith("linux"):
        raise Unwatchable(f"inotify is Linux's, and this is {sys.platform}")
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "inotify_init1"):
        raise Unwatchable("this C library has no inotify")
    return libc


LIMITS = {errno.EMFILE: "fs.inotify.max_user_instances", errno.ENFILE: "the system's open files",
          errno.ENOSPC: "fs.inotify.max_user_watches"}


def _refused(call: str, err: int) -> Unwatchable:
    if err in LIMITS:
        return Unwatchable(f"{call}: {os.strerror(err)}, the limit {LIMITS[err]} is reached", limit=True)
    return Unwatchable(f"{call}: {os.strerror(err)}")


class InotifyChanges:
    """The kernel's reports of one folder's changes: one inotify watch on the folder, read through a
    selector. Raises Unwatchable when the kernel will not watch it."""

    how = "inotify"

    def __init__(self, folder: str) -> None:
        libc = _libc()
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise _refused("inotify_init1", ctypes.get_errno())
        if libc.inotify_add_watch(self.fd, os.fsencode(folder), WATCHED) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise _refused("inotify_add_watch", err)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)

    def wait(self, timeout: float) -> Changed:
        if not self.selector.select(max(0.0, timeout)):
            return Changed()
        return batch(self._events())

    def _events(self) -> list:
        events = []
        while True:
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                return events
            events.extend(parse_events(data))

    def close(self) -> None:
        self.selector.close()
        os.close(self.fd)


def parse_events(data: bytes) -> list:
    """(mask, name) of each inotify event in ``data`` (the name "" for the folder itself)."""
    events, at = [], 0
    while at + EVENT.size <= len(data):
        _, mask, _, length = EVENT.unpack_from(data, at)
        name = data[at + EVENT.size:at + EVENT.size + length].rstrip(b"\0")
        events.append((mask, os.fsdecode(name)))
        at += EVENT.size + length
    return events


def batch(events: list) -> Changed:
    names, removed, everything, gone = {}, set(), False, False
    for mask, name in events:
        everything |= bool(mask & IN_Q_OVERFLOW)
        gone |= bool(mask & FOLDER_GONE)
        if name and mask & REMOVED:
            removed.add(name)
        elif name and mask & (IN_MODIFY | ENTRY):
            names.setdefault(name, None)
    return Changed(tuple(names), frozenset(removed), everything, gone)


class PollingChanges:
    """A folder's changes found by looking: its listing and the size, time and identity of each
    wanted file, every POLL seconds, or less often when one look costs more than POLL_SHARE of that.
    The files changed between two looks are given in the order of their last writes."""

    how = "polling"

    def __init__(self, folder: str, wanted: Callable[[str], bool], clock=time.monotonic, sleep=time.sleep) -> None:
        self.folder, self.wanted, self.clock, self.sleep = folder, wanted, clock, sleep
        self.next_look = 0.0
        self.seen = self._timed_look()

    def _look(self) -> Optional[dict]:
        """name -> (device, inode, size, mtime) of each wanted file; None when the folder is gone."""
        try:
            names = [name for name in os.listdir(self.folder) if self.wanted(name)]
        except OSError:
            return None
        found = {}
        for name in names:
            try:
                s = os.stat(os.path.join(self.folder, name))
            except OSError:
                continue
            found[name] = (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) if stat.S_ISREG(s.st_mode) else None
        return found

    def _timed_look(self) -> Optional[dict]:
        start = self.clock()
        found = self._look()
        self.next_look = start + max(POLL, (self.clock() - start) / POLL_SHARE)
        return found

    def wait(self, timeout: float) -> Changed:
        now = self.clock()
        if now < self.next_look:
            if timeout <= 0:
                return Changed()
            self.sleep(min(timeout, self.next_look - now))
            if self.clock() < self.next_look:
                return Changed()
        return self._compare(self._timed_look())

    def _compare(self, found: Optional[dict]) -> Changed:
        before, self.seen = self.seen or {}, found
        if found is None:
            return Changed(gone=True)
        changed = [name for name, facts in found.items() if before.get(name) != facts]
        names = tuple(sorted(changed, key=lambda name: found[name][3] if found[name] else 0))  # by last write
        others = {name for name in names if name in before and _identity(before[name]) != _identity(found[name])}
        return Changed(names, frozenset(others | (set(before) - set(found))))

    def close(self) -> None:
        pass


def _identity(facts: Optional[tuple]) -> Optional[tuple]:
    return facts[:2] if facts else None


def mount_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> Optional[str]:
    """The type of the file system that holds ``path`` (``ext4``, ``nfs4``, ``fuse.sshfs``); None
    when it cannot be told."""
    real = os.path.realpath(path)
    best, kind = -1, None
    try:
        with open(mountinfo, "rb") as f:
            lines = os.fsdecode(f.read()).splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = _unescaped(parts[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, kind = len(point), rest.split()[0]
    return kind


def _unescaped(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def is_remote(kind: Optional[str]) -> bool:
    return kind is not None and (kind in REMOTE or kind.startswith("fuse."))
