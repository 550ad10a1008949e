"""``python -m nvmlsim``: run any Python program on the simulated driver.

Subcommands:

``exec [--simulate PROFILE_OR_FILE] [--clock wall|manual] [--stats-json PATH] -- TARGET [ARGS...]``
    Install the simulation (wall clock by default) and run TARGET in this process: a
    console-script name (``nvitop-exporter``), a module (``pkg.mod``, run as ``__main__``) or a
    ``.py`` file, with ``sys.argv = [TARGET, *ARGS]``. Its exit status is returned. With
    ``--stats-json`` the driver's call counts and time spent in the simulated functions are
    written there when the program ends (also on SIGTERM/SIGINT), for benchmarks.
``list [--field-cases]``
    The built-in profiles, one per line with their description; with ``--field-cases`` the
    names of the field-case scenarios (F01-F32) instead.
``validate FILE_OR_PROFILE...``
    Load each scenario; print ``ok`` or every problem by field path; exit 1 on any error.
``schema``
    Print the JSON Schema of scenario files.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from nvmlsim.clock import ManualClock, WallClock
from nvmlsim.driver import SimDriver
from nvmlsim.install import install, uninstall
from nvmlsim.loader import (
    DEFAULT_PROFILE,
    ScenarioError,
    list_field_cases,
    list_profiles,
    load_scenario,
    scenario_json_schema,
)

__all__ = ["main", "run_target"]

PROG = "python -m nvmlsim"


def _parser() -> argparse.ArgumentParser:
    summary = __doc__.split("\n\n")[0].replace("``", "")  # no reST markup in --help
    parser = argparse.ArgumentParser(prog=PROG, description=summary)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("exec", help="run a Python program on the simulated driver")
    run.add_argument(
        "--simulate",
        default=DEFAULT_PROFILE,
        metavar="PROFILE_OR_FILE",
        help=f"built-in profile or scenario file (default: {DEFAULT_PROFILE})",
    )
    run.add_argument(
        "--clock",
        choices=("wall", "manual"),
        default="wall",
        help="wall: values move with real time (default); manual: time stands still",
    )
    run.add_argument(
        "--stats-json",
        metavar="PATH",
        type=Path,
        help="write call counts and time in the driver here at exit",
    )
    run.add_argument("target", help="console script, module or .py file to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    listing = sub.add_parser("list", help="list the built-in profiles")
    listing.add_argument(
        "--field-cases", action="store_true", help="list the field-case scenarios instead"
    )
    check = sub.add_parser("validate", help="check scenario files or profiles")
    check.add_argument("scenarios", nargs="+", metavar="FILE_OR_PROFILE")
    sub.add_parser("schema", help="print the JSON Schema of scenario files")
    return parser


def _console_script(name: str) -> Any | None:
    for entry in metadata.entry_points(group="console_scripts"):
        if entry.name == name:
            return entry.load()
    return None


def run_target(target: str, args: Sequence[str]) -> int:
    """Run ``target`` (console script, module or .py file) as ``__main__``; return its status."""
    sys.argv = [target, *args]
    try:
        script = _console_script(target)
        if script is not None:
            result = script()
        elif target.endswith(".py") and Path(target).is_file():
            runpy.run_path(target, run_name="__main__")
            result = 0
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
            result = 0
    except SystemExit as exc:
        result = exc.code
    if result is None:
        return 0
    if isinstance(result, int):
        return result
    print(result, file=sys.stderr)
    return 1


def _write_stats(drv: SimDriver, path: Path) -> None:
    by_function: dict[str, int] = {}
    for (function, _), n in drv.calls.items():
        by_function[function] = by_function.get(function, 0) + n
    stats = dict(drv.stats())
    stats["by_function"] = dict(sorted(by_function.items()))  # type: ignore[assignment]
    stats["violations"] = [v.kind for v in drv.violations]  # type: ignore[assignment]
    path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")


def _exec(ns: argparse.Namespace) -> int:
    args = list(ns.args)
    if args[:1] == ["--"]:
        args = args[1:]
    target = ns.target
    scenario = load_scenario(ns.simulate)
    clock = WallClock() if ns.clock == "wall" else ManualClock(scenario.clock.start_unix)
    drv = install(scenario, clock=clock)

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return run_target(target, args)
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ns.stats_json is not None:
            _write_stats(drv, ns.stats_json)
        uninstall()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m nvmlsim``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["exec"] and "--" in argv:  # everything after "--" belongs to the target
        cut = argv.index("--")
        argv = argv[:cut] + argv[cut + 1 :][:1] + ["--"] + argv[cut + 2 :]
    ns = _parser().parse_args(argv)
    try:
        return _command(ns)
    except BrokenPipeError:  # `python -m nvmlsim list | head`: the reader left; not an error
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a pipeline's writer killed by it


def _command(ns: argparse.Namespace) -> int:
    try:
        if ns.command == "exec":
            return _exec(ns)
        if ns.command == "list":
            if ns.field_cases:
                print("\n".join(list_field_cases()))
                return 0
            for name in list_profiles():
                print(f"{name}\t{load_scenario(name).description}")
            return 0
        if ns.command == "schema":
            print(scenario_json_schema())
            return 0
        failed = False
        for source in ns.scenarios:
            try:
                load_scenario(source)
                print(f"{source}: ok")
            except ScenarioError as exc:
                failed = True
                print(exc, file=sys.stderr)
        return 1 if failed else 0
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
