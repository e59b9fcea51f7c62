"""Names of the variables the launcher gives each worker.

The plan writes them and the runtime reads them, both from here.
"""

SELECTED_GPUS = "FLAGS_selected_gpus"
TRAINER_ID = "PADDLE_TRAINER_ID"
CURRENT_ENDPOINT = "PADDLE_CURRENT_ENDPOINT"
TRAINERS_NUM = "PADDLE_TRAINERS_NUM"
TRAINER_ENDPOINTS = "PADDLE_TRAINER_ENDPOINTS"
TRAINER_ENDPOINTS_FILE = "PADDLE_TRAINER_ENDPOINTS_FILE"

RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

OMP_NUM_THREADS = "OMP_NUM_THREADS"
MKL_NUM_THREADS = "MKL_NUM_THREADS"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_IB_HCA = "NCCL_IB_HCA"  # the InfiniBand devices NCCL uses (read by the infiniband health check)
# Where torch's NCCL flight recorder writes its dumps; torch appends the rank.
FR_DUMP_TEMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
FR_DUMP_TEMP_FILE_OLD = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"  # its name before torch 2.6
# The FIFO stem a worker's NCCL group watches (<stem><rank>.pipe): a byte written there makes it dump.
FR_PIPE_FILE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"  # entries the recorder keeps; 0 (torch's default) is off
FR_BUFFER_SIZE_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"

# Marks every process of one launch, so that a process a worker started is found
# and stopped even when it left the worker's process group.
RUN_ID = "LAUNCHER_RUN_ID"

# One job across nodes and restarts
RESTART_COUNT = "PADDLE_RESTART_COUNT"
ELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
JOB_ID = "LAUNCHER_JOB_ID"
ELASTIC_ROUND = "LAUNCHER_ELASTIC_ROUND"  # an elastic job's round, in a line: the same on every node, new each round
JOB_TOKEN = "LAUNCHER_JOB_TOKEN"

# What torchrun's agent gives each worker besides the torch names above
# (torch/distributed/elastic/agent/server/local_elastic_agent.py)
ROLE_RANK = "ROLE_RANK"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
ROLE_NAME = "ROLE_NAME"
ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
ELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
ELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
# Where torch's @record (torch.distributed.elastic.multiprocessing.errors) writes a worker's
# exception as JSON; given to the launcher itself, where it writes the job's root cause.
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
PYTHON_EXEC = "PYTHON_EXEC"  # torchrun's interpreter override for Python workers
DEFAULT_ROLE = "default"  # torchrun's --role default

# Parameter-server mode (Paddle 1.8's launch_ps)
TRAINING_ROLE = "TRAINING_ROLE"  # "PSERVER" or "TRAINER"
PSERVERS_IP_PORT_LIST = "PADDLE_PSERVERS_IP_PORT_LIST"  # every server's ip:port, in server-id order
PSERVER_ID = "PADDLE_PSERVER_ID"
PORT = "PADDLE_PORT"  # a server's own port
POD_IP = "POD_IP"  # a server's own address
TP_SOCKET_IFNAME = "TP_SOCKET_IFNAME"  # the interface TensorPipe (torch.distributed.rpc) uses

# Paddle 2.6/3.x's launcher (paddle.distributed.launch): what it gives a collective worker on top of 1.8's
DISTRI_BACKEND = "PADDLE_DISTRI_BACKEND"  # "gloo" for CPU workers: a CPU build of Paddle creates no group without it
PADDLE_MASTER = "PADDLE_MASTER"  # ip:port of rank 0's store
GLOBAL_SIZE = "PADDLE_GLOBAL_SIZE"
LOCAL_SIZE = "PADDLE_LOCAL_SIZE"
GLOBAL_RANK = "PADDLE_GLOBAL_RANK"
PADDLE_LOCAL_RANK = "PADDLE_LOCAL_RANK"
RANK_IN_NODE = "PADDLE_RANK_IN_NODE"  # fleet.local_rank()
NNODES = "PADDLE_NNODES"
LOG_DIR = "PADDLE_LOG_DIR"
LOCAL_DEVICE_IDS = "PADDLE_LOCAL_DEVICE_IDS"  # GPU workers (fleet's launch): this node's GPUs
WORLD_DEVICE_IDS = "PADDLE_WORLD_DEVICE_IDS"  # every node's GPUs, ':'-joined per node, ','-joined
SELECTED_ACCELERATORS = "FLAGS_selected_accelerators"
# Paddle's mechanism for a variable too long for the environment: a JSON file of the variables,
# read by paddle.distributed.backup_env.getenv_or_backup (role maker, ParallelEnv)
BACKUP_ENV_PATH = "PADDLE_BACKUP_ENV_PATH"
# Parameter-server mode: the role under its newer name, and fleet's gloo rendezvous (fleet.util.all_reduce)
PADDLE_ROLE = "PADDLE_ROLE"
WITH_GLOO = "PADDLE_WITH_GLOO"  # 1: among trainers, 2: among all
GLOO_RENDEZVOUS = "PADDLE_GLOO_RENDEZVOUS"  # 3: HTTP
GLOO_HTTP_ENDPOINT = "PADDLE_GLOO_HTTP_ENDPOINT"  # ip:port of the KV store server 0 serves
GLOO_FS_PATH = "PADDLE_GLOO_FS_PATH"

# The local channel between a launcher and its own workers (launcher.local_channel): where it listens (an
# abstract Unix socket's name, "@..."), and the key each side proves on the other's nonce
CONTROL_SOCKET = "LAUNCHER_CONTROL_SOCKET"
CONTROL_KEY = "LAUNCHER_CONTROL_KEY"
PROGRESS_FD = "LAUNCHER_PROGRESS_FD"  # the worker's progress page (launcher.progress_page), an inherited descriptor
# Fields of fleet's DistributedStrategy set over the program's own (a config file's strategy:, a tuning trial's
# strategy.NAME), as a JSON object (launcher.plan.strategy_fields); fleet applies them and says so once
STRATEGY = "LAUNCHER_STRATEGY"
WARM_FD = "LAUNCHER_WARM_FD"  # --warm_start: a warm worker's end of the socket its first round comes on (launcher.run.warm)
