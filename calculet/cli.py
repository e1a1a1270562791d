"""``calculet``: one console command over the entry points that exist as modules (DESIGN "Layout").

Why a table: each entry point is a module with its own ``main(argv)`` (``python -m calculet.run``
keeps working; so do the others); this command only maps a name to that module and hands it the
rest of the arguments, importing it only when it is asked for (``calculet --help`` starts fast and
``calculet serve`` never imports the test or bench extras). Adding a command is one row in
:data:`COMMANDS` — the device conformance kit's ``conformance`` (#18) among them.

``calculet config check FILE`` validates a ``calculet-scheduler/v1`` file without starting (§15):
the schema and every field, and, when it names packages, §11 steps 1–3 for the served alias —
trusted path, signature and hashes against its ``trust`` section, and the configuration
cross-validated against the package's manifest (a B8 asked of a B1 calbin fails here, R15.19).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from calculet.config import SchedulerConfig


@dataclass(frozen=True)
class Command:
    """A subcommand: the module whose ``function(argv) -> int`` runs it."""

    module: str
    summary: str
    function: str = "main"

    def load(self) -> Callable[[list[str]], int]:
        main: Callable[[list[str]], int] = getattr(importlib.import_module(self.module), self.function)
        return main


COMMANDS: dict[str, Command] = {
    "serve": Command("calculet.run", "serve the OpenAI-compatible API, admin API and /metrics (= python -m calculet.run)"),
    "verify": Command("calculet.verify", "prove the declared invariants with z3 (= python -m calculet.verify)"),
    "specs": Command("calculet.specgen", "regenerate specs/ from the declarations (= python -m calculet.specgen)"),
    "package": Command("calculet.package", "build, sign, verify, inspect, pack model packages (= python -m calculet.package)"),
    "bench": Command("calculet.bench.cli", "load simulation and benchmarks (= python -m calculet.bench)"),
    "config": Command("calculet.cli", "check a configuration without starting: calculet config check FILE",
                      "config_main"),
    "fleet": Command("calculet.fleet.cli", "many boards behind HAProxy: haproxy-config, rollout, status, local"),
    "conformance": Command("calculet.conformance.__main__", "run the device conformance kit and write its evidence "
                           "report (= python -m calculet.conformance)"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    rows = "\n".join(f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items())
    return (f"usage: calculet COMMAND [ARGS...]\n\ncommands:\n{rows}\n\n"
            "'calculet COMMAND --help' shows a command's own options.\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    command = COMMANDS.get(name)
    if command is None:
        sys.stderr.write(f"calculet: unknown command {name!r}\n\n{_usage()}")
        return 2
    try:
        return int(command.load()(rest) or 0)
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


# ---------------------------------------------------------------------------------------------
# calculet config check FILE
# ---------------------------------------------------------------------------------------------


def config_main(argv: Sequence[str]) -> int:
    """``calculet config check FILE``: 0 valid, 1 invalid (the message names the field)."""
    parser = argparse.ArgumentParser(prog="calculet config", description="Configuration tools (§15).")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate a calculet-scheduler/v1 file without starting")
    check.add_argument("file", help="the YAML configuration")
    check.add_argument("--no-package", action="store_true", help="skip the package checks (§11 steps 1-3)")
    args = parser.parse_args(argv)
    from calculet.errors import CalculetError

    try:
        lines = check_config(args.file, packages=not args.no_package)
    except CalculetError as exc:
        print(f"calculet config check: {args.file}: INVALID\n{exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: OK")
    for line in lines:
        print(f"  {line}")
    return 0


def check_config(path: str, *, packages: bool = True) -> list[str]:
    """Validate ``path``; returns what was checked. Raises the ``ConfigError``/``PackageError`` found."""
    from calculet.config import load_config

    config = load_config(path)
    done = [f"schema calculet-scheduler/v1, model_alias {config.model_alias!r}, "
            f"{len(config.tenants)} tenant(s), batch profiles {list(config.batch.profiles)}"]
    served = next((m for m in config.models if m.alias == config.model_alias), None)
    if config.models and served is None:
        from calculet.errors import ConfigError

        raise ConfigError(f"model_alias: {config.model_alias!r} is not among models[].alias",
                          errors=[("model_alias", "not among models[].alias")])
    if served is None:
        done.append("no models[]: `calculet serve` serves the bundled tiny model signed with the development key")
        return done
    if not packages:
        return done
    return done + _check_package(config, served.package)


def _check_package(config: SchedulerConfig, package: Path) -> list[str]:
    from calculet.config import cross_validate
    from calculet.packages import verify_package
    from calculet.packages.manifest import CalbinManifest

    trust = config.trust
    with verify_package(package, trust.trusted_roots, trust.trusted_keys_dir,
                        trust.max_file_bytes) as verified:
        manifest = CalbinManifest.parse(dict(verified.manifest))
        signer = f"{verified.key_id} ({verified.key_name})"
    caps = manifest.capabilities.to_contract()
    cross_validate(config, manifest_profiles={p.compiled_batch for p in manifest.profiles},
                   manifest_label=f"calbin {manifest.name!r}", max_inflight_supported=caps.max_inflight_jobs.value,
                   ping_pong=caps.ping_pong.value, physical_devices_supported=caps.physical_devices_per_process.value,
                   multi_profile_residency=caps.multi_profile_residency.value)
    return [f"package {package}: trusted path, signature by {signer}, every file hash (§11 steps 1-2)",
            f"configuration fits calbin {manifest.name!r} (profiles "
            f"{[p.compiled_batch for p in manifest.profiles]}; §11 step 3)"]


if __name__ == "__main__":
    sys.exit(main())
