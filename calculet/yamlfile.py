"""Reading the project's YAML inputs (scheduler config, load-simulation workloads) strictly.

One reader so both inputs fail the same way: a missing or unreadable file and any YAML error
are the caller's error type naming the file, and a mapping with a duplicate key is an error
(PyYAML keeps the last of two equal keys silently, which in a config hides a mistake: two
``queues:`` sections, the second one winning).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml

from calculet.errors import ConfigError


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate and unhashable mapping keys."""


def _construct_mapping(loader: StrictSafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in result
        except TypeError:
            raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                    f"unhashable key {key!r}", key_node.start_mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                    f"duplicate key {key!r}", key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=deep)
    return result


StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml_file(path: str | Path, error: type[ConfigError], what: str) -> Any:
    """The parsed contents of the YAML file ``path``; problems raise ``error`` naming the file.

    ``what`` names the input in messages ("config", "workload"): ``<file>: config file not
    found``, ``<file>: cannot read workload file: ...``, ``<file>: invalid YAML: ...``.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{file}: {what} file not found", source=str(file)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{file}: cannot read {what} file: {exc}", source=str(file)) from None
    stream = io.StringIO(text)
    stream.name = str(file)  # PyYAML puts the stream's name into its error marks
    try:
        return yaml.load(stream, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise error(f"{file}: invalid YAML: {exc}", source=str(file)) from None
