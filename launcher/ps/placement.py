"""Which server holds which part of each dense parameter: Paddle 1.8's slicing and dispatch, exactly.

Pure: parameter names and shapes in, a tuple of Slices out. No torch.

Slicing (Paddle's ``slice_variable``): a parameter of ``numel`` elements is cut into
``split = min(servers, max(1, numel // min_block_size))`` blocks of ``ceil(numel / split)``
elements, rounded up to whole rows for tensors of two or more dimensions; the last block takes
what is left, so there are ``ceil(numel / block)`` slices. With ``slice_var_up=False`` every
parameter is one slice, and the parameters are dispatched in the order
``np.random.seed(random_seed); np.random.shuffle(params)`` gives (Paddle's ``transpile``, which
shuffles so that weights and biases do not pile up on alternate servers; its random_seed is the
program's, 0 by default). Dispatch: ``RoundRobin`` gives the slices to the servers in turn, counting
on across parameters; ``HashName`` gives a slice to server ``crc32(slice name) % servers`` (the
same in every process, unlike Python's salted ``hash``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

ROUND_ROBIN = "RoundRobin"
HASH_NAME = "HashName"
SPLIT_METHODS = (ROUND_ROBIN, HASH_NAME)


@dataclass(frozen=True)
class Slice:
    """Elements [offset, offset + size) of the flattened parameter ``param``, held by server ``server``."""

    param: str
    index: int  # the slice's number within its parameter
    offset: int
    size: int
    server: int
    whole: bool = True  # the parameter is not cut

    @property
    def name(self) -> str:
        """Paddle's name for the slice: the parameter's own when it is whole, else ``name.blockN``."""
        return self.param if self.whole else f"{self.param}.block{self.index}"


def block_sizes(shape: Sequence[int], servers: int, min_block_size: int, slice_var_up: bool = True) -> list:
    """The sizes of the slices of a parameter of ``shape`` (Paddle's slice_variable)."""
    numel = math.prod(shape)
    if not slice_var_up or numel == 0:
        return [numel]
    split = min(servers, max(1, numel // min_block_size))
    block = math.ceil(numel / split)
    if len(shape) >= 2:
        width = math.prod(shape[1:])
        block += (width - block % width) % width
    count = math.ceil(numel / block)
    return [min(block, numel - i * block) for i in range(count)]


def place(params: Sequence[tuple], servers: int, slice_var_up: bool = True, split_method: str = ROUND_ROBIN,
          min_block_size: int = 8192, random_seed: int = 0) -> tuple:
    """The Slices of ``params`` (a sequence of (name, shape)), in parameter order, each with its server."""
    check(servers, split_method, min_block_size)
    pieces = [_pieces(name, shape, servers, min_block_size, slice_var_up) for name, shape in params]
    order = dispatch_order(len(pieces), slice_var_up, random_seed)
    turn, placed = 0, {}
    for i in order:
        for piece in pieces[i]:
            server = turn % servers if split_method == ROUND_ROBIN else zlib.crc32(piece.name.encode()) % servers
            turn += 1
            placed[(i, piece.index)] = replace(piece, server=server)
    return tuple(placed[(i, piece.index)] for i in range(len(pieces)) for piece in pieces[i])


def dispatch_order(count: int, slice_var_up: bool, random_seed: int) -> list:
    """The order the parameters are dispatched in: theirs, or shuffled as Paddle's transpile does when whole."""
    order = list(range(count))
    if not slice_var_up:
        np.random.RandomState(random_seed).shuffle(order)  # = np.random.seed(seed); np.random.shuffle(...)
    return order


def _pieces(name: str, shape: Sequence[int], servers: int, min_block_size: int, slice_var_up: bool) -> list:
    sizes = block_sizes(shape, servers, min_block_size, slice_var_up)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return [Slice(name, i, offsets[i], size, 0, len(sizes) == 1) for i, size in enumerate(sizes)]


def check(servers: int, split_method: str, min_block_size: int) -> None:
    if servers < 1:
        raise ValueError(f"there are {servers} servers; parameter-server mode needs at least one (--server_num 1).")
    if split_method not in SPLIT_METHODS:
        raise ValueError(f"split_method={split_method!r} is not one of {', '.join(map(repr, SPLIT_METHODS))}.")
    if not isinstance(min_block_size, int) or min_block_size < 1:
        raise ValueError(f"min_block_size={min_block_size!r} must be a whole number of at least 1.")


def format_table(slices: Sequence[Slice], endpoints: Sequence[str], tables: Sequence[tuple] = ()) -> str:
    """The placement as text: one line per slice (and per sparse table, ``tables`` = (name, rows))."""
    rows = [("parameter", "slice", "offset", "size", "server")]
    rows += [(s.param, s.name, str(s.offset), str(s.size), f"{s.server} {endpoints[s.server]}") for s in slices]
    rows += [(name, "rows id % servers", "-", str(count), "all (row id % servers)") for name, count in tables]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
