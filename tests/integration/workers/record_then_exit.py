"""Attempt 0 raises inside torch's @record; attempt 1 (TORCHELASTIC_RESTART_COUNT=1) exits 3 without a record."""

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise ValueError("attempt 0 raised this")
    sys.exit(3)


if __name__ == "__main__":
    main()
