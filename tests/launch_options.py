"""One real launch from a LaunchOptions given as JSON, through the launcher's own path below the command line (probe
this machine, plan, check, run to the end, exit with the launcher's code): for the tests of options by their effect,
whatever spells them on the command line.

    python tests/launch_options.py '{"training_script": "w.py", "nproc_per_node": 2, "signals_to_handle": [10]}'

Lists become tuples; ``stream_choice`` is [redirects, tee, local_ranks_filter] as torchrun's text (null: not given).
"""

import json
import logging
import os
import sys

from launcher.errors import LaunchError
from launcher.host import preflight
from launcher.output import standard_streams as streams
from launcher.output.console import error, setup_messages
from launcher.output.messages import log
from launcher.plan.model import LaunchOptions
from launcher.plan.planner import make_plan
from launcher.plan.streams import parse_choice
from launcher.run import attempts, limits


def options(text: str) -> LaunchOptions:
    fields = json.loads(text)
    for name, value in fields.items():
        if isinstance(value, list):
            fields[name] = tuple(value)
    if fields.get("stream_choice") is not None:
        fields["stream_choice"] = parse_choice(*fields["stream_choice"])
    return LaunchOptions(**fields)


def main() -> int:
    streams.open_standard_streams()
    setup_messages(logging.INFO)
    try:
        opts = options(sys.argv[1])
        host = preflight.probe_host(os.environ)
        finder = preflight.port_finder(host, lambda count: limits.check_limits(count, log_dir=False))
        plan = make_plan(opts, os.environ, host, finder)
        preflight.check(plan, opts, host)
        for note in plan.notes:
            log.warning(note)
        code = attempts.run(plan, tuple(finder.held or preflight.reserve_store_port(plan)))
    except LaunchError as e:
        error(str(e))
        code = 2
    streams.finish_output()
    return code


if __name__ == "__main__":
    os._exit(main())
