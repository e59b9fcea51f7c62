"""A parameter-server job's script, run by every server and trainer alike.

    ps_train.py OUT API MODE KIND STEPS [key=value ...]
API: fleet or transpiler; MODE: sync, async, half_async, geo, dc_asgd; KIND: ctr or mlp.
Trainers write OUT/progress.J (steps done, resident bytes before the model was built (fleet), now) and OUT/done.J
(the saved model's loss); trainer 0 saves OUT/model/model.pt. In the asynchronous modes a trainer saves only once
every trainer has made its steps.
Options: min_block_size=N, split=HashName, sleep=S (seconds per step), model_dir=D, update_frequency=K,
first_step=N (train steps N..STEPS-1), rows=N and dim=N (the ctr table), merge=N (half-async's max_merge_var_num),
fail=trainer:J:STEP:CODE (trainer J exits with CODE at STEP) or fail=server:I:SECONDS:CODE (server I exits with
CODE after SECONDS of serving).
"""

import os
import sys
import time

import psutil
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ps_models import batch, ctr_model, evaluate, loss_of, make_optimizer, mlp_model  # noqa: E402

out, api, mode, kind, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
opts = dict(a.split("=", 1) for a in sys.argv[6:])
role = os.environ["TRAINING_ROLE"]
rss_before = None  # resident bytes once joined, before the model is built (fleet)
model = optimizer = None


def build():
    global model, optimizer
    model = ctr_model(int(opts.get("rows", 1000)), int(opts.get("dim", 8))) if kind == "ctr" else mlp_model()
    optimizer = make_optimizer(model, kind)


def configure(config):
    config.min_block_size = int(opts.get("min_block_size", 8192))
    config.split_method = opts.get("split", "RoundRobin")
    config.print_log = True
    config.enable_dc_asgd = mode == "dc_asgd"
    config.max_merge_var_num = int(opts.get("merge", 20))


def failure(role_name, index):
    """(when, code) of this process's planned failure, or None."""
    if "fail" not in opts:
        return None
    who, i, when, code = opts["fail"].split(":")
    return (float(when), int(code)) if (who, int(i)) == (role_name, index) else None


def fail_later(index):
    plan = failure("server", index)
    if plan:
        import threading

        threading.Timer(plan[0], lambda: fail_now(plan[1])).start()


def fail_now(code):
    """Exit with ``code`` at once, leaving OUT/failed_at (when) for the tests that time the teardown."""
    with open(os.path.join(out, "failed_at"), "w") as f:
        f.write(repr(time.time()))
    os._exit(code)


def train(optimizer, trainer, trainers):
    plan = failure("trainer", trainer)
    for step in range(int(opts.get("first_step", 0)), steps):
        if plan and step == plan[0]:
            print(f"trainer {trainer} fails with {plan[1]} at step {step}", flush=True)
            fail_now(plan[1])
        x, y = batch(kind, step, trainer, trainers)
        optimizer.minimize(loss_of(model, x, y))
        with open(os.path.join(out, f"progress.{trainer}"), "w") as f:
            f.write(f"{step + 1} {rss_before} {psutil.Process().memory_info().rss}")
        time.sleep(float(opts.get("sleep", 0)))
    if mode != "sync":
        await_every_trainer(trainers)


def await_every_trainer(trainers, bound=120.0):
    """An asynchronous mode's model is judged (saved, its loss in OUT/done.J) once every trainer has made its
    steps: on a busy machine one trainer could end before another began, and the loss would then measure how
    the two interleaved, not the mode (the bound: a hang guard; the test then fails on the loss)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and not all(steps_done(j) >= steps for j in range(trainers)):
        time.sleep(0.05)


def steps_done(trainer):
    try:
        with open(os.path.join(out, f"progress.{trainer}")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # not written yet, or being written
        return 0


def with_fleet():
    from launcher import fleet

    global rss_before
    fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=False))
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch's lazy imports (~70 MB), not the model's
    rss_before = psutil.Process().memory_info().rss
    build()
    factory = fleet.StrategyFactory
    strategy = {"sync": factory.create_sync_strategy, "async": factory.create_async_strategy,
                "dc_asgd": factory.create_async_strategy, "half_async": factory.create_half_async_strategy,
                "geo": lambda: factory.create_geo_strategy(int(opts.get("update_frequency", 4)))}[mode]()
    configure(strategy.get_program_config())
    opt = fleet.distributed_optimizer(optimizer, strategy)
    if fleet.is_server():
        fleet.init_server(opts.get("model_dir"))
        fail_later(fleet.server_index())
        fleet.run_server()
        return
    fleet.init_worker()
    train(opt, fleet.worker_index(), fleet.worker_num())
    fleet.save_persistables(os.path.join(out, "model"), model)
    finish(fleet.worker_index())
    fleet.stop_worker()


def with_transpiler():
    from launcher.transpiler import DistributeTranspiler, DistributeTranspilerConfig

    build()
    config = DistributeTranspilerConfig()
    configure(config)
    config.geo_sgd_mode = mode == "geo"
    config.half_async = mode == "half_async"
    trainers = int(os.environ["PADDLE_TRAINERS_NUM"])
    trainer_id = int(os.environ.get("PADDLE_TRAINER_ID", 0))
    t = DistributeTranspiler(config)
    t.transpile(trainer_id, program=model, pservers=os.environ["PADDLE_PSERVERS_IP_PORT_LIST"], trainers=trainers,
                sync_mode=mode == "sync", optimizer=optimizer)
    if role == "PSERVER":
        t.get_pserver_program(os.environ["PADDLE_CURRENT_ENDPOINT"]).run(opts.get("model_dir"))
        return
    program = t.get_trainer_program()
    train(program.optimizer, trainer_id, trainers)
    program.save_persistables(os.path.join(out, "model"))
    finish(trainer_id)
    program.stop()


def finish(trainer):
    with open(os.path.join(out, f"done.{trainer}"), "w") as f:
        f.write(str(evaluate_saved()))


def evaluate_saved():
    fresh = ctr_model(int(opts.get("rows", 1000)), int(opts.get("dim", 8))) if kind == "ctr" else mlp_model()
    fresh.load_state_dict(torch.load(os.path.join(out, "model", "model.pt")))
    return evaluate(fresh, kind)


(with_fleet if api == "fleet" else with_transpiler)()
print(f"{role} done", flush=True)
