"""Saving: the first worker writes, atomically; no rank waits on a collective, so rank 0 may save alone.

    fleet.save_persistables(dirname, model, optimizer)      # dirname/persistables.pt: model and optimizer together
    fleet.load_persistables(dirname, model, optimizer)      # on any rank
    fleet.save_inference_model(dirname, model, (x,))        # dirname/model.pt2: torch.export, for inference

Paddle's shape, an executor first (``fleet.save_persistables(exe, dirname)``), is accepted too.
When every rank calls a save, the other ranks return once rank 0 has written the file: rank 0 marks
each save in the job's store, and they wait for that mark (never for a collective).
"""

from __future__ import annotations

import os

import torch

from launcher.fleet import state as st
from launcher.runtime.parallel import current_job

PERSISTABLES_FILE = "persistables.pt"
INFERENCE_FILE = "model.pt2"
_SAVED = "launcher/saved/"


def save_persistables(where, *args, **kwargs) -> None:
    """``save_persistables(dirname, model, optimizer=None, filename=None)``; also Paddle's
    ``save_persistables(executor, dirname, main_program=None, filename=None)``.

    Rank 0 writes the model's and the optimizer's state_dict to one file, ``dirname/persistables.pt``
    (or ``filename``), so a crash can never leave a model with another save's optimizer.
    """
    dirname, model, optimizer, filename = _persistables_arguments("save_persistables", where, args, kwargs)
    state = {"model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict() if optimizer is not None else None}
    _on_first_worker(os.path.join(dirname, filename), lambda path: save_atomically(state, path))


def load_persistables(where, *args, **kwargs) -> None:
    """Load what save_persistables wrote into ``model`` (and ``optimizer``), on any rank; same call shapes."""
    dirname, model, optimizer, filename = _persistables_arguments("load_persistables", where, args, kwargs)
    path = os.path.join(dirname, filename)
    state = torch.load(path, map_location=st.current().penv.device, weights_only=True)
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is None:
        return
    if state["optimizer"] is None:
        raise ValueError(f"{path} holds no optimizer state (it was saved without one); call load_persistables without the optimizer.")
    optimizer.load_state_dict(state["optimizer"])


def save_inference_model(where, model=None, example_inputs=None, filename: str = INFERENCE_FILE) -> None:
    """Rank 0 exports ``model`` with torch.export for inference: ``torch.export.load(path).module()(*example_inputs)``."""
    if not _is_path(where):
        raise TypeError("fleet.save_inference_model(executor, dirname, feeded_var_names, target_vars) is Paddle's form; "
                        "PyTorch exports a model by running it once, so write fleet.save_inference_model(dirname, model, (example_input,)).")
    if model is None or example_inputs is None:
        raise TypeError("fleet.save_inference_model needs the model and an example input: "
                        "fleet.save_inference_model(dirname, model, (example_input,)).")
    module = _unwrap(model)
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)

    def export(path):
        was_training = module.training
        module.eval()
        try:
            program = torch.export.export(module, inputs)
        finally:
            module.train(was_training)
        save_atomically(program, path, save=torch.export.save)

    _on_first_worker(os.path.join(os.fspath(where), filename), export)


def _persistables_arguments(name: str, where, args: tuple, kwargs: dict) -> tuple:
    """(dirname, model, optimizer, filename) from either call shape."""
    if _is_path(where):
        return _torch_shape(name, where, *args, **kwargs)
    return _paddle_shape(name, *args, **kwargs)


def _torch_shape(name: str, dirname, model=None, optimizer=None, filename=None) -> tuple:
    if model is None:
        raise TypeError(f"fleet.{name} was given no model: write fleet.{name}({os.fspath(dirname)!r}, model, optimizer).")
    return os.fspath(dirname), model, optimizer, filename or PERSISTABLES_FILE


def _paddle_shape(name: str, dirname=None, main_program=None, filename=None) -> tuple:
    """The executor is dropped; the model is ``main_program`` when it is one, else fleet.distributed_model's."""
    state = st.current()
    model = main_program if isinstance(main_program, torch.nn.Module) else state.model
    if not _is_path(dirname) or model is None or main_program not in (None, model):
        raise TypeError(f"fleet.{name}(executor, dirname) cannot tell which model to use here (there is no static "
                        f"program): write fleet.{name}(dirname, model, optimizer).")
    return os.fspath(dirname), model, state.optimizer, filename or PERSISTABLES_FILE


def _on_first_worker(path: str, write) -> None:
    """Rank 0 runs ``write(path)`` and marks it done in the store; another rank waits for that mark (bounded)."""
    state, job = st.current(), current_job()
    path = os.path.abspath(path)
    count = state.saves[path] = state.saves.get(path, 0) + 1
    key = f"{_SAVED}{path}/{count}"
    if state.penv.rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write(path)
        if job is not None:
            job.store.set(key, "1")
        return
    try:
        job.store.wait([key], job.timeout)
    except Exception as e:  # torch raises several types; say what we waited for
        raise RuntimeError(f"rank {state.penv.rank} waited {job.timeout.total_seconds():g} s for rank 0 to write {path}; "
                           "call this save on rank 0 as well (or on rank 0 only).") from e


def save_atomically(obj, path: str, save=torch.save) -> None:
    """Readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
