"""`lightpipe` entry point: subcommand registry, logging set-up and exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from testbed import __version__
from testbed.cli import (
    clean_cmd,
    cluster_cmd,
    controller_cmd,
    demo_cmd,
    doctor_cmd,
    emu_cmd,
    env_cmd,
    exec_cmd,
    fault_cmd,
    grafana_cmd,
    gym_cmd,
    monitor_cmd,
    plan_cmd,
    report_cmd,
    reproduce_cmd,
    route_cmd,
    run_cmd,
    schedule_cmd,
    schema_cmd,
    sim_cmd,
    sweep_cmd,
    topologies_cmd,
    trace_cmd,
    validate_cmd,
)
from testbed.errors import InputError, LightPipeError
from testbed.io.terminal import SafeFormatter, safe_line

log = logging.getLogger("lightpipe")

# name -> module; each module has HELP, add_arguments(parser) and run(args) -> int.
# Modules import heavy dependencies inside run(), so building the parser stays fast.
COMMANDS: dict[str, ModuleType] = {
    "demo": demo_cmd,
    "validate": validate_cmd,
    "schema": schema_cmd,
    "topologies": topologies_cmd,
    "env": env_cmd,
    "doctor": doctor_cmd,
    "trace": trace_cmd,
    "run": run_cmd,
    "sim": sim_cmd,
    "sweep": sweep_cmd,
    "plan": plan_cmd,
    "schedule": schedule_cmd,
    "reproduce": reproduce_cmd,
    "emu": emu_cmd,
    "exec": exec_cmd,
    "fault": fault_cmd,
    "clean": clean_cmd,
    "controller": controller_cmd,
    "route": route_cmd,
    "report": report_cmd,
    "monitor": monitor_cmd,
    "grafana": grafana_cmd,
    "cluster": cluster_cmd,
    "gym": gym_cmd,
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError("", f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lightpipe", description="LightPipe: pipeline-parallel training "
                     "across optical DCs, simulated and emulated.")
    parser.add_argument("--version", action="version", version=f"lightpipe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, mod in COMMANDS.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _lenient(parser: argparse.ArgumentParser) -> None:
    """Make every argument of `parser` (and its subparsers) optional, so that a parse
    gets as far as listing the arguments that nothing takes."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.required = False
            for sub in action.choices.values():
                _lenient(sub)
        elif action.option_strings:
            action.required = False
        elif action.nargs is None:
            action.nargs = "?"


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its subparsers."""
    out: set[str] = set()
    for action in parser._actions:
        out.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def unknown_options_error(argv: Sequence[str]) -> InputError | None:
    """When `argv` has options its command does not know: one error naming only them
    (argparse would first say that a required option is missing, or call the values after
    an unknown option unrecognised too), with the known option it looks like, or the
    commands that have it."""
    import difflib

    parser = build_parser()
    _lenient(parser)
    try:
        ns, extra = parser.parse_known_args(list(argv))
    except InputError:
        return None
    unknown = [a.split("=", 1)[0] for a in extra if a.startswith("-") and a != "-"
               and not _is_number(a)]
    if not unknown:
        return None
    command = getattr(ns, "command", None)
    sub = _subparser(parser, command)
    known = _options(sub) if sub is not None else \
        {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    named = []
    for opt in unknown:
        close = [k for k in sorted(known) if opt.startswith(k) or k.startswith(opt)] \
            or difflib.get_close_matches(opt, sorted(known), n=1, cutoff=0.7)
        others = [name for name in COMMANDS if name != command
                  and opt in _options(_subparser(parser, name) or parser)]
        if close:
            named.append(f"{opt} (did you mean {close[0]}?)")
        elif others:
            named.append(f"{opt} (an option of " + ", ".join(f"`lightpipe {o}`"
                                                             for o in others[:3]) + ")")
        else:
            named.append(opt)
    prog = f"lightpipe {command}" if command else "lightpipe"
    what = "unknown option" + ("s " if len(unknown) > 1 else " ") + ", ".join(named)
    return InputError("", f"{prog}: {what}; `{prog} --help` lists its options")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _subparser(parser: argparse.ArgumentParser, name: str | None
               ) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None


def restore_sigint() -> None:
    """Ctrl-C/SIGINT stops every command however it was started: a background job of a
    non-interactive shell inherits SIGINT ignored, and Python would keep it ignored (a held
    emulation or `monitor serve` could then only be killed)."""
    import signal
    import threading

    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's Python stack to the command's stderr and
    the command goes on: what a run that seems stuck is doing (README, CLI)."""
    import faulthandler
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and sys.stderr is not None:
        try:
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        except (ValueError, OSError, AttributeError):  # stderr without a file descriptor
            pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 runtime failure, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    restore_sigint()
    stacks_on_sigusr1()
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except InputError as exc:
            raise unknown_options_error(args_list) or exc from None
        _setup_logging(args.verbose)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except InputError as exc:
        if debug:
            log.exception("input error")
        sys.stderr.write(f"lightpipe: error: {safe_line(exc.line())}\n")
        return 2
    except LightPipeError as exc:
        if debug:
            log.exception("failure")
        sys.stderr.write(f"lightpipe: error: {safe_line(str(exc))}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("lightpipe: interrupted\n")
        return 130
    except SystemExit as exc:  # argparse --help / --version
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except OSError as exc:  # a file or device the user named or the run needs
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{(exc.strerror or str(exc)).lower()}"
        sys.stderr.write(f"lightpipe: error: {safe_line(text)}\n")
        return 1
    except Exception as exc:
        if debug:
            raise
        text = f"internal error ({type(exc).__name__}: {exc})"
        sys.stderr.write(f"lightpipe: error: {safe_line(text)}; please report it with the "
                         "output of --debug\n")
        return 1


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("lightpipe: %(levelname)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
