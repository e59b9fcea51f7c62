"""A trainer: computes gradients on its own batches, sends them to the servers, and takes back the
parameters they hold; its sparse tables live on the servers, and it fetches only the rows it uses.

Each mode's step (``Worker.step``):
- sync: send every gradient, wait for the servers to apply the step of every trainer, take the new values.
- async: send, the servers apply on arrival, take the new values.
- half_async: average the gradients of max_merge_var_num steps and send them as one async update
  while training goes on; take the values it brings back when the next merged update is sent.
- geo: step the user's optimizer locally; every update_frequency steps send each parameter's change
  since the last exchange, divided by the number of trainers, and take the servers' sum.
Sparse tables are updated on the servers in every mode: their gradients go with the dense ones
(sync, async, half-async) or on their own at every step (geo).
A trainer's model may live on a GPU: what goes to the servers is copied to the CPU, and what comes
back is copied into the parameters where they are.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from launcher.ps import server as srv
from launcher.ps import transport
from launcher.ps.config import ASYNC, GEO, HALF_ASYNC, SYNC, PsOptions
from launcher.ps.env import PsEnv, server_name
from launcher.ps.model import ModelSpec


class Table:
    """A distributed lookup table in place of an nn.Embedding(sparse=True): rows ``id % servers`` live
    on that server (as row ``id // servers``); forward fetches only the batch's rows."""

    def __init__(self, name: str, module: torch.nn.Embedding, servers: int, window: int):
        self.name, self.servers, self.window = name, servers, window
        self.rows, self.dim = module.num_embeddings, module.embedding_dim
        self.dtype, self.device = module.weight.dtype, module.weight.device
        self.padding_idx = module.padding_idx
        self.scale_grad_by_freq = module.scale_grad_by_freq
        self.used: list = []  # (unique ids, fetched rows) since the last step

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.rows):
            raise IndexError(f"table {self.name} has {self.rows} rows; the batch holds id {int(flat.max())} "
                             f"(or {int(flat.min())}), outside [0, {self.rows}).")
        unique, inverse = torch.unique(flat, return_inverse=True)
        unique = unique.cpu()  # the servers talk CPU tensors; the batch may be on a GPU
        rows = self.fetch(unique).to(ids.device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self.used.append((unique, rows))
        pad = None
        if self.padding_idx is not None:
            hit = (unique == self.padding_idx).nonzero()
            pad = int(hit[0]) if len(hit) else None
        return F.embedding(inverse.view(ids.shape), rows, padding_idx=pad, scale_grad_by_freq=self.scale_grad_by_freq)

    def fetch(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids`` (unique), from their servers, concurrently."""
        out = torch.empty(len(ids), self.dim, dtype=self.dtype)
        groups = self.by_server(ids)
        calls = [(server_name(s), srv.prefetch, (self.name, ids[where] // self.servers)) for s, where in groups]
        for (s, where), rows in zip(groups, transport.call_all(calls, self.window)):
            out[where] = rows
        return out

    def by_server(self, ids: torch.Tensor) -> list:
        owner = ids % self.servers
        return [(s, (owner == s).nonzero().view(-1)) for s in range(self.servers) if bool((owner == s).any())]

    def take_gradients(self) -> dict:
        """{server: (local row ids, gradient rows)} of the rows used since the last step; forgets them."""
        used, self.used = self.used, []
        ids = [u for u, rows in used if rows.grad is not None]
        grads = [rows.grad.cpu() for _, rows in used if rows.grad is not None]
        if not ids:
            return {}
        ids, grads = torch.cat(ids), torch.cat(grads)
        return {s: (ids[where] // self.servers, grads[where]) for s, where in self.by_server(ids)}


class Worker:
    """This trainer's side of the job: its parameters, its tables, and how a step talks to the servers."""

    def __init__(self, env: PsEnv, options: PsOptions, spec: ModelSpec, slices: tuple, params: list,
                 optimizer: torch.optim.Optimizer, embeddings: dict):
        self.env, self.options, self.spec, self.slices = env, options, spec, slices
        self.params, self.optimizer = params, optimizer
        self.servers = len(env.servers)
        self.tables = {}
        self.geo_tables: dict = {}  # geo: table name -> its LocalTable (the trainer holds the whole table)
        for index, module in embeddings.items():
            name = spec.params[index].name
            if options.mode == GEO:
                self.geo_tables[name] = LocalTable(module)
                continue
            table = Table(name, module, self.servers, options.rpc.prefetch_threads)
            module.forward = table.forward
            module.weight.data = torch.empty(0, table.dim, dtype=table.dtype, device=table.device)  # the servers hold the rows
            self.tables[table.name] = table
        self.steps = 0
        self.old: dict = {}  # geo: slice name -> Paddle's "old" copy (what this trainer last knew of the servers)
        self.communicator: Optional[Communicator] = None
        self.stopped = False

    # ------------------------------------------------------------------ the job's steps

    def start(self) -> None:
        """Wait for every server to be up, then take their values (init_worker)."""
        transport.call_all([(server_name(s), srv.ready, ()) for s in range(self.servers)], self.servers)
        self.take(self.pull_all())
        if self.geo_tables:
            self.take_tables()
        if self.options.mode == HALF_ASYNC:
            self.communicator = Communicator(self)

    def step(self) -> None:
        self._check_running()
        mode = self.options.mode
        if mode in (SYNC, ASYNC):
            self.take(self.exchange(self.dense_gradients(), self.sparse_gradients()))
        elif mode == HALF_ASYNC:
            self.take(self.communicator.add(self.dense_gradients(), self.sparse_gradients()))
        elif mode == GEO:
            self.optimizer.step()
            if (self.steps + 1) % self.options.update_frequency == 0:
                self.exchange_deltas()
        self.steps += 1

    def stop(self) -> None:
        """Finish what is in flight, tell every server this trainer is done (stop_worker)."""
        if self.stopped:
            return
        if self.communicator is not None:
            self.take(self.communicator.flush())
            self.take(self.communicator.finish())
        if self.options.mode == GEO and self.steps % self.options.update_frequency:
            self.exchange_deltas()
        transport.call_all([(server_name(s), srv.stop, (self.env.index,)) for s in range(self.servers)], self.servers)
        self.stopped = True

    # ------------------------------------------------------------------ talking to the servers

    def pull_all(self) -> dict:
        calls = [(server_name(s), srv.pull, (self.env.index,)) for s in range(self.servers)]
        return _merged(transport.call_all(calls, self.options.rpc.get_threads))

    def exchange(self, dense: dict, sparse: dict) -> dict:
        """Send each server its share of the gradients; the new values the servers answer with."""
        return _merged(transport.call_all(self.pushes(dense, sparse), self.options.rpc.send_threads))

    def start_exchange(self, dense: dict, sparse: dict) -> list:
        """``exchange`` without waiting: (server name, future) of each push."""
        return [(to, transport.start(to, fn, *args)) for to, fn, args in self.pushes(dense, sparse)]

    def pushes(self, dense: dict, sparse: dict) -> list:
        calls = []
        for s in range(self.servers):
            mine = {sl.name: dense.get(sl.name) for sl in self.slices if sl.server == s and sl.name in dense}
            rows = {t: grads[s] for t, grads in sparse.items() if s in grads}
            calls.append((server_name(s), srv.push, (self.env.index, mine, rows)))
        return calls

    def exchange_deltas(self) -> None:
        """geo, Paddle's GeoCommunicator: send (x - old) / trainers of each slice and of each table's rows used
        since the last exchange (old += that), then with the servers' values: x += server - old, old = server."""
        with torch.no_grad():
            deltas = {s.name: geo_delta(self.flat(s), self.old[s.name], self.env.trainers_num).cpu() for s in self.slices}
            rows = {name: t.deltas(self.env.trainers_num, self.servers) for name, t in self.geo_tables.items()}
        calls = [(server_name(k), srv.push_deltas,
                  (self.env.index, {s.name: deltas[s.name] for s in self.slices if s.server == k},
                   {name: per[k] for name, per in rows.items() if k in per}))
                 for k in range(self.servers)]
        answers = transport.call_all(calls, self.options.rpc.send_threads)
        with torch.no_grad():
            for s in self.slices:
                value = next(a[0][s.name] for a in answers if s.name in a[0])
                geo_take(self.flat(s), self.old[s.name], value)
            for name, table in self.geo_tables.items():
                table.take({k: a[1][name] for k, a in enumerate(answers) if name in a[1]}, rows[name], self.servers)

    # ------------------------------------------------------------------ local values

    def dense_gradients(self) -> dict:
        """{slice name: gradient (None: the parameter got none)} of every dense slice."""
        out = {}
        for s in self.slices:
            grad = self.params[self.spec.index_of(s.param)].grad
            out[s.name] = None if grad is None else grad.detach().reshape(-1)[s.offset:s.offset + s.size].to("cpu", copy=True)
        return out

    def sparse_gradients(self) -> dict:
        """{table: {server: (local ids, rows)}} of the rows used since the last step."""
        return {name: grads for name, table in self.tables.items() if (grads := table.take_gradients())}

    def take(self, values: dict) -> None:
        """Write the servers' values into the local parameters (and remember them for geo)."""
        with torch.no_grad():
            for s in self.slices:
                if s.name in values:
                    self.flat(s).copy_(values[s.name])
                    if self.options.mode == GEO:
                        self.old[s.name] = values[s.name].to(self.flat(s).device, copy=True)

    def take_tables(self) -> None:
        """geo: every table whole from the servers (rows id % servers), as the trainer's table and its old copy."""
        answers = transport.call_all([(server_name(k), srv.fetch_all, ()) for k in range(self.servers)],
                                     self.options.rpc.get_threads)
        for name, table in self.geo_tables.items():
            table.start([tables[name] for _, tables in answers])

    def flat(self, s) -> torch.Tensor:
        return self.params[self.spec.index_of(s.param)].data.view(-1)[s.offset:s.offset + s.size]

    def _check_running(self) -> None:
        if self.stopped:
            raise RuntimeError("this trainer already called fleet.stop_worker(); it cannot step any more.")


def geo_delta(x: torch.Tensor, old: torch.Tensor, trainers: int) -> torch.Tensor:
    """What geo sends (Paddle's GeoCommunicator::SendDense): (x - old) / trainers, added to ``old`` in place."""
    delta = (x - old) / trainers
    old.add_(delta)
    return delta


def geo_take(x: torch.Tensor, old: torch.Tensor, server: torch.Tensor) -> None:
    """The servers' values taken (GeoCommunicator::RecvDense): x += server - old, old = server, in place."""
    server = server.to(x.device)
    x.add_(server - old)
    old.copy_(server)


class LocalTable:
    """geo: an nn.Embedding(sparse=True) the trainer holds whole and steps locally, with Paddle's old copy;
    the rows its forward used since the last exchange are the rows exchanged."""

    def __init__(self, module: torch.nn.Embedding):
        self.weight = module.weight
        self.old = torch.empty(0)
        self.used: list = []
        module.register_forward_pre_hook(lambda _m, args: self.used.append(args[0].detach().reshape(-1).clone()))

    def start(self, shards: list) -> None:
        """The table from each server's rows (server k holds rows k, k + servers, ...)."""
        with torch.no_grad():
            for k, rows in enumerate(shards):
                self.weight[k::len(shards)] = rows
        self.old = self.weight.detach().clone()

    def deltas(self, trainers: int, servers: int) -> dict:
        """{server: (local row ids, (x - old) / trainers of those rows)} of the rows used; old += the deltas."""
        used, self.used = self.used, []
        if not used:
            return {}
        ids = torch.unique(torch.cat(used))
        delta = (self.weight.detach()[ids] - self.old[ids]) / trainers
        self.old[ids] += delta
        owner = ids % servers
        return {k: (ids[owner == k] // servers, delta[owner == k]) for k in range(servers) if bool((owner == k).any())}

    def take(self, answers: dict, sent: dict, servers: int) -> None:
        """x += server - old, old = server, for the rows sent (``answers``: {server: those rows' new values})."""
        for k, values in answers.items():
            ids = sent[k][0] * servers + k
            self.weight.data[ids] += values - self.old[ids]
            self.old[ids] = values


class Communicator:
    """half_async: a trainer's gradients, averaged over max_merge_var_num steps, go to the servers as one
    asynchronous update while the trainer goes on; the values that update brings back become the
    trainer's parameters when it hands over its next merged update (waiting only if that one is still
    on the way). So a parameter version serves max_merge_var_num to 2 x max_merge_var_num steps, and
    each version gets one update per trainer, as in Paddle's half-async communicator."""

    def __init__(self, worker: "Worker"):
        self.worker = worker
        self.pending: list = []  # (dense, sparse) of the steps not sent yet
        self.in_flight: list = []  # (server name, future) of the update on its way

    def add(self, dense: dict, sparse: dict) -> dict:
        """Queue one step's gradients; the values of the last update once this completes a merge, else {}."""
        self.pending.append((dense, sparse))
        return self.flush() if len(self.pending) >= self.worker.options.max_merge_var_num else {}

    def flush(self) -> dict:
        """Wait for the update on its way (bounded) and start sending what is queued; the values it brought."""
        values = self.finish()
        if self.pending:
            batch, self.pending = self.pending, []
            self.in_flight = self.worker.start_exchange(*merge(batch))
        return values

    def finish(self) -> dict:
        flying, self.in_flight = self.in_flight, []
        return _merged([transport.wait(fut, to) for to, fut in flying])


def merge(batch: list) -> tuple:
    """The average of several steps' gradients: dense slices averaged, sparse rows concatenated and scaled."""
    n = len(batch)
    given = {name: [d[name] for d, _ in batch if d[name] is not None] for name in batch[0][0]}
    dense = {name: torch.stack(grads).sum(0) / n if grads else None for name, grads in given.items()}
    sparse: dict = {}
    for _, steps in batch:
        for table, per_server in steps.items():
            for s, (ids, rows) in per_server.items():
                sparse.setdefault(table, {}).setdefault(s, []).append((ids, rows / n))
    sparse = {t: {s: (torch.cat([i for i, _ in parts]), torch.cat([r for _, r in parts])) for s, parts in ps.items()}
              for t, ps in sparse.items()}
    return dense, sparse


def _merged(answers: list) -> dict:
    out = {}
    for a in answers:
        out.update(a or {})
    return out
