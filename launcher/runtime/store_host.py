"""Hosts the workers' rendezvous store (a TCPStore) for node 0's launcher, as torchrun's agent does.

Run by the launcher with the workers' interpreter, as a file (no package import):
``python -c "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')" THIS_FILE ADDRESS PORT FD``.
FD is the launcher's listening socket on PORT (passed open, so no other program can take the port
in between), or -1 to bind PORT here. The store is what torchrun's agent creates (``is_master=True``,
``multi_tenant=True``, no wait for workers); the workers, told ``TORCHELASTIC_USE_AGENT_STORE=True``,
all connect to it as clients. It serves until its standard input closes (the launcher ends or
closes it), blocked on that read: no thread of its own, no polling. Imports only the standard library
and torch.
"""

from __future__ import annotations

import sys

NO_TORCH = 3  # torch cannot be imported: the workers of this interpreter cannot use torch's store either
CANNOT_LISTEN = 4  # the port is taken


def main(argv) -> int:
    address, port, fd = argv[0], int(argv[1]), int(argv[2])
    try:
        from torch.distributed import TCPStore
    except ImportError:
        return NO_TORCH
    try:
        store = TCPStore(address, port, None, True, wait_for_workers=False, multi_tenant=True,
                         master_listen_fd=None if fd < 0 else fd)
    except Exception as e:  # torch raises several types (DistNetworkError, RuntimeError)
        sys.stderr.write(f"launcher: the rendezvous store cannot listen on {address}:{port} ({e}); stop the "
                         "program holding that port, or choose another --started_port (--master_port).\n")
        return CANNOT_LISTEN
    sys.stdin.buffer.read()  # until the launcher closes it
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
