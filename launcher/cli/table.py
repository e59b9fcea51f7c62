"""The launch command's one table of options: each option one row, with every spelling it has (ours and Paddle
1.8's, torchrun's, Paddle 2.6/3.x's and fleetrun's), its type, default and help, its ``--help`` section, whether
torchrun reads it from ``PET_<NAME>``, and its status: ours, an alias of another, honoured (another launcher's
meaning, mapped onto ours), accepted with no effect (saying why), or refused (with its reason).

The click options (``launcher.cli.options``), the ``PET_*`` variables (``launcher.cli.pet``), the config file's keys
and the option tables of docs/options.md, docs/torchrun.md and docs/paddle.md (checked by tests/test_option_table.py)
all come from here. Cheap to import: ``--help`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import click

from launcher.cli.types import (CheckNames, CountList, CpuList, EnvSetting, LogLevel, NodeCount, Seconds, Whole,
                                WorkerCount)
from launcher.plan import elastic_backends as backends
from launcher.plan.agent_store import CHOICES as AGENT_STORE_CHOICES
from launcher.plan.clusters.registry import names as cluster_source_names
from launcher.plan.health import ALL, CHECKS, INTERVAL, USER_TIMEOUT
from launcher.plan.model import NUMA_MODES, STRAGGLER_POLICIES

# statuses
OURS = "ours"  # this launcher's own option (Paddle 1.8's are ours)
ALIAS = "alias"  # another name for an option (maps_to), in any dialect: the same value
HONOURED = "honoured"  # another launcher's option, doing here what it does there
NO_EFFECT = "no effect"  # accepted; what it asks makes no difference here (reason)
REFUSED = "refused"  # accepted only to be refused, saying why (reason), unless its value asks for nothing (harmless)

# dialects
PADDLE18, TORCHRUN, PADDLE3, FLEETRUN = "Paddle 1.8", "torchrun", "Paddle 2.6/3.x", "fleetrun"

# --help's sections, in order
JOB, PLACEMENT, NODES, SSH, ELASTIC, HEALTH, LOGS, WATCH, PS, TORCHRUN_GROUP, PADDLE_GROUP = (
    "The job", "Workers on CPUs", "The nodes", "The whole cluster over ssh", "Elastic jobs", "Health checks",
    "Logs and output", "Watching the job", "Parameter servers", "torchrun's spellings", "Paddle 2.x/3.x spellings")
GROUPS = (JOB, PLACEMENT, NODES, SSH, ELASTIC, HEALTH, LOGS, WATCH, PS, TORCHRUN_GROUP, PADDLE_GROUP)

# what the code asks of a row by its tag (Row.tags), never by a list of names of its own
NAMES_NODES = "names the nodes"  # torchrun's and Paddle's ways of naming the nodes, which may not be mixed
LISTS_NODES = "lists the nodes"  # given, the nodes are listed: they do not take their ranks in order of arrival
KUBEFLOW_NODES = "Kubeflow's"  # its PET_* variable in a job of fixed size is the Kubeflow cluster source's
PARAMETER_SERVERS = "parameter servers"  # given, it asks for a parameter-server job
FLEET_GLOO = "fleet's gloo"  # fleet's gloo rendezvous of a parameter-server job
OVER_SSH = "over ssh"  # the command that starts every host over ssh (--hostfile): not passed on to the hosts
PER_HOST = "per host"  # --hostfile's command sets it for each host: not passed on as the user gave it
NOT_OVER_SSH = "not over ssh"  # refused beside --hostfile, which places every node and (--include) its GPUs
TUNER_OWN = "the tuner's own"  # launcher tune gives it to each trial: not a knob, not in a trial's config

STATIC_PORT = 29500  # torchrun's --master-port default on several nodes
PORT = Whole(1, 65535, "a port")
START_METHODS = ("spawn", "fork", "forkserver")
TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")  # a true or false value of a Paddle option, as Paddle reads it
FALSE_WORDS = ("0", "false", "f", "no", "n", "off", "")
_XPU = "Kunlun XPUs are not supported: this launcher drives CPU and NVIDIA GPU workers"
_TUNER = "Paddle's auto-parallel tuner is not supported"
_MAPPING = "fleetrun's rank auto-mapping is not supported"
_FEDERATED = "federated parameter servers (coordinators) are not supported"
_HETER = "heterogeneous parameter servers are not supported"
_SCALE = ("fleetrun's commands to scale an elastic job (--scale, --force) and its hook before a re-launch are not "
          "supported: nodes join and leave an elastic job here by starting and stopping their launchers (docs/elastic.md)")


@dataclass(frozen=True)
class Row:
    """One option. ``name`` is its parameter: click's, the config file's key and the request's field."""

    name: str
    group: str
    help: str
    dialects: tuple = (PADDLE18,)
    status: str = OURS
    click: dict = field(default_factory=dict)  # type, default, metavar, is_flag, show_default, envvar, hidden
    aliases: tuple = ()  # other names, each spelled with underscores and with dashes
    short: tuple = ()  # -m, -r, -t
    maps_to: Optional[str] = None  # ALIAS: the option it is the same as
    reason: Optional[str] = None  # REFUSED: why; NO_EFFECT: why it makes no difference
    harmless: tuple = ()  # REFUSED: values that ask for nothing, accepted
    pet: bool = False  # torchrun reads it from PET_<NAME> too
    listed: bool = False  # a YAML list in the config file is joined with commas
    tags: tuple = ()  # the sets of options the code asks for (NAMES_NODES, KUBEFLOW_NODES, ...)

    @property
    def torchruns(self) -> bool:
        """torchrun's own option, not one of ours nor shared with Paddle: turned into ours (launcher.cli.torchrun)."""
        return self.dialects == (TORCHRUN,) and self.status != OURS

    @property
    def spellings(self) -> tuple:
        """``--name``, ``--name-dashed``, and the same for each alias."""
        out = []
        for n in (self.name, *self.aliases):
            dashed = n.replace("_", "-")
            out += [f"--{n}"] + ([f"--{dashed}"] if dashed != n else [])
        return tuple(out)

    @property
    def shown(self) -> tuple:
        """The spellings --help shows: one for each name, with dashes if only torchrun spells it, else underscores."""
        return tuple("--" + (n.replace("_", "-") if self.torchruns else n) for n in (self.name, *self.aliases))

    @property
    def default(self):
        return self.click.get("default", False if self.click.get("is_flag") else None)


def _ours(name, group, help, **kw) -> Row:
    return Row(name, group, help, **kw)


def _torchrun(name, group, help, status=HONOURED, **kw) -> Row:
    return Row(name, group, f"torchrun: {help}", (TORCHRUN,), status, pet=kw.pop("pet", True), **kw)


def _paddle(name, help, dialects=(PADDLE3,), status=HONOURED, **kw) -> Row:
    return Row(name, PADDLE_GROUP, f"{' and '.join(dialects)}: {help}", dialects, status,
               click={"default": None, **kw.pop("click", {})}, **kw)


def _refused_paddle(name, reason, harmless=(), dialects=(PADDLE3, FLEETRUN)) -> Row:
    return Row(name, PADDLE_GROUP, f"refused: {reason}.", dialects, REFUSED, click={"default": None, "hidden": True},
               reason=reason, harmless=harmless)


ROWS = (
    # ---------------------------------------------------------------- the job
    _ours("nproc_per_node", JOB, "Workers on this node: CPU workers when there is no GPU (default 2), or how many of "
          "the visible GPUs to use; torchrun's auto, gpu, cpu too.", dialects=(PADDLE3, TORCHRUN), pet=True,
          tags=(PER_HOST, KUBEFLOW_NODES), click={"type": WorkerCount(), "metavar": "N"}),
    _ours("selected_gpus", JOB, "Comma-separated GPU ids, one worker each. Default: all visible GPUs.",
          tags=(NOT_OVER_SSH,), click={"metavar": "IDS"}, listed=True),
    _ours("module", JOB, "Run training_script as a module: python -m training_script.", dialects=(TORCHRUN,),
          short=("-m",), pet=True, click={"is_flag": True, "default": False}),
    _ours("no_python", JOB, "Run training_script as an executable, not through Python: a path such as ./run.sh, "
          "or a command on PATH.", dialects=(TORCHRUN,), pet=True, click={"is_flag": True, "default": False}),
    _ours("max_restarts", JOB, "Restart the whole job (every node) up to N times after a worker fails.",
          dialects=(TORCHRUN,), pet=True,
          click={"type": Whole(0, 1000, "a number of restarts"), "default": 0, "show_default": True, "metavar": "N"}),
    _ours("shutdown_timeout", JOB, "Grace between SIGTERM and SIGKILL when workers are stopped (up to one day).",
          dialects=(TORCHRUN,), pet=True,
          click={"type": Seconds(), "default": 10.0, "show_default": True, "metavar": "SECONDS"}),
    _ours("agent_store", JOB, "Who hosts the workers' rendezvous store (MASTER_PORT): node 0's launcher, as torchrun's "
          "agent does, so that every rank connects as a client and a late rank 0 costs no wait (on; "
          "TORCHELASTIC_USE_AGENT_STORE=True), or rank 0 itself (off). auto: on when the workers' Python is the "
          "launcher's and has torch but not paddle. Collective mode only.",
          click={"type": click.Choice(AGENT_STORE_CHOICES), "default": "auto", "show_default": True}),
    _ours("config", JOB, "A YAML file of options (underscore names), training_script, training_script_args and env. "
          "The command line wins over it.", click={"metavar": "FILE.yaml"}, tags=(TUNER_OWN,)),
    _ours("print_config", JOB, "Print the launch plan before starting (true/false/1/0/yes/no).",
          click={"type": click.BOOL, "default": True, "show_default": True, "metavar": "BOOL"}),
    _ours("log_level", JOB, "The launcher's own messages: DEBUG, INFO, WARNING, ERROR, or 10-40.",
          click={"type": LogLevel(), "default": "INFO", "show_default": True}),
    # ---------------------------------------------------------------- workers on CPUs
    _torchrun("numa_binding", PLACEMENT, "bind each GPU worker to the CPUs near its GPU: node (its NUMA node's), "
              "socket (its socket's), exclusive (a share of its node's cores of its own), core-complex (a group of "
              "cores sharing one L3 cache); read from sysfs.", pet=False,
              click={"type": click.Choice(NUMA_MODES), "metavar": "|".join(NUMA_MODES)}),
    _ours("bind_cores_to_rank", PLACEMENT, "Give each worker cores of its own (DeepSpeed's option): the allowed CPUs "
          "split among the workers, hyperthreads of a core kept together, and OMP_NUM_THREADS and MKL_NUM_THREADS set "
          "to its cores unless set already.", click={"is_flag": True, "default": False}),
    _ours("bind_core_list", PLACEMENT, "The CPUs --bind_cores_to_rank splits among the workers (DeepSpeed's option), "
          "such as 0-15,32-47; implies --bind_cores_to_rank. Default: every CPU the launcher may use.",
          click={"type": CpuList(), "metavar": "CPUS"}),
    # ---------------------------------------------------------------- the nodes
    _ours("cluster_node_ips", NODES, "Comma-separated IPs or host names of all nodes, in node-rank order.",
          tags=(PER_HOST, NAMES_NODES, LISTS_NODES), click={"default": "127.0.0.1", "show_default": True, "metavar": "IPS"},
          listed=True),
    _ours("node_ip", NODES, "This node's IP, as it appears in --cluster_node_ips.",
          tags=(PER_HOST, NOT_OVER_SSH), click={"default": "127.0.0.1", "show_default": True, "metavar": "IP"}),
    _ours("started_port", NODES, "First port of this node's workers; worker i uses PORT+i. Default: free ports on one "
          "node, 6070 on several.", aliases=("start_port",), dialects=(PADDLE18, PADDLE3),
          tags=(PER_HOST,), click={"type": PORT, "metavar": "PORT"}),
    _ours("nnodes", NODES, "The number of nodes: N, checked against the nodes found; MIN:MAX, an elastic job "
          "(torchrun's, with --rdzv-endpoint; Paddle's, with --master: docs/elastic.md).", aliases=("np",),
          dialects=(TORCHRUN, PADDLE3, FLEETRUN), status=HONOURED, pet=True,
          tags=(KUBEFLOW_NODES,), click={"type": NodeCount(), "metavar": "N|MIN:MAX"}),
    _ours("cluster_env", NODES, "Where the nodes come from: the command line (cli), PaddleCloud, Kubeflow (PET_*), SLURM "
          "(srun), Volcano, MPI, LSF or torchrun's node options; auto takes the first found, else this node alone.",
          tags=(PER_HOST,), click={"type": click.Choice(cluster_source_names()), "default": "auto", "show_default": True}),
    _ours("use_paddlecloud", NODES, "Take the cluster from PaddleCloud's environment (PADDLE_TRAINERS, POD_IP, ...).",
          tags=(NAMES_NODES, LISTS_NODES), click={"is_flag": True, "default": False}),
    _ours("control_port", NODES, "Several nodes: the port node 0's launcher listens on for the others (under mpirun "
          "also to gather the node list). Default: the first worker port minus one.",
          click={"type": PORT, "metavar": "PORT"}),
    _ours("job_id", NODES, "Several nodes: the job's name, the same on every node. Default: a digest of the nodes, "
          "ports and command. Set LAUNCHER_JOB_TOKEN to make nodes prove they belong.", dialects=(PADDLE18, PADDLE3),
          click={"metavar": "ID"}),
    _ours("heartbeat_timeout", NODES, "Several nodes: a node silent this long is lost, and the job stops.",
          click={"type": Seconds(0.5), "default": 3.0, "show_default": True, "metavar": "SECONDS"}),
    _ours("join_timeout", NODES, "Several nodes: a node that has not joined after this long is named, and the job "
          "stops.", click={"type": Seconds(0.5), "default": 300.0, "show_default": True, "metavar": "SECONDS"}),
    # ---------------------------------------------------------------- the whole cluster over ssh
    _ours("hostfile", SSH, "Start the job on every host of FILE over ssh, from this one command (docs/cluster-ssh.md): a "
          "line a host, 'host slots=N' (DeepSpeed's, Open MPI's), 'host:N' (horovodrun's) or 'host' (its default "
          "workers); # starts a comment.", tags=(OVER_SSH,), click={"metavar": "FILE"}),
    _ours("hosts", SSH, "The hosts as horovodrun's -H: h1:4,h2:2,h3 (instead of --hostfile).", short=("-H",),
          tags=(OVER_SSH,), click={"metavar": "HOST[:N],..."}),
    _ours("include", SSH, "Only these hosts and GPUs (DeepSpeed's host1:0,2@host2).", tags=(OVER_SSH,), click={"metavar": "HOSTS"}),
    _ours("exclude", SSH, "All but these hosts and GPUs (DeepSpeed's host1:0@host3).", tags=(OVER_SSH,), click={"metavar": "HOSTS"}),
    _ours("remote_python", SSH, "The Python the hosts run the launcher with. Default: this command's own "
          "(sys.executable), in the same working directory.", tags=(OVER_SSH,), click={"metavar": "PATH"}),
    _ours("ssh_port", SSH, "The hosts' ssh port (default: ssh's own).", tags=(OVER_SSH,), click={"type": PORT, "metavar": "PORT"}),
    _ours("ssh_identity_file", SSH, "The key ssh offers the hosts.", tags=(OVER_SSH,), click={"metavar": "FILE"}),
    _ours("ssh_args", SSH, "More arguments for every ssh command, split as a shell would: '-F my_config -o "
          "ProxyJump=gw'.", tags=(OVER_SSH,), click={"metavar": "ARGS"}),
    _ours("ssh_connect_timeout", SSH, "Seconds within which each host must answer ssh; one that does not is named, and "
          "nothing starts.", tags=(OVER_SSH,),
          click={"type": Seconds(1.0), "default": 10.0, "show_default": True, "metavar": "SECONDS"}),
    _ours("ssh_fanout", SSH, "Hosts checked and started at once (pdsh's default).", tags=(OVER_SSH,),
          click={"type": Whole(1, 1024, "a number of hosts"), "default": 32, "show_default": True, "metavar": "N"}),
    _ours("env", JOB, "A variable for every worker, NAME=VALUE (again for more); with --hostfile, for every host's.",
          tags=(PER_HOST,), click={"type": EnvSetting(), "multiple": True, "metavar": "NAME=VALUE"}),
    _ours("env_file", JOB, "Variables for every worker from FILE, a NAME=VALUE a line (DeepSpeed's .deepspeed_env).",
          tags=(PER_HOST,), click={"metavar": "FILE"}),
    _ours("node_workers", NODES, "Each node's workers, by node rank, where nodes differ (4,2,8; --hostfile gives it).",
          listed=True, tags=(PER_HOST, NOT_OVER_SSH), click={"type": CountList(), "default": (), "metavar": "N,..."}),
    # ---------------------------------------------------------------- elastic jobs
    _torchrun("rdzv_backend", ELASTIC, "static, or c10d: with --nnodes MIN:MAX an elastic job whose membership node "
              "0's launcher keeps (docs/elastic.md); else both mean nodes of fixed ranks, gathered at node 0. etcd "
              "(or etcd-v2): the membership in etcd at --rdzv-endpoint, no node is special.",
              click={"type": click.Choice(backends.NAMES), "default": backends.FIXED.name, "show_default": True}),
    _torchrun("rdzv_endpoint", ELASTIC, "node 0's address and store port (instead of --master-addr/--master-port); "
              "etcd's endpoints with --rdzv-backend etcd.", tags=(NAMES_NODES,), click={"metavar": "HOST[:PORT]"}),
    _torchrun("rdzv_id", ELASTIC, "the job's id (= --job_id).", click={"metavar": "ID"}),
    _torchrun("rdzv_conf", ELASTIC, "an elastic job's rendezvous settings: join_timeout, last_call_timeout, "
              "close_timeout, heartbeat_timeout, read_timeout, keep_alive_interval, keep_alive_max_attempt, and etcd's "
              "(docs/elastic.md).", click={"metavar": "K=V,..."}),
    _ours("warm_start", ELASTIC, "With --nnodes MIN:MAX: start this node's workers before it joins the job; each "
          "runs up to launcher.runtime.elastic.run (its imports, its model) and waits there for its first round, so "
          "that a node joining a running job, or a standby taking a lost node's place, holds the others up for a "
          "re-form only. For programs that call elastic.run before they read their rank (docs/elastic.md).",
          click={"is_flag": True, "default": False}),
    # ---------------------------------------------------------------- health checks
    _ours("health_check", HEALTH, "The node's own check, besides the built-in ones (docs/health.md): a command run by a "
          "shell on each node before it takes part (such as 'dcgmi diag -r 1'); exit 0 is healthy, anything else "
          "keeps the node out, its last line of output the reason.", click={"metavar": "CMD"}),
    _ours("health_check_timeout", HEALTH, "Seconds --health_check may run; one that runs longer is stopped, and the "
          "node is unhealthy.", click={"type": Seconds(1.0), "default": USER_TIMEOUT, "show_default": True,
                                       "metavar": "SECONDS"}),
    _ours("skip_health_checks", HEALTH, f"Health checks turned off, by name: a comma list of {', '.join(CHECKS)}; or "
          f"{ALL}.", listed=True,
          click={"type": CheckNames(), "default": (), "metavar": "NAMES"}),
    _ours("health_interval", HEALTH, "An elastic job: seconds between the checks of a node kept out for failing one, "
          "and of a standby.", click={"type": Seconds(1.0), "default": INTERVAL, "show_default": True,
                                      "metavar": "SECONDS"}),
    # ---------------------------------------------------------------- logs and output
    _ours("log_dir", LOGS, "Write each worker's output to DIR/workerlog.RANK (appended); the node's first worker is "
          "also shown on the console.", dialects=(PADDLE18, TORCHRUN, PADDLE3), pet=True, click={"metavar": "DIR"},
          tags=(TUNER_OWN,)),
    _torchrun("redirects", LOGS, "these streams (1 stdout, 2 stderr, 3 both; by local rank as 0:3,1:2) go to "
              "log_dir/workerlog.N only, the others to the console.", short=("-r",), aliases=("redirect",),
              click={"metavar": "0-3|R:V,..."}),
    _torchrun("tee", LOGS, "these streams go to log_dir/workerlog.N and to the console.", short=("-t",),
              click={"metavar": "0-3|R:V,..."}),
    _torchrun("local_ranks_filter", LOGS, "the console shows only these local ranks (the log files keep every line).",
              click={"metavar": "0,1,..."}),
    _torchrun("duplicate_stdout_filters", LOGS, "stdout lines that contain any of these texts are also copied to "
              "log_dir/filtered_stdout.log.", click={"metavar": "TEXT,..."}),
    _torchrun("duplicate_stderr_filters", LOGS, "stderr lines that contain any of these texts are also copied to "
              "log_dir/filtered_stderr.log.", click={"metavar": "TEXT,..."}),
    # ---------------------------------------------------------------- watching the job
    _ours("monitor_port", WATCH, "Serve this node's view of the job over HTTP: /metrics (Prometheus), /healthz, "
          "/status.json and a live page of the whole job at / (give every node the same port); 0 picks a free port and "
          "prints it. Needs pip install 'launcher[monitor]'. Also LAUNCHER_MONITOR_PORT. Default: off.",
          click={"type": click.IntRange(0, 65535), "metavar": "PORT", "envvar": "LAUNCHER_MONITOR_PORT"}),
    _ours("monitor_host", WATCH, "The address the monitor listens on (default: this node's own; 0.0.0.0 for every "
          "interface).", click={"metavar": "HOST"}),
    _ours("hang_timeout", WATCH, "Stop the job (showing every worker's stack) when no worker has written a line for "
          "this long, or a worker that reports its steps (launcher.runtime.report) has reported none for this long. "
          "Default: never.",
          click={"type": Seconds(1.0, "; leave the option out to never stop a quiet job"), "metavar": "SECONDS"}),
    _ours("straggler_policy", WATCH, "What is done about a straggler, a node whose ranks' own work per step is below "
          "0.7 of the fastest rank's (their steps reported with launcher.runtime.report; docs/monitoring.md): off "
          "(not looked for), warn (named in the log, the event log, /metrics and the live page), or leave (also: an "
          "elastic job above its minimum of nodes goes on without it, and its launcher ends with exit code 0).",
          click={"type": click.Choice(STRAGGLER_POLICIES), "default": "warn", "show_default": True}),
    _ours("dump_stacks", WATCH, "Before stopping the workers after a failure or a signal, show where each one was (its "
          "Python stack, with py-spy), and again before the SIGKILL of a worker that let SIGTERM pass. Costs up to a "
          "few seconds of teardown; always done for --hang_timeout.",
          click={"type": click.BOOL, "default": False, "show_default": True, "metavar": "BOOL"}),
    _ours("report_log", WATCH, "Keep the workers' reports (launcher.runtime.report: the step and the numbers by name) "
          "in LOG_DIR/reports.nodeN.jsonl, a line per worker at most every 0.1 s: what launcher tune measures each "
          "trial's rate from (docs/tuning.md). Needs --log_dir.", click={"is_flag": True, "default": False},
          tags=(TUNER_OWN,)),
    _torchrun("event_log_handler", WATCH, "where torchrun's events also go: null (nowhere more), console (each event "
              "a line on the console) or dynamic_rendezvous; LOG_DIR/events.jsonl is kept either way.",
              click={"metavar": "NAME"}),
    # ---------------------------------------------------------------- parameter servers
    _ours("server_num", PS, "Parameter-server mode on one node: start N servers (default 2 when --worker_num is given).",
          tags=(PARAMETER_SERVERS,), click={"type": int, "metavar": "N"}),
    _ours("worker_num", PS, "Parameter-server mode on one node: start N trainers (default 2 when --server_num is "
          "given).", tags=(PARAMETER_SERVERS,), click={"type": int, "metavar": "N"}),
    _ours("servers", PS, "Parameter-server mode on several nodes: every server's endpoint; each node starts its own.",
          aliases=("endpoints",), tags=(PARAMETER_SERVERS,), click={"metavar": "IP:PORT,..."}, listed=True),
    _ours("workers", PS, "Parameter-server mode on several nodes: every trainer's endpoint; each node starts its own.",
          tags=(PARAMETER_SERVERS,), click={"metavar": "IP:PORT,..."}, listed=True),
    _ours("with_gloo", PS, "Paddle 2.6/3.x, parameter servers: fleet's gloo among trainers (1), all (2), or none (0).",
          dialects=(PADDLE3,), tags=(FLEET_GLOO,), click={"default": "1", "show_default": True, "metavar": "0|1|2"}),
    _ours("gloo_port", PS, "Paddle 2.6/3.x, parameter servers: the port of fleet's gloo rendezvous on server 0's host "
          "(default: a free port on one node, 6767 with --servers).", dialects=(PADDLE3,),
          tags=(FLEET_GLOO,), click={"type": click.IntRange(1, 65535), "metavar": "PORT"}),
    # ---------------------------------------------------------------- torchrun's spellings
    _torchrun("standalone", TORCHRUN_GROUP, "one node, on a free port (the default here).",
              tags=(NAMES_NODES,), click={"is_flag": True, "default": False}),
    _torchrun("node_rank", TORCHRUN_GROUP, "this node's rank, 0 to --nnodes minus 1.",
              tags=(NAMES_NODES, KUBEFLOW_NODES), click={"type": click.IntRange(0), "metavar": "R"}),
    _torchrun("master_addr", TORCHRUN_GROUP, "node 0's address (where rank 0 hosts the store); the other nodes join "
              "there.", tags=(NAMES_NODES, KUBEFLOW_NODES), click={"metavar": "HOST"}),
    _torchrun("master_port", TORCHRUN_GROUP, f"rank 0's store port (= --started_port; default {STATIC_PORT} on several "
              "nodes); node 0's launcher also listens on PORT-1 for the other nodes.",
              tags=(NAMES_NODES, KUBEFLOW_NODES), click={"type": PORT, "metavar": "PORT"}),
    _torchrun("local_addr", TORCHRUN_GROUP, "this node's address (= --node_ip).", status=ALIAS, maps_to="node_ip",
              click={"metavar": "IP"}),
    _torchrun("role", TORCHRUN_GROUP, "the workers' ROLE_NAME.",
              click={"default": "default", "show_default": True, "metavar": "NAME"}),
    _torchrun("signals_to_handle", TORCHRUN_GROUP, "the signals that stop the job, each passed on to the workers "
              "first (default SIGTERM,SIGINT,SIGHUP,SIGQUIT; SIGUSR1 and SIGUSR2 left out are passed on without a "
              "stop).", click={"metavar": "SIG,..."}),
    _torchrun("virtual_local_rank", TORCHRUN_GROUP, "every worker sees LOCAL_RANK=0 and only its own GPU "
              "(CUDA_VISIBLE_DEVICES narrowed to it, FLAGS_selected_gpus=0).", click={"is_flag": True, "default": False}),
    _torchrun("run_path", TORCHRUN_GROUP, "accepted, no effect: the script runs in a fresh interpreter, as it would by "
              "its path.", status=NO_EFFECT, click={"is_flag": True, "default": False},
              reason="a fresh interpreter runs the script by its path, which the script sees as runpy.run_path"),
    _torchrun("monitor_interval", TORCHRUN_GROUP, "accepted, no effect: exits are seen as they happen.",
              status=NO_EFFECT, click={"type": float, "metavar": "SECONDS"},
              reason="the launcher learns of each exit as it happens instead of polling"),
    _torchrun("start_method", TORCHRUN_GROUP, "accepted, no effect: every worker is a fresh process.",
              status=NO_EFFECT, click={"type": click.Choice(START_METHODS)},
              reason="every worker is a fresh process, as with spawn"),
    _torchrun("logs_specs", TORCHRUN_GROUP, "refused: a LogsSpecs plug-in is a class loaded into torchrun's own "
              "process, and this launcher never imports torch.", status=REFUSED, pet=False, click={"metavar": "NAME"},
              reason="a LogsSpecs plug-in is a Python class torchrun loads into its own process, and this launcher "
                     "never imports torch (--log_dir, --redirects and --tee choose the logs here)"),
    # ---------------------------------------------------------------- Paddle 2.6/3.x's and fleetrun's spellings
    _paddle("devices", "GPU ids, as --selected_gpus.", (PADDLE3, FLEETRUN), ALIAS, aliases=("gpus",),
            maps_to="selected_gpus", click={"metavar": "IDS"}, listed=True),
    _paddle("ips", "every node's address, as --cluster_node_ips.", (PADDLE3, FLEETRUN), ALIAS,
            maps_to="cluster_node_ips", tags=(NAMES_NODES, LISTS_NODES), click={"metavar": "IPS"}, listed=True),
    _paddle("host", "this node's address, as --node_ip.", (PADDLE3, FLEETRUN), ALIAS, maps_to="node_ip",
            tags=(NAMES_NODES,), click={"metavar": "IP"}),
    _paddle("rank", "this node's rank, its place in --ips or --cluster_node_ips (-1: found from --host); needed where "
            "nodes share a host (an address listed twice).", tags=(NAMES_NODES,), click={"metavar": "N"}),
    _paddle("master", "the rendezvous: node 0 (the first of --ips) listens on PORT, as --control_port; "
            "etcd://HOST:PORT with --nnodes: the membership in etcd.", tags=(NAMES_NODES,), click={"metavar": "IP:PORT"}),
    _paddle("elastic_server", "etcd's endpoint, with --job_id and --np: an elastic job whose membership is in etcd "
            "(docs/elastic.md).", (FLEETRUN,), click={"metavar": "HOST:PORT"}),
    _paddle("trainers", "every trainer's endpoint, as --workers.", status=ALIAS, maps_to="workers",
            click={"metavar": "IP:PORT,..."}, listed=True),
    _paddle("trainer_num", "trainers on this node, as --worker_num (servers: 1 when not given).", status=ALIAS,
            maps_to="worker_num", click={"type": int, "metavar": "N"}),
    _paddle("max_restart", "as --max_restarts (Paddle's default is 3, this launcher's 0).", status=ALIAS,
            maps_to="max_restarts", click={"type": click.IntRange(0, 1000), "metavar": "N"}),
    _paddle("run_mode", "collective, or ps (1 server, 1 trainer unless told).", (PADDLE3, FLEETRUN),
            click={"metavar": "MODE"}),
    _paddle("backend", "auto, nccl or gloo (PADDLE_DISTRI_BACKEND).", (FLEETRUN,), click={"metavar": "NAME"}),
    _paddle("elastic_timeout", "how long to wait for the other nodes, as --join_timeout.", status=ALIAS,
            maps_to="join_timeout", click={"type": Seconds(), "metavar": "SECONDS"}),
    _paddle("elastic_level", "with --nnodes MIN:MAX: -1 or 1, a worker failure restarts the job (up to "
            "--max_restart); 0, the failing node leaves and the others go on. A fixed job: -1 only.",
            click={"metavar": "N"}),
    _paddle("http_port", "fleet's gloo port, as --gloo_port.", (FLEETRUN,), ALIAS, maps_to="gloo_port",
            tags=(FLEET_GLOO,), click={"type": click.IntRange(1, 65535), "metavar": "PORT"}),
    _paddle("sort_ip", "rank the nodes by address.", click={"metavar": "BOOL"}),
    _paddle("log_overwrite", "false only: logs are appended, one header line per run.", click={"metavar": "BOOL"}),
    _paddle("legacy", "either: both command lines are taken at once.", status=NO_EFFECT, click={"metavar": "BOOL"},
            reason="Paddle 1.8's and Paddle 3's command lines are both taken at once"),
    _refused_paddle("npus", "Ascend NPUs are not supported: this launcher drives CPU and NVIDIA GPU workers"),
    _refused_paddle("xpus", _XPU),
    _refused_paddle("selected_xpus", _XPU),
    _refused_paddle("enable_gpu_log", "this launcher records no GPU log (run nvidia-smi alongside)", FALSE_WORDS),
    _refused_paddle("auto_parallel_config", _TUNER),
    _refused_paddle("auto_cluster_config", _TUNER, FALSE_WORDS),
    _refused_paddle("auto_tuner_json", _TUNER),
    _refused_paddle("cluster_topo_path", _MAPPING),
    _refused_paddle("rank_mapping_path", _MAPPING),
    _refused_paddle("enable_auto_mapping", _MAPPING, FALSE_WORDS),
    _refused_paddle("coordinators", _FEDERATED),
    _refused_paddle("coordinator_num", _FEDERATED, ("0",)),
    _refused_paddle("heter_workers", _HETER),
    _refused_paddle("heter_devices", _HETER),
    _refused_paddle("heter_worker_num", _HETER, ("0",)),
    _refused_paddle("elastic_pre_hook", _SCALE),
    _refused_paddle("scale", _SCALE, ("0",)),
    _refused_paddle("force", _SCALE, FALSE_WORDS),
)
ROW = {r.name: r for r in ROWS}


def rows(*, dialect: Optional[str] = None, status: Optional[str] = None, group: Optional[str] = None,
         tag: Optional[str] = None) -> tuple:
    """The rows of that dialect, status, group and tag (each None: any)."""
    return tuple(r for r in ROWS if (dialect is None or dialect in r.dialects) and (status is None or r.status == status)
                 and (group is None or r.group == group) and (tag is None or tag in r.tags))


def names(**selected) -> tuple:
    return tuple(r.name for r in rows(**selected))
