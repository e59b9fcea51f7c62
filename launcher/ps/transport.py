"""The wire: torch.distributed.rpc over TensorPipe between every server and trainer of the job.

``connect`` meets every process at server 0's store (bounded by FLAGS_rpc_deadline, naming who is
missing), then starts the RPC agent with FLAGS_rpc_get_thread_num worker threads and
FLAGS_rpc_deadline as the timeout of every call. ``call_all`` runs calls concurrently, a window at a
time, and turns a failed or dead peer into a PsError naming it. On a clean exit every process shuts
its agent down together with the others (torch's graceful shutdown: all reach it, outstanding calls
finish, then the connections close), bounded by FLAGS_rpc_deadline, so no agent is left reading from
a pipe another one closed (TensorPipe's EOF / EPIPE warnings). A process leaving on a failure exits
at once: the others notice the closed connections and fail too.
"""

from __future__ import annotations

import atexit
import re
import threading
import warnings
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Sequence

import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc

from launcher.ps.env import PsEnv
from launcher.runtime import parallel
from launcher.runtime.environment import WorkerEnv
from launcher.runtime.flags import RpcFlags

SHUTDOWN_WAIT = 10.0  # seconds the shutdown of the RPC agent may take at exit, beyond FLAGS_rpc_deadline


class PsError(RuntimeError):
    """A server or trainer failed, went away, or did not answer within FLAGS_rpc_deadline."""


@dataclass
class Link:
    """This process's place on the wire."""

    env: PsEnv
    flags: RpcFlags
    store: dist.Store


_link: Optional[Link] = None


def current_link() -> Link:
    if _link is None:
        raise RuntimeError("parameter-server RPC is not started: call fleet.init() (or transpile) first.")
    return _link


def connect(env: PsEnv, flags: RpcFlags) -> Link:
    """Join the RPC world of every server and trainer as ``env.name``."""
    global _link
    if _link is not None:
        if _link.env != env:
            raise RuntimeError(f"this process already joined as {_link.env.name}, not {env.name}.")
        return _link
    host, port = env.store_endpoint
    where = WorkerEnv(rank=env.rpc_rank, world_size=env.rpc_world_size, endpoints=env.endpoints_by_rpc_rank(),
                      master_addr=host, master_port=port)
    try:
        store = parallel.rendezvous(where, timedelta(milliseconds=flags.deadline_ms))
    except parallel.RendezvousError as e:
        raise PsError(rpc_names(str(e), env)) from None
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=max(2, flags.get_threads), rpc_timeout=flags.deadline_s,
                                              init_method=f"tcp://{host}:{port}",
                                              # TensorPipe's shared-memory transport busy-polls (most of a
                                              # core per idle process); TCP over libuv waits in epoll
                                              _transports=["uv"])
    # rpc.init_rpc would host a second store on server 0's port; this one is already there.
    dist_autograd._init(env.rpc_rank)
    with warnings.catch_warnings():  # torch's own device-map exchange uses a deprecated gloo call
        warnings.simplefilter("ignore", UserWarning)
        rpc._init_rpc_backend(rpc.BackendType.TENSORPIPE, dist.PrefixStore("rpc/", store), env.name, env.rpc_rank,
                              env.rpc_world_size, options)
    _link = Link(env, flags, store)
    parallel.note_exit_code()
    atexit.unregister(teardown)
    atexit.register(teardown)
    return _link


def rpc_names(text: str, env: PsEnv) -> str:
    """``text`` with each "rank N" of the RPC world called by its role ("server 1", "trainer 0")."""
    def name(match):
        rank = int(match.group(1))
        return f"server {rank}" if rank < len(env.servers) else f"trainer {rank - len(env.servers)}"

    return re.sub(r"\brank (\d+)", name, text)


def call_all(calls: Sequence[tuple], window: int) -> list:
    """Run ``calls`` ((to, function, args), ...) concurrently, at most ``window`` at a time; their results, in order."""
    link = current_link()
    results = [None] * len(calls)
    for start in range(0, len(calls), max(1, window)):
        batch = list(enumerate(calls))[start:start + max(1, window)]
        futures = [(i, to, rpc.rpc_async(to, fn, args=args, timeout=link.flags.deadline_s)) for i, (to, fn, args) in batch]
        for i, to, fut in futures:
            results[i] = wait(fut, to)
    return results


def call(to: str, fn, *args):
    return call_all([(to, fn, args)], 1)[0]


def start(to: str, fn, *args):
    """An RPC in flight (its future); ``wait(future, to)`` for its result."""
    return rpc.rpc_async(to, fn, args=args, timeout=current_link().flags.deadline_s)


def wait(fut, to: str):
    try:
        return fut.wait()
    except Exception as e:  # torch raises RuntimeError for remote errors, timeouts and closed pipes alike
        raise PsError(f"{current_link().env.name}: the call to {current_link().env.describe(to)} failed: "
                      f"{first_line(e)}") from None


def ping() -> bool:
    """Answered by every process: the liveness check servers run on trainers."""
    return True


def teardown() -> None:
    """At exit: leave at once on a failure, else shut the RPC agent down locally, boundedly."""
    global _link
    link, _link = _link, None
    if link is None:
        return
    code = parallel.exit_code()
    if code not in (None, 0):
        parallel.leave_now(code)
    done = threading.Thread(target=_shutdown_quietly, args=(link.flags.deadline_s,), daemon=True)
    done.start()
    done.join(link.flags.deadline_s + SHUTDOWN_WAIT)
    if done.is_alive():
        parallel.leave_now(0)


def disconnect() -> None:
    """Shut the RPC agent down now (a trainer after stop_worker, a server after run_server)."""
    teardown()


def _shutdown_quietly(timeout: float) -> None:
    """Shut down with every other process (they all get here on a clean exit); locally if that fails."""
    try:
        rpc.shutdown(graceful=True, timeout=timeout)
    except Exception:
        with suppress(Exception):
            rpc.shutdown(graceful=False)


def first_line(e: Exception) -> str:
    text = str(e).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # a remote exception arrives as "On WorkerInfo(...):\nType(message)\n<traceback>"
    for line in lines:
        if not line.startswith(("On WorkerInfo", "Traceback", "  ")):
            return line.strip()
    return lines[0] if lines else type(e).__name__
