"""Where each worker's stdout and stderr go: torchrun's --redirects, --tee and --local-ranks-filter
(torch/distributed/elastic/multiprocessing/api.py: ``Std``, ``to_map``, ``DefaultLogsSpecs.reify``),
parsed and mapped onto this launcher's layout, one ``log_dir/workerlog.N`` per rank and the console.

Pure: text in, a StreamChoice out; a choice and a local rank in, a StreamRoute out. Bad input raises
LaunchError. No choice (none of the three options given) is the launcher's own layout, decided where
the outputs are made (launcher.output.routes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional, Union

from launcher.errors import LaunchError

NONE, OUT, ERR = 0, 1, 2  # torchrun's Std: the streams as bits
BOTH = OUT | ERR
_VALUE = re.compile(r"[0-3]")
_MAPPING = re.compile(r"[0-9]+:[0-3](,[0-9]+:[0-3])*")
_RANKS = re.compile(r"[0-9]+(,[0-9]+)*")
STREAM_HELP = "0 none, 1 stdout, 2 stderr, 3 both, for every local rank or as LOCAL_RANK:VALUE,... such as 0:3,1:2"


@dataclass(frozen=True)
class StreamRoute:
    """Where one worker's streams go: the bits (OUT, ERR) written to its log file, and those shown on
    the console (from its log file when they are in it, else from a pipe); a stream in neither is dropped."""

    to_file: int
    to_console: int

    @property
    def one_place(self) -> bool:
        """Both streams to the log file, or both to the console alone: what a spare interpreter can take over."""
        return self.to_file == BOTH or (self.to_file == NONE and self.to_console == BOTH)


@dataclass(frozen=True)
class StreamChoice:
    """torchrun's three options, parsed. ``redirects`` and ``tee``: one value for every local rank, or
    {local rank: value} (a rank not named: NONE); None when the option was not given (then the
    launcher's own file layout stays). ``shown``: the local ranks the console shows (None: every one)."""

    redirects: Union[int, Mapping[int, int], None] = None
    tee: Union[int, Mapping[int, int], None] = None
    shown: Optional[frozenset] = None

    @property
    def sets_files(self) -> bool:
        """Whether --redirects or --tee decide the files (else the launcher's layout, with ``shown``)."""
        return self.redirects is not None or self.tee is not None

    @property
    def needs_files(self) -> bool:
        """Whether some stream of some rank goes to a log file."""
        return any(_any_bits(v) for v in (self.redirects, self.tee))


def parse_choice(redirects: Optional[str], tee: Optional[str], local_ranks_filter: Optional[str]) -> Optional[StreamChoice]:
    """The three options' text (None: not given) as a StreamChoice; None when none was given."""
    if redirects is None and tee is None and local_ranks_filter is None:
        return None
    return StreamChoice(parse_std(redirects, "--redirects"), parse_std(tee, "--tee"),
                        parse_ranks(local_ranks_filter))


def parse_std(text: Optional[str], option: str) -> Union[int, Mapping[int, int], None]:
    """torchrun's ``Std.from_str``: "3" (every local rank) or "0:3,1:2" (by local rank)."""
    if text is None:
        return None
    value = text.strip()
    if _VALUE.fullmatch(value):
        return int(value)
    if _MAPPING.fullmatch(value):
        pairs = [item.split(":") for item in value.split(",")]
        return {int(rank): int(std) for rank, std in pairs}
    raise LaunchError(f"{option} {text} is not a choice of streams; give {STREAM_HELP}.")


def parse_ranks(text: Optional[str]) -> Optional[frozenset]:
    """--local-ranks-filter: "0,1,2" as local ranks; None when not given."""
    if text is None:
        return None
    value = text.replace(" ", "")
    if not _RANKS.fullmatch(value):
        raise LaunchError(f"--local-ranks-filter {text} is not a list of local ranks; give numbers such as 0 or 0,1,2.")
    return frozenset(int(rank) for rank in value.split(","))


FILTERED_FILES = {OUT: "filtered_stdout.log", ERR: "filtered_stderr.log"}  # torchrun's names, in the log dir


@dataclass(frozen=True)
class Duplicate:
    """torchrun's --duplicate-stdout-filters (``stream`` OUT) or --duplicate-stderr-filters (ERR): each line of a
    duplicated stream (``teed``) that contains any of ``filters`` is also appended to ``path``, the log dir's
    ``filtered_stdout.log`` or ``filtered_stderr.log``, after its rank's label (``[rank 3] ``), every rank's in one
    file."""

    stream: int
    filters: tuple  # texts, as given (a line matches when it contains one)
    path: str


def teed(route_: Optional[StreamRoute], log_file: bool, local_rank: int) -> int:
    """The streams of a worker that go to its log file and to the console from there, torchrun's teed streams, whose
    lines its duplicate filters look at: those of --tee (not of a rank that --local-ranks-filter hides), or, in the
    launcher's layout with --log_dir, both streams of the node's first worker, whose log the console echoes."""
    if not log_file:
        return NONE
    if route_ is None:
        return BOTH if local_rank == 0 else NONE
    return route_.to_file & route_.to_console


def route(choice: StreamChoice, local_rank: int, log_dir: bool) -> StreamRoute:
    """Where ``choice`` sends the streams of the worker of ``local_rank`` (``reify``'s rules). Without
    --redirects/--tee: the launcher's layout (every stream to the log file with --log_dir, else to the
    console), the console limited to ``shown``."""
    shown = choice.shown is None or local_rank in choice.shown
    if not choice.sets_files:
        return StreamRoute(BOTH if log_dir else NONE, BOTH if shown else NONE)
    teed = bits_of(choice.tee, local_rank)
    to_file = bits_of(choice.redirects, local_rank) | teed  # a teed stream is written to its file, then followed
    to_console = ((BOTH & ~to_file) | teed) if shown else NONE
    return StreamRoute(to_file, to_console)


def bits_of(value: Union[int, Mapping[int, int], None], local_rank: int) -> int:
    """torchrun's ``to_map`` for one rank: the value for every rank, or this rank's entry (NONE if none)."""
    if value is None:
        return NONE
    if isinstance(value, int):
        return value
    return value.get(local_rank, NONE)


def _any_bits(value: Union[int, Mapping[int, int], None]) -> bool:
    if isinstance(value, int):
        return value != NONE
    return bool(value) and any(value.values())
