"""A worker that behaves as torch's NCCL flight recorder does, without a GPU: it makes the FIFO
TORCH_NCCL_DEBUG_INFO_PIPE_FILE + RANK + ".pipe" (when TORCH_FR_BUFFER_SIZE > 0), watches it once a
second, and on a byte writes TORCH_FR_DUMP_TEMP_FILE + RANK. Then it hangs without a word."""

import os
import threading
import time

rank = os.environ["RANK"]
stem, dump = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"), os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
print(f"buffer={os.environ.get('TORCH_FR_BUFFER_SIZE')} pipe={stem}", flush=True)


def watch(pipe: str) -> None:
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        time.sleep(1.0)  # torch's monitor checks the pipe once a second
        try:
            if os.read(fd, 128):
                with open(dump + rank, "w") as f:
                    f.write("fake flight recorder dump of rank " + rank + "\n")
                return
        except BlockingIOError:
            continue


if stem and int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0")) > 0:
    pipe = f"{stem}{rank}.pipe"
    if os.path.exists(pipe):
        os.unlink(pipe)
    os.mkfifo(pipe)
    threading.Thread(target=watch, args=(pipe,), daemon=True).start()
time.sleep(120)
