"""A clean run that uses a multiprocessing "spawn" context, as a DataLoader with workers does: Python
starts its resource_tracker, which outlives the worker by a moment and ends by itself."""

import multiprocessing as mp


def square(x):
    return x * x


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        print("sum", sum(pool.map(square, range(10))))
    lock = ctx.Lock()  # a semaphore: the resource_tracker keeps it on its list
