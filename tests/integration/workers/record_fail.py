"""Rank 1 raises inside torch's @record; rank 0 then fails in its barrier ("Connection closed by peer")."""

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank 1 raised this on purpose")
    dist.barrier()


if __name__ == "__main__":
    main()
