"""`lightpipe` entry point: subcommand registry, logging set-up and exit codes."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from testbed import __version__
from testbed.errors import InputError, LightPipeError

log = logging.getLogger("lightpipe")

# name -> module; each module has HELP, add_arguments(parser) and run(args) -> int.
# Modules import heavy dependencies inside run(), so building the parser stays fast.
COMMANDS: dict[str, str] = {
    "validate": "testbed.cli.validate_cmd",
    "schema": "testbed.cli.schema_cmd",
    "topologies": "testbed.cli.topologies_cmd",
    "env": "testbed.cli.env_cmd",
    "trace": "testbed.cli.trace_cmd",
    "run": "testbed.cli.run_cmd",
}


def register(name: str, module: str) -> None:
    """Add a subcommand (used by later modules; keeps the registry in one place)."""
    COMMANDS[name] = module


def _optional_commands() -> None:
    # Subcommands whose modules exist in this build (added by later parts of LightPipe).
    for name, module in {
        "sim": "testbed.cli.sim_cmd",
        "sweep": "testbed.cli.sweep_cmd",
        "plan": "testbed.cli.plan_cmd",
        "schedule": "testbed.cli.schedule_cmd",
        "reproduce": "testbed.cli.reproduce_cmd",
        "emu": "testbed.cli.emu_cmd",
        "exec": "testbed.cli.exec_cmd",
        "clean": "testbed.cli.clean_cmd",
        "controller": "testbed.cli.controller_cmd",
        "report": "testbed.cli.report_cmd",
    }.items():
        if importlib.util.find_spec(module) is not None:
            COMMANDS.setdefault(name, module)


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError("", f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    _optional_commands()
    parser = _Parser(prog="lightpipe", description="LightPipe: pipeline-parallel training "
                     "across optical DCs, simulated and emulated.")
    parser.add_argument("--version", action="version", version=f"lightpipe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 runtime failure, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        _setup_logging(args.verbose)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except InputError as exc:
        if debug:
            log.exception("input error")
        sys.stderr.write(f"lightpipe: error: {exc.line()}\n")
        return 2
    except LightPipeError as exc:
        if debug:
            log.exception("failure")
        sys.stderr.write(f"lightpipe: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("lightpipe: interrupted\n")
        return 130
    except SystemExit as exc:  # argparse --help / --version
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:
        if debug:
            raise
        sys.stderr.write(f"lightpipe: error: {type(exc).__name__}: {exc} "
                         "(rerun with --debug for the traceback)\n")
        return 1


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    logging.basicConfig(level=level, format="lightpipe: %(levelname)s: %(message)s",
                        stream=sys.stderr)


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
