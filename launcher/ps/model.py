"""What the servers and trainers share about the model: its parameters, in the optimizer's order,
with names, shapes, the optimizer settings of each, and which are sparse tables.
"""

from __future__ import annotations

import gc
import inspect
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of the optimizer."""

    index: int  # its place among the optimizer's parameters
    name: str  # as model.named_parameters() names it ("param3" when the model is unknown)
    shape: tuple
    group: int  # its parameter group
    sparse: bool  # the weight of an nn.Embedding(sparse=True): a distributed lookup table


@dataclass(frozen=True)
class ModelSpec:
    """The optimizer's parameters described, and what makes a fresh optimizer of the same kind."""

    params: tuple  # ParamInfo, in optimizer order
    optimizer_class: type
    group_settings: tuple  # one dict of hyperparameters per parameter group
    named: bool  # the names are the model's (not made up)

    @property
    def dense(self) -> tuple:
        return tuple(p for p in self.params if not p.sparse)

    @property
    def sparse(self) -> tuple:
        return tuple(p for p in self.params if p.sparse)

    def index_of(self, name: str) -> int:
        return next(i.index for i in self.params if i.name == name)

    def make_optimizer(self, info: ParamInfo, tensor: torch.Tensor) -> torch.optim.Optimizer:
        """The user's optimizer class with ``info``'s group settings, over ``tensor`` alone."""
        return self.optimizer_class([tensor], **self.group_settings[info.group])


def optimizer_params(optimizer: torch.optim.Optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def describe(optimizer: torch.optim.Optimizer, model: Optional[torch.nn.Module] = None) -> tuple:
    """(ModelSpec, {parameter index: the nn.Embedding it is the weight of}) for ``optimizer``.

    ``model`` gives the names; without it, the model is found among the live modules that own the
    optimizer's parameters (Paddle's flow passes only the optimizer to fleet.distributed_optimizer).
    """
    params = optimizer_params(optimizer)
    if len({id(p) for p in params}) != len(params):
        raise ValueError("a parameter appears twice in the optimizer; give each parameter to one group only.")
    model = model if model is not None else _owning_model(params)
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    embeddings = _sparse_embeddings(model, params)
    group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
    named = all(id(p) in names for p in params)
    infos = tuple(ParamInfo(i, names[id(p)] if named else f"param{i}", tuple(p.shape), group_of[id(p)], i in embeddings)
                  for i, p in enumerate(params))
    settings = tuple(_settings(type(optimizer), group) for group in optimizer.param_groups)
    return ModelSpec(infos, type(optimizer), settings, named), embeddings


def _settings(cls: type, group: dict) -> dict:
    """A group's hyperparameters that ``cls`` takes as arguments (not params, not a scheduler's initial_lr)."""
    accepted = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in group.items() if k != "params" and k in accepted}


def _sparse_embeddings(model: Optional[torch.nn.Module], params: list) -> dict:
    index = {id(p): i for i, p in enumerate(params)}
    modules = model.modules() if model is not None else _live_modules()
    found = {}
    for m in modules:
        if isinstance(m, torch.nn.Embedding) and m.sparse and id(m.weight) in index:
            if m.max_norm is not None:
                raise ValueError("nn.Embedding(sparse=True, max_norm=...) cannot be a distributed table "
                                 "(max_norm rewrites rows in place on the trainer); drop max_norm.")
            found[index[id(m.weight)]] = m
    return found


def _owning_model(params: list) -> Optional[torch.nn.Module]:
    """The smallest live module whose parameters include all of ``params`` (the model), or None."""
    wanted = {id(p) for p in params}
    best = None
    for m in _live_modules():
        mine = {id(p) for p in m.parameters()}
        if wanted <= mine and (best is None or len(mine) < best[0]):
            best = (len(mine), m)
    return best[1] if best else None


def _live_modules() -> list:
    # type(), not isinstance: isinstance reads __class__, which some lazy module objects answer with a warning
    return [o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)]
