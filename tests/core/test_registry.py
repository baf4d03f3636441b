"""The plugin registries import a plugin when it is read, and say its options without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from corral.core.admission import ADMISSIONS
from corral.core.framework import STAGES, sections
from corral.core.options import NoOptions
from corral.core.placement import PLACEMENTS
from corral.core.policy import POLICIES
from corral.core.registry import Lazy, Registry, load

REGISTRIES = {"policy": POLICIES, "placement": PLACEMENTS, "admission": ADMISSIONS, "stage": STAGES}
ENTRIES = [(kind, name) for kind, registry in REGISTRIES.items() for name in registry]


@pytest.mark.parametrize(("kind", "name"), ENTRIES)
def test_a_lazy_entry_declares_the_class_and_its_options(kind: str, name: str) -> None:
    """Where an entry says its class and options are is where they are: the options a config
    reads without the plugin are the plugin's own `Options`."""
    registry = REGISTRIES[kind]
    declared = registry.declared(name)
    assert declared is not None, f"{kind} {name}: registered as a Lazy entry"
    plugin = registry[name]
    assert load(declared.where) is plugin
    options = NoOptions if declared.options is None else load(declared.options)
    assert options is plugin.Options, f"{kind} {name}: declares {declared.options}"
    assert registry.options(name) is plugin.Options


def test_a_plugin_is_imported_when_read() -> None:
    """Names, `in` and options leave the plugin's module unloaded; reading the entry loads it."""
    check = (
        "import sys\n"
        "from corral.core.framework import sections\n"
        "from corral.core.policy import POLICIES\n"
        "sections()\n"
        "assert 'optimus' in POLICIES and 'optimus' in list(POLICIES)\n"
        "assert POLICIES.options('optimus').__name__ == 'OptimusOptions'\n"
        "assert 'corral.core.policy.optimus' not in sys.modules\n"
        "assert POLICIES['optimus'].__name__ == 'Optimus'\n"
        "assert 'corral.core.policy.optimus' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_a_registered_class_replaces_the_declaration() -> None:
    class Options:
        pass

    class Plugin:
        pass

    Plugin.Options = Options  # type: ignore[attr-defined]
    registry: Registry[type] = Registry(
        {
            "a": Lazy("corral.core.options:NoOptions"),
            "b": Lazy("x:Y", "corral.core.options:OptionInfo"),
        }
    )
    assert list(registry) == ["a", "b"] and len(registry) == 2 and "b" in registry
    assert registry.options("a") is NoOptions  # a Lazy without options: none
    registry["b"] = Plugin
    assert registry["b"] is Plugin and registry.options("b") is Options
    assert registry.declared("b") is None and registry.declared("a") is not None
    del registry["b"]
    assert "b" not in registry and list(registry) == ["a"]
    with pytest.raises(KeyError):
        registry["b"]


def test_sections_come_from_the_declarations() -> None:
    """Every plugin with options has its section, named as the plugin."""
    expected = {"retry"} | {
        name
        for registry in REGISTRIES.values()
        for name in registry
        if registry.options(name) is not NoOptions
    }
    assert set(sections()) == expected
