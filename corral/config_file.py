"""Read the cluster and VC config from a YAML file; every refusal is one line naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.config import ClusterConfig, ConfigError, parse_cluster_config
from corral.core.options import OptionError
from corral.yamlfile import YamlFileError, read_yaml_file

if TYPE_CHECKING:
    from corral.core.framework import SchedulerConfig


def load_cluster_config(path: Path) -> ClusterConfig:
    """Load and validate a cluster config file; ConfigError("FILE: key.path: reason") if refused."""
    file = str(path)
    try:
        data = read_yaml_file(path)
    except YamlFileError as error:
        raise ConfigError("", str(error), file) from None
    try:
        return parse_cluster_config(data)
    except ConfigError as error:
        raise ConfigError(error.key_path, error.reason, file) from None


def load_scheduler_config(path: Path) -> SchedulerConfig:
    """The scheduler config of a YAML file: its `scheduler:` section, or the whole file when it
    has none (as `corral config show` prints it); OptionError("FILE: scheduler.key: reason")."""
    from corral.core.framework import config_from_mapping

    try:
        data = read_yaml_file(path)
    except YamlFileError as error:
        raise OptionError(f"{path}: {error}") from None
    if isinstance(data, dict) and "scheduler" in data:
        data = data["scheduler"]
    if not isinstance(data, dict):
        raise OptionError(f"{path}: scheduler: must be a mapping")
    return config_from_mapping(data, where=f"{path}: scheduler")
