"""The small models and data of the parameter-server tests, shared by the workers and the tests' one-process references."""

import torch

ROWS, DIM, FIELDS, BATCH = 1000, 8, 3, 8  # BATCH: examples per trainer and step
HIDDEN = 688  # the ctr MLP's first weight, 24 x 688 = 16512 elements, is cut in two at Paddle's min_block_size 8192


def ctr_model(rows: int = ROWS, dim: int = DIM) -> torch.nn.Module:
    """A sparse embedding (a distributed table) under a small MLP."""
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(rows, dim, sparse=True),
        "mlp": torch.nn.Sequential(torch.nn.Linear(dim * FIELDS, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)),
    })


def mlp_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def forward(model, x):
    if isinstance(model, torch.nn.ModuleDict):
        return model["mlp"](model["emb"](x).reshape(len(x), -1))
    return model(x)


TRUE_W = torch.linspace(-1, 1, 6)


def batch(kind: str, step: int, trainer: int, trainers: int):
    """Trainer ``trainer``'s share of the global batch of ``step`` (all trainers' shares make the whole)."""
    g = torch.Generator().manual_seed(1000 + step)
    n = BATCH * trainers
    if kind == "ctr":
        x = torch.randint(0, ROWS, (n, FIELDS), generator=g)
        y = (x.sum(1, keepdim=True) % 2).float()
    else:
        x = torch.randn(n, 6, generator=g)
        y = (x @ TRUE_W).unsqueeze(1)
    part = slice(trainer * BATCH, (trainer + 1) * BATCH)
    return x[part], y[part]


def make_optimizer(model, kind):
    if kind == "ctr":  # the wide MLP takes a smaller step (two groups: the servers keep each slice's own)
        return torch.optim.SGD([{"params": model["emb"].parameters()}, {"params": model["mlp"].parameters(), "lr": 0.005}],
                               lr=0.2)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(forward(model, x), y)


def train_single(kind: str, steps: int, trainers: int, model=None, first_step: int = 0) -> torch.nn.Module:
    """One process on the whole batch of every step: what synchronous training must equal."""
    model = model or (ctr_model() if kind == "ctr" else mlp_model())
    opt = make_optimizer(model, kind)
    for step in range(first_step, steps):
        parts = [batch(kind, step, t, trainers) for t in range(trainers)]
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
    return model


def evaluate(model, kind: str, trainers: int = 2) -> float:
    with torch.no_grad():
        parts = [batch(kind, 10_000, t, trainers) for t in range(trainers)]
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return float(loss_of(model, x, y))
