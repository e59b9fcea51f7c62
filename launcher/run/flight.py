"""Ask torch's NCCL flight recorder in each running worker to write its dump, before a stop.

Launcher side, no torch. A worker's ProcessGroupNCCL watches the FIFO ``<stem><rank>.pipe`` when
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` and the recorder is on (``TORCH_FR_BUFFER_SIZE`` above 0);
a byte written there makes it dump its recent collectives to ``TORCH_FR_DUMP_TEMP_FILE`` + rank.
The plan sets those variables (with ``--log_dir`` and ``--hang_timeout`` or ``--dump_stacks``); this
module pokes the pipes and waits, bounded, for the dumps.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import Callable, Iterable, Mapping

from launcher import envvars as ev
from launcher.plan.parsing import DIGITS

PIPE_VARIABLE = ev.FR_PIPE_FILE
DUMP_VARIABLE = ev.FR_DUMP_TEMP_FILE
# How long a stop waits for the dumps it asked for, as torch's own wait for a dump
# (TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC, 15 s by default): one dump took 6 s on an H200 with torch 2.11.
WAIT_SECONDS = 15.0
WAIT_VARIABLES = ("TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")
POLL_SECONDS = 0.1


def request(ranks: Iterable[int], env: Mapping[str, str]) -> dict:
    """Poke the pipe of each rank whose recorder listens; {rank: the dump file it will write}."""
    stem, dump = env.get(PIPE_VARIABLE), env.get(DUMP_VARIABLE)
    if not stem or not dump:
        return {}
    return {rank: f"{dump}{rank}" for rank in ranks if _poke(f"{stem}{rank}.pipe")}


def wait_seconds(env: Mapping[str, str]) -> float:
    """torch's wait for a dump where the user set it (in milliseconds), else ``WAIT_SECONDS``."""
    for name in WAIT_VARIABLES:
        value = env.get(name, "").strip()
        if DIGITS.fullmatch(value) and int(value) > 0:
            return int(value) / 1000
    return WAIT_SECONDS


def wait(dumps: Mapping[int, str], timeout: float = WAIT_SECONDS,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Wait until every dump exists and has stopped growing, or ``timeout``; {rank: path} of those written."""
    deadline = clock() + timeout
    sizes: dict = {}
    while True:
        now = {rank: _size(path) for rank, path in dumps.items()}
        done = {rank for rank, size in now.items() if size and sizes.get(rank) == size}
        if len(done) == len(dumps) or clock() >= deadline:
            return {rank: dumps[rank] for rank in done}
        sizes = now
        sleep(POLL_SECONDS)


def _poke(pipe: str) -> bool:
    """Write one byte to a FIFO that has a reader; False when there is none (or it is not a FIFO)."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:  # ENOENT: never made (no NCCL group yet); ENXIO: nobody reads it
        if e.errno not in (errno.ENOENT, errno.ENXIO, errno.EACCES, errno.ENOTDIR, errno.EISDIR):
            raise
        return False
    try:
        if not _is_fifo(fd):
            return False
        os.write(fd, b"1\n")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _is_fifo(fd: int) -> bool:
    return stat.S_ISFIFO(os.fstat(fd).st_mode)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
