"""Parameter-server mode on torch.distributed.rpc (TensorPipe): servers hold the parameters (or slices
of them) and the sparse tables, and apply the optimizer; trainers compute gradients.

- env: where this process stands (pure)      - placement: which server holds what (pure)
- config: strategies and options             - transport: the RPC world, bounded calls
- server / trainer: the two sides            - session: one process's part, from join to leave

Use it through ``launcher.fleet`` (is_collective=False) or ``launcher.transpiler``.
"""

from launcher.ps.config import DistributeTranspilerConfig, PsOptions, PsStrategy, StrategyFactory
from launcher.ps.env import PsEnv, is_ps_environment, read_ps_env
from launcher.ps.placement import Slice, format_table, place
from launcher.ps.transport import PsError

__all__ = ["DistributeTranspilerConfig", "PsEnv", "PsError", "PsOptions", "PsStrategy", "Slice", "StrategyFactory",
           "format_table", "is_ps_environment", "place", "read_ps_env"]
