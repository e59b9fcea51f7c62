"""The option values' types: how a value of the command line, the config file or a ``PET_*`` variable is read, and
the one sentence that refuses a bad one."""

from __future__ import annotations

import click

LOG_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}


class LogLevel(click.ParamType):
    name = "level"

    def convert(self, value, param, ctx):
        text = str(value).strip().upper()
        if text in LOG_LEVELS:
            return LOG_LEVELS[text]
        if text.isascii() and text.isdigit() and 10 <= int(text) <= 40:
            return int(text)
        self.fail(f"{value!r} is not a log level; use DEBUG, INFO, WARNING, ERROR or a number from 10 to 40.", param, ctx)


class WorkerCount(click.types.IntParamType):
    """A number of workers, or torchrun's auto, gpu, cpu (the plan resolves them with the host's facts)."""

    name = "N|auto|gpu|cpu"

    def convert(self, value, param, ctx):
        text = str(value).strip().lower()
        if text in ("auto", "gpu", "cpu"):
            return text
        if text.isascii() and text.lstrip("-").isdigit():
            return int(text)
        self.fail(f"{value!r} is not a number of workers; give a whole number such as 2, or auto, gpu or cpu.", param, ctx)


class Seconds(click.ParamType):
    """A finite number of seconds from ``low`` (0) to one day: nan never expires, inf cannot be added
    to a clock; ``hint`` ends the refusal."""

    name = "seconds"

    def __init__(self, low: float = 0.0, hint: str = "") -> None:
        self.low, self.hint = low, hint

    def convert(self, value, param, ctx):
        from launcher.plan.model import MAX_SHUTDOWN_TIMEOUT  # not at import: --help stays fast

        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            seconds = None
        if seconds is None or not self.low <= seconds <= MAX_SHUTDOWN_TIMEOUT:  # also false for nan
            self.fail(f"{value!r} is not a number of seconds from {self.low:g} to {MAX_SHUTDOWN_TIMEOUT:.0f} "
                      f"(one day){self.hint}.", param, ctx)
        return seconds


class Whole(click.types.IntParamType):
    """A whole number from ``low`` to ``high``; the refusal names the value, the range and ``what`` it counts."""

    def __init__(self, low: int, high: int, what: str) -> None:
        self.low, self.high, self.what = low, high, what
        self.name = what

    def convert(self, value, param, ctx):
        text = str(value).strip()
        number = int(text) if text.isascii() and text.lstrip("+-").isdigit() and not isinstance(value, float) else None
        if number is None or not self.low <= number <= self.high:
            self.fail(f"{value!r} is not {self.what} from {self.low} to {self.high}; give a whole number in that range.",
                      param, ctx)
        return number


class NodeCount(click.ParamType):
    """A number of nodes, ``N`` or ``MIN:MAX``, read once (``launcher.plan.parsing.node_range``) into a NodeRange."""

    name = "N|MIN:MAX"

    def convert(self, value, param, ctx):
        from launcher.plan.parsing import node_range  # not at import: --help stays fast

        try:
            return node_range(value)
        except ValueError as e:
            self.fail(f"{str(value)!r} {e}.", param, ctx)


class CpuList(click.ParamType):
    """A list of CPUs as sysfs and numactl write one ("0-3,8,10-11"); kept as text, checked here."""

    name = "cpus"

    def convert(self, value, param, ctx):
        from launcher.plan.topology import parse_cpu_list  # not at import: --help stays fast

        text = str(value).strip()
        try:
            cpus = parse_cpu_list(text)
        except ValueError:
            cpus = None
        if not cpus:
            self.fail(f"{value!r} is not a list of CPUs; give numbers below 65536 and ranges such as 0-3,8,10-11.", param,
                      ctx)
        return text


class CheckNames(click.ParamType):
    """--skip_health_checks: a comma list of health checks' names (launcher.plan.health.CHECKS), or all."""

    name = "names"

    def convert(self, value, param, ctx):
        from launcher.plan.health import read_check_names  # not at import: --help stays fast

        if isinstance(value, tuple):  # already read (a default)
            return value
        try:
            return read_check_names(value)
        except ValueError as e:
            self.fail(f"{e}.", param, ctx)


class EnvSetting(click.ParamType):
    """--env NAME=VALUE: a variable for the workers, as a (name, value) pair; the value is kept exactly."""

    name = "NAME=VALUE"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):  # already read (the config file's)
            return value
        from launcher.errors import LaunchError
        from launcher.plan.carried_env import parse_env_option  # not at import: --help stays fast

        try:
            return next(iter(parse_env_option([str(value)]).items()))
        except LaunchError as e:
            self.fail(str(e), param, ctx)


class CountList(click.ParamType):
    """--node_workers: a comma list of whole numbers of workers, each 1 or more."""

    name = "N,..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [item.strip() for item in str(value).split(",")]
        if not all(item.isascii() and item.isdigit() and 1 <= int(item) <= 65535 for item in items):
            self.fail(f"{value!r} is not a comma list of numbers of workers from 1 to 65535, such as 4,2,8.", param, ctx)
        return tuple(int(item) for item in items)
