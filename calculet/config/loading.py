"""Loading ``calculet-scheduler/v1``: from a YAML file or parsed data to a validated config (§15).

Why this exists: a config file is read once at startup and every problem in it must be reported
at once, each naming its field path, before anything else runs. The schema id is checked first
(R15.1) so a file for another schema is reported as exactly that, and relative paths are taken
relative to the file's own directory so a config and its packages move together.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from calculet.config.base import SCHEMA_ID, unknown_schema
from calculet.config.error_messages import describe, format_error, problem_lines
from calculet.config.scheduler import SchedulerConfig
from calculet.errors import ConfigError
from calculet.yamlfile import read_yaml_file

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "EXAMPLE_CONFIG_PATH",
    "default_config",
    "load_config",
    "parse_config",
]

_DATA_DIR: Final = Path(__file__).resolve().parent.parent / "data" / "config"
DEFAULT_CONFIG_PATH: Final = _DATA_DIR / "default.yaml"
"""The §15 reference configuration, byte-for-byte the spec's values."""
EXAMPLE_CONFIG_PATH: Final = _DATA_DIR / "example.yaml"
"""A commented example with tenants, models and trust settings."""


def default_config() -> SchedulerConfig:
    """The §15 reference configuration (every default), identical to ``default.yaml``."""
    return SchedulerConfig.model_validate({"schema": SCHEMA_ID})


def parse_config(
    data: object, *, source: str = "<config>", base_dir: Path | None = None
) -> SchedulerConfig:
    """Validate already-parsed YAML/JSON data as a ``calculet-scheduler/v1`` config.

    The schema id is checked first: a file for another schema is reported as exactly that,
    not as a flood of unknown-key errors. Every other problem is reported at once, one line
    per field path. With ``base_dir``, relative package, trusted-root and key paths are made
    relative to it (the config file's directory), so a config and its packages move together.
    """
    _check_schema_id(data, source)
    try:
        config = SchedulerConfig.model_validate(data)
    except ValidationError as exc:
        problems = [format_error(error) for error in exc.errors(include_url=False)]
        count = len(problems)
        raise ConfigError(
            f"{source}: {count} invalid setting{'s' if count != 1 else ''}:\n"
            f"{problem_lines(problems)}",
            source=source,
            errors=problems,
        ) from None
    if base_dir is not None:
        config = _rebase_paths(config, base_dir)
    return config


def _check_schema_id(data: object, source: str) -> None:
    """R15.1: the data is a mapping whose ``schema`` is exactly ``calculet-scheduler/v1``."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections, got {describe(data)}",
            source=source,
            errors=[("", "not a mapping")],
        )
    if "schema" not in data:
        message = f"required: every config starts with 'schema: {SCHEMA_ID}' (§15)"
        raise ConfigError(
            f"{source}: schema: {message}", source=source, errors=[("schema", message)]
        )
    schema = data["schema"]
    if schema != SCHEMA_ID:
        message = unknown_schema(schema)
        raise ConfigError(
            f"{source}: schema: {message}", source=source, errors=[("schema", message)]
        )


def load_config(path: str | Path) -> SchedulerConfig:
    """Load and validate a ``calculet-scheduler/v1`` YAML file (§15).

    Errors (missing file, YAML syntax, duplicate keys, invalid settings) raise
    :class:`~calculet.errors.ConfigError` whose message starts with the file name and names
    each offending field path.
    """
    file = Path(path)
    data = read_yaml_file(file, ConfigError, "config")
    if data is None:
        raise ConfigError(
            f"{file}: the file is empty; it needs at least 'schema: {SCHEMA_ID}'",
            source=str(file),
            errors=[("schema", "required")],
        )
    return parse_config(data, source=str(file), base_dir=file.resolve().parent)


def _rebase_paths(config: SchedulerConfig, base_dir: Path) -> SchedulerConfig:
    def rebase(path: Path) -> Path:
        return path if path.is_absolute() else base_dir / path

    trust = config.trust.model_copy(
        update={
            "trusted_roots": tuple(rebase(p) for p in config.trust.trusted_roots),
            "trusted_keys_dir": (
                rebase(config.trust.trusted_keys_dir)
                if config.trust.trusted_keys_dir is not None
                else None
            ),
        }
    )
    models = tuple(m.model_copy(update={"package": rebase(m.package)}) for m in config.models)
    return config.model_copy(update={"trust": trust, "models": models})

