"""The launch command's click options, made from the one table of options (``launcher.cli.table``), and its
``--help``, whose options are grouped by what they are for, in the table's sections."""

from __future__ import annotations

import click

from launcher import __version__
from launcher.cli import table

OTHER = "Other"  # --version and --help


class TableOption(click.Option):
    """An option of the table: every spelling is taken, --help shows one for each name (``shown``)."""

    def __init__(self, *args, shown: tuple = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shown = list(shown)

    def get_help_record(self, ctx: click.Context):
        taken, self.opts = self.opts, self.shown
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = taken


def click_option(row: table.Row):
    """The click decorator of one row: every spelling, its type, default and help."""
    return click.option(*row.short, *row.spellings, row.name, cls=TableOption, shown=(*row.short, *row.shown),
                        help=row.help, **row.click)


class GroupedCommand(click.Command):
    """A command whose --help lists its options in sections (``launcher.cli.table.GROUPS``), not in one flat list."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                row = table.ROW.get(param.name)
                sections.setdefault(row.group if row is not None else OTHER, []).append(record)
        for group in (*table.GROUPS, OTHER):
            if sections.get(group):
                with formatter.section(group):
                    formatter.write_dl(sections[group])


def launch_options(command):
    """Every option of the launch command, as click decorators in the table's order, and --version."""
    for row in reversed(table.ROWS):
        command = click_option(row)(command)
    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
                        help="Show the version and exit.")(command)


def refused_options_epilog() -> str:
    """--help's last paragraph: the hidden rows, taken only to be refused, by name (from the table)."""
    import textwrap

    names = " ".join(r.spellings[0] for r in table.rows(status=table.REFUSED) if r.click.get("hidden"))
    return textwrap.fill(f"Paddle 2.6/3.x and fleetrun options taken only to be refused, each saying why (NPUs and "
                         "XPUs, the auto-parallel tuner, rank auto-mapping, heterogeneous and federated parameter "
                         f"servers, fleetrun's commands to scale an elastic job): {names}", 95) + "\n"


def _show_version(ctx: click.Context, param, value) -> None:
    """``PROG VERSION``, PROG as this command was called (click's own version option keeps the first call's)."""
    if value and not ctx.resilient_parsing:
        click.echo(f"{ctx.find_root().info_name} {__version__}")
        ctx.exit()


