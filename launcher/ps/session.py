"""One process's part in a parameter-server job, from joining to leaving: what fleet's PS calls and
the transpiler's programs do.

    session = PsSession.join(env)                       # fleet.init: the RPC world
    opt = session.distribute(optimizer, options)        # fleet.distributed_optimizer
    session.init_server(model_dir); session.run_server()            # a server
    session.init_worker(); ...opt.step()...; session.stop_worker()  # a trainer
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from launcher.ps import server as srv
from launcher.ps import transport
from launcher.ps.config import PsOptions
from launcher.ps.env import PsEnv, server_name
from launcher.ps.model import ModelSpec, describe, optimizer_params
from launcher.ps.optimizer import PsOptimizer
from launcher.ps.placement import format_table, place
from launcher.ps.trainer import Worker

MODEL_FILE = "model.pt"


class PsSession:
    def __init__(self, env: PsEnv, link: transport.Link):
        self.env, self.link = env, link
        self.options: Optional[PsOptions] = None
        self.spec: Optional[ModelSpec] = None
        self.slices: tuple = ()
        self.params: list = []
        self.server: Optional[srv.Server] = None
        self.worker: Optional[Worker] = None
        self.saves: dict = {}  # path -> how many times this trainer saved it

    @classmethod
    def join(cls, env: PsEnv, flags) -> "PsSession":
        return cls(env, transport.connect(env, flags))

    # ------------------------------------------------------------------ both roles

    def distribute(self, optimizer: torch.optim.Optimizer, options: PsOptions,
                   model: Optional[torch.nn.Module] = None) -> PsOptimizer:
        """Place the optimizer's parameters on the servers; on a trainer, its tables move there."""
        if self.spec is not None:
            raise RuntimeError("fleet.distributed_optimizer was already called in this parameter-server job; call it once.")
        self.options = options
        self.spec, embeddings = describe(optimizer, model)
        self.params = optimizer_params(optimizer)
        self.slices = place([(p.name, p.shape) for p in self.spec.dense], len(self.env.servers), options.slice_var_up,
                            options.split_method, options.min_block_size, options.random_seed)
        if options.print_log:
            tables = [(p.name, p.shape[0]) for p in self.spec.sparse]
            print(f"{self.env.name}: parameter placement ({options.mode})\n"
                  + format_table(self.slices, self.env.servers, tables), flush=True)
        if not self.env.is_server:
            self.worker = Worker(self.env, options, self.spec, self.slices, self.params, optimizer, embeddings)
        return PsOptimizer(optimizer, self)

    # ------------------------------------------------------------------ a server

    def init_server(self, model_dir: Optional[str] = None) -> None:
        """Take this server's slices and rows from the model (or from ``model_dir/model.pt``)."""
        self._require(self.env.is_server, "init_server", "a server")
        self._require_spec("init_server")
        if model_dir is not None:
            self._load(model_dir)
        self.server = srv.Server(self.env, self.options, self.spec, self.slices, self.params)
        for info in self.spec.sparse:
            self.params[info.index].data = torch.empty(0, *info.shape[1:])  # only this server's rows are kept
        srv.serve(self.server)

    def run_server(self) -> None:
        """Serve until every trainer called stop_worker; a PsError when one is gone or failed."""
        self._require(self.env.is_server, "run_server", "a server")
        if self.server is None:
            self.init_server()
        srv.wait_finished(self.server)
        transport.disconnect()

    # ------------------------------------------------------------------ a trainer

    def init_worker(self) -> None:
        self.worker_or_fail("init_worker").start()

    def stop_worker(self) -> None:
        self.worker_or_fail("stop_worker").stop()
        transport.disconnect()

    def save(self, dirname: str, model: torch.nn.Module, filename: str = MODEL_FILE) -> str:
        """Trainer 0 gathers every slice and row from the servers and writes the whole model's state_dict;
        another trainer returns once it is written. The file's path."""
        worker = self.worker_or_fail("save_persistables")
        path = os.path.abspath(os.path.join(os.fspath(dirname), filename))
        count = self.saves[path] = self.saves.get(path, 0) + 1
        key = f"{path}#{count}"
        if self.env.index != 0:
            transport.call(server_name(0), srv.wait_saved, key)
            return path
        from launcher.fleet.checkpoint import save_atomically

        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_atomically(self.whole_state_dict(model, worker), path)
        transport.call(server_name(0), srv.mark_saved, key)
        return path

    def whole_state_dict(self, model: torch.nn.Module, worker: Worker) -> dict:
        """``model``'s state_dict with every parameter as the servers hold it."""
        answers = transport.call_all([(server_name(s), srv.fetch_all, ()) for s in range(len(self.env.servers))],
                                     self.options.rpc.get_threads)
        whole = {}
        for info in self.spec.dense:
            flat = torch.empty(info.shape).reshape(-1)
            for s in (s for s in self.slices if s.param == info.name):
                flat[s.offset:s.offset + s.size] = answers[s.server][0][s.name]
            whole[info.index] = flat.view(info.shape)
        for info in self.spec.sparse:
            rows = torch.empty(info.shape)
            for s, (_, tables) in enumerate(answers):
                rows[s::len(answers)] = tables[info.name]
            whole[info.index] = rows
        index = {id(p): i for i, p in enumerate(self.params)}
        state = model.state_dict()
        for name, p in model.named_parameters():
            if id(p) in index:
                state[name] = whole[index[id(p)]].to(p.dtype)
        return state

    def worker_or_fail(self, call: str) -> Worker:
        self._require(not self.env.is_server, call, "a trainer")
        self._require_spec(call)
        return self.worker

    # ------------------------------------------------------------------ helpers

    def _load(self, model_dir: str) -> None:
        path = os.path.join(os.fspath(model_dir), MODEL_FILE)
        if not self.spec.named:
            raise ValueError(f"init_server({model_dir!r}) cannot match {path} to the parameters: their model was not "
                             "found; pass model= to fleet.distributed_optimizer.")
        state = torch.load(path, map_location="cpu", weights_only=True)
        missing = [p.name for p in self.spec.params if p.name not in state]
        if missing:
            raise ValueError(f"{path} has no {missing[0]!r}; save it with fleet.save_persistables from this model.")
        with torch.no_grad():
            for info in self.spec.params:
                self.params[info.index].copy_(state[info.name])

    def _require(self, ok: bool, call: str, role: str) -> None:
        if not ok:
            raise RuntimeError(f"fleet.{call}() runs on {role}; this process is {self.env.describe(self.env.name)}: "
                               "branch on fleet.is_server() / fleet.is_worker().")

    def _require_spec(self, call: str) -> None:
        if self.spec is None:
            raise RuntimeError(f"fleet.{call}() needs the parameters: call fleet.distributed_optimizer(optimizer, strategy) first.")


