"""Read a YAML (or JSON) file strictly: the one reader of the config, spec and client files.

It imports nothing of corral, so the CLI reads a job spec without loading the scheduling core.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlFileError", "read_yaml_file"]


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one,
    which would silently drop e.g. a cell type defined twice)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: let PyYAML report it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class YamlFileError(ValueError):
    """A YAML file that cannot be read or parsed; str() is the reason, without the file name."""


def read_yaml_file(path: str | Path) -> object:
    """The data of a YAML (or JSON) file, refusing duplicate keys; YamlFileError if unreadable,
    not UTF-8, invalid or empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise YamlFileError(f"cannot read the file: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise YamlFileError("the file is not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise YamlFileError(_yaml_reason(error)) from None
    if data is None:
        raise YamlFileError("the file is empty")
    return data


def _yaml_reason(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        problem = error.problem or "invalid YAML"
        context = f" ({error.context})" if error.context else ""
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}invalid YAML: {problem}{context}"
    return f"invalid YAML: {error}"
