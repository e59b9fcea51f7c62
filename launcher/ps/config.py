"""What a parameter-server job is configured with: Paddle's DistributeTranspilerConfig, the four
Fleet strategies, and the frozen PsOptions the runtime runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.runtime.strict import refuse_unknown
from launcher.ps.placement import check as check_placement
from launcher.runtime.flags import RpcFlags

SYNC, ASYNC, HALF_ASYNC, GEO = "sync", "async", "half_async", "geo"
MODES = (SYNC, ASYNC, HALF_ASYNC, GEO)
DC_ASGD_LAMBDA = 1.0  # Paddle 1.8 adds g*g*(w - w_backup) unscaled; the DC-ASGD paper also tries 0.04-2


MIN_BLOCK_SIZE = 8192  # Paddle's DistributeTranspiler asserts config.min_block_size >= 8192


class PSDispatcher:
    """Paddle's ps_dispatcher base: ``config.split_method = RoundRobin`` (the class, as Paddle's user code passes it)."""


class RoundRobin(PSDispatcher):
    """Slices go to the servers in turn (Paddle's ps_dispatcher.RoundRobin)."""


class HashName(PSDispatcher):
    """A slice goes to server crc32(name) % servers (Paddle's ps_dispatcher.HashName, unsalted)."""


@dataclass
class DistributeTranspilerConfig:
    """Paddle 1.8's ``fluid.DistributeTranspilerConfig``: all of its attributes, with its defaults (plus
    dc_asgd_lambda, random_seed and max_merge_var_num, which Paddle takes from elsewhere).

    Setting an attribute that is not one of these raises AttributeError naming the nearest one.
    """

    slice_var_up: bool = True  # cut large parameters into slices spread over the servers
    split_method: object = None  # RoundRobin (None) or HashName: the class, or its name
    min_block_size: int = MIN_BLOCK_SIZE  # the smallest slice, in elements (at least 8192, as Paddle asserts)
    enable_dc_asgd: bool = False  # delay-compensated updates (async mode only)
    dc_asgd_lambda: float = DC_ASGD_LAMBDA  # λ of g + λ·g⊙g⊙(w − w_backup)
    mode: str = "pserver"  # or "nccl2" (or "collective" with collective_mode="grad_allreduce"): collective training
    print_log: bool = False  # print the placement table
    random_seed: int = 0  # Paddle's program.random_seed: the shuffle of whole parameters (slice_var_up=False)
    wait_port: bool = True  # nccl2: trainer 0 waits for the others (the rendezvous always does)
    runtime_split_send_recv: bool = False  # Paddle's async switch; here transpile's sync_mode decides
    sync_mode: bool = True  # Paddle's; here transpile's sync_mode argument decides
    half_async: bool = False  # transpiler spelling of the half-async strategy (sync_mode=False)
    completely_not_async: bool = False  # Paddle's sync switch for fleet; here transpile's sync_mode decides
    geo_sgd_mode: bool = False  # transpiler spelling of the geo strategy
    geo_sgd_need_push_nums: int = 100  # geo: push parameter deltas every this many steps
    nccl_comm_num: int = 1  # nccl2: communicators, as the collective strategy's
    use_hierarchical_allreduce: bool = False  # nccl2: as the collective strategy's
    hierarchical_allreduce_inter_nranks: int = 0  # nccl2: workers per node of the hierarchy (0: LOCAL_WORLD_SIZE)
    collective_mode: object = None  # mode="collective": "grad_allreduce" (= nccl2)
    max_merge_var_num: int = 20  # half-async: steps whose gradients are averaged into one update

    def __setattr__(self, name, value):
        refuse_unknown(self, name, what="DistributeTranspilerConfig", family="Paddle 1.8's DistributeTranspilerConfig")
        if name in ("runtime_split_send_recv", "sync_mode") and value is None:
            raise ValueError(f"{name} can't be None (Paddle's rule): set True or False.")
        if name == "runtime_split_send_recv" and value and self.sync_mode:
            raise ValueError("runtime_split_send_recv=True needs config.sync_mode = False first (Paddle's rule).")
        if name == "sync_mode" and value and self.runtime_split_send_recv:
            raise ValueError("sync_mode=True needs config.runtime_split_send_recv = False first (Paddle's rule).")
        object.__setattr__(self, name, value)


def split_method_name(value) -> str:
    """"RoundRobin" or "HashName" from Paddle's forms: the class, its name, or None (RoundRobin)."""
    if value is None:
        return "RoundRobin"
    if isinstance(value, type) and value.__name__ in ("RoundRobin", "HashName"):
        return value.__name__  # ours, or Paddle's own classes
    if value in ("RoundRobin", "HashName"):
        return value
    raise ValueError(f"split_method={value!r} must be RoundRobin or HashName (launcher.transpiler.RoundRobin, "
                     "or the name as a string).")


def check_min_block_size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_BLOCK_SIZE:
        raise ValueError(f"min_block_size={value!r} must be a whole number of at least {MIN_BLOCK_SIZE}, as Paddle's "
                         "DistributeTranspiler asserts; leave it at 8192 or raise it.")
    return value


@dataclass(frozen=True)
class PsOptions:
    """How the servers and trainers of one job work (the same in every process)."""

    mode: str = SYNC
    slice_var_up: bool = True
    split_method: str = "RoundRobin"
    min_block_size: int = 8192
    enable_dc_asgd: bool = False
    dc_asgd_lambda: float = DC_ASGD_LAMBDA
    update_frequency: int = 100  # geo
    max_merge_var_num: int = 20  # half-async
    print_log: bool = False
    random_seed: int = 0
    rpc: RpcFlags = field(default_factory=RpcFlags)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"parameter-server mode {self.mode!r} is not one of {', '.join(MODES)}.")
        check_placement(1, self.split_method, self.min_block_size)
        if self.enable_dc_asgd and self.mode != ASYNC:
            raise ValueError(f"enable_dc_asgd=True works in async mode only, not {self.mode}; "
                             "use fleet.StrategyFactory.create_async_strategy() (or sync_mode=False).")
        for name in ("update_frequency", "max_merge_var_num"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number of at least 1.")
        if not isinstance(self.random_seed, int) or isinstance(self.random_seed, bool) or not 0 <= self.random_seed < 2**32:
            raise ValueError(f"random_seed={self.random_seed!r} must be a whole number from 0 to 2**32 - 1 (Paddle's "
                             "program.random_seed; 0 by default).")
        if not self.dc_asgd_lambda >= 0:
            raise ValueError(f"dc_asgd_lambda={self.dc_asgd_lambda!r} must be 0 or more.")


def options_from(config: DistributeTranspilerConfig, mode: str, rpc: RpcFlags, update_frequency=None) -> PsOptions:
    """The PsOptions of ``config`` run in ``mode``."""
    return PsOptions(
        mode=mode,
        slice_var_up=bool(config.slice_var_up),
        split_method=split_method_name(config.split_method),
        min_block_size=check_min_block_size(config.min_block_size),
        enable_dc_asgd=bool(config.enable_dc_asgd),
        dc_asgd_lambda=float(config.dc_asgd_lambda),
        update_frequency=config.geo_sgd_need_push_nums if update_frequency is None else update_frequency,
        max_merge_var_num=config.max_merge_var_num,
        print_log=bool(config.print_log),
        random_seed=config.random_seed,
        rpc=rpc,
    )


class PsStrategy:
    """One of Paddle 1.8's parameter-server strategies (made by fleet.StrategyFactory)."""

    def __init__(self, mode: str, update_frequency: int = 100):
        self.mode = mode
        self.update_frequency = update_frequency
        self._config = DistributeTranspilerConfig()

    def get_program_config(self) -> DistributeTranspilerConfig:
        """The transpiler settings (slice_var_up, split_method, enable_dc_asgd, ...), to read or change."""
        return self._config

    def set_program_config(self, config) -> None:
        """Replace the settings with ``config`` (a DistributeTranspilerConfig or a dict of its fields)."""
        if isinstance(config, dict):
            fresh = DistributeTranspilerConfig()
            for key, value in config.items():
                setattr(fresh, key, value)
            config = fresh
        if not isinstance(config, DistributeTranspilerConfig):
            raise TypeError("set_program_config takes a DistributeTranspilerConfig or a dict of its fields.")
        self._config = config

    def options(self, rpc: RpcFlags) -> PsOptions:
        return options_from(self._config, self.mode, rpc, self.update_frequency if self.mode == GEO else None)

    def __repr__(self) -> str:
        extra = f", update_frequency={self.update_frequency}" if self.mode == GEO else ""
        return f"PsStrategy({self.mode!r}{extra})"


class StrategyFactory:
    """Paddle 1.8's ``fleet.StrategyFactory``: the four parameter-server strategies."""

    @staticmethod
    def create_sync_strategy() -> PsStrategy:
        return PsStrategy(SYNC)

    @staticmethod
    def create_async_strategy() -> PsStrategy:
        return PsStrategy(ASYNC)

    @staticmethod
    def create_half_async_strategy() -> PsStrategy:
        return PsStrategy(HALF_ASYNC)

    @staticmethod
    def create_geo_strategy(update_frequency: int = 100) -> PsStrategy:
        return PsStrategy(GEO, update_frequency)
