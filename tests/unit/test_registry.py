"""The plugin registry with synthetic entry points (no installed distribution; the real
ones are in tests/integration/test_entry_points.py): built-ins are never shadowed, the
first of two same-named plugins wins, each clash warns once, a broken target fails only
when used, in one line."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from types import SimpleNamespace

import pytest

from dpgen_bench import registry
from dpgen_bench.errors import UserError
from dpgen_bench.registry import Registry

GROUP = "dpgen_bench.test_only"


def ep(name: str, value: str, dist: str | None) -> EntryPoint:
    e = EntryPoint(name=name, value=value, group=GROUP)
    return e._for(SimpleNamespace(name=dist)) if dist else e


@pytest.fixture
def fake_entry_points(monkeypatch):
    found: list[EntryPoint] = []
    monkeypatch.setattr(registry, "entry_points", lambda group: [e for e in found if e.group == group])
    return found


def make() -> Registry:
    reg = Registry("widget", GROUP)
    reg.register("builtin", "builtins:object")
    return reg


def test_plugins_are_listed_and_loaded(fake_entry_points, warnings_seen):
    fake_entry_points.append(ep("extra", "collections:OrderedDict", "dist-a"))
    reg = make()
    assert reg.names() == ["builtin", "extra"] and "extra" in reg
    from collections import OrderedDict

    assert reg.get("extra") is OrderedDict and reg.get("builtin") is object
    assert warnings_seen == []


def test_a_built_in_is_kept_with_one_warning(fake_entry_points, warnings_seen):
    fake_entry_points.append(ep("builtin", "collections:OrderedDict", "dist-a"))
    reg = make()
    for _ in range(3):
        assert reg.names() == ["builtin"]
    assert reg.get("builtin") is object
    (w,) = warnings_seen
    assert "'builtin'" in w and "'dist-a'" in w and "collections:OrderedDict" in w and "built-in" in w
    assert "another name" in w and "\n" not in w


def test_the_first_of_two_distributions_is_kept_with_one_warning(fake_entry_points, warnings_seen):
    fake_entry_points += [ep("extra", "collections:OrderedDict", "dist-a"), ep("extra", "collections:deque", "dist-b")]
    reg = make()
    reg.names()
    reg.names()
    from collections import OrderedDict

    assert reg.get("extra") is OrderedDict
    (w,) = warnings_seen
    assert "'dist-a'" in w and "'dist-b'" in w and "collections:deque" in w and "\n" not in w


@pytest.mark.parametrize("value,error", [("dpgb_no_such_module:X", "ModuleNotFoundError"),
                                         ("collections:NoSuchThing", "AttributeError")])
def test_a_broken_target_fails_only_when_used(fake_entry_points, value, error):
    fake_entry_points.append(ep("broken", value, "dist-b"))
    reg = make()
    assert reg.names() == ["broken", "builtin"]
    with pytest.raises(UserError) as e:
        reg.get("broken")
    msg = str(e.value)
    assert "\n" not in msg
    for needle in ("widget plugin 'broken'", "'dist-b'", value, error):
        assert needle in msg
    assert reg.get("builtin") is object  # the others still work


def test_an_unknown_distribution_is_a_question_mark(fake_entry_points, warnings_seen):
    fake_entry_points.append(ep("builtin", "collections:OrderedDict", None))
    make().names()
    (w,) = warnings_seen
    assert "(distribution '?')" in w


def test_registering_a_taken_name_still_needs_replace():
    reg = make()
    with pytest.raises(ValueError):
        reg.register("builtin", "builtins:dict")
    assert not hasattr(reg, "decorator")


def test_the_cli_module_imports_without_torch():
    """``bench --help`` and the option parsing start in a tenth of a second: the CLI module
    and what it imports at the top (config, registry, store) leave torch to the commands
    that need it (~1.5 s of import)."""
    import subprocess
    import sys

    code = "import sys, dpgen_bench.cli; print(sorted(m for m in ('torch', 'opacus', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_only_objects_given_to_this_process_are_flagged_as_unseen_by_new_processes(fake_entry_points):
    """A sweep's worker processes import the registry afresh: lazy references and entry
    points reach them, objects handed over (or swapped in) in this process do not."""
    reg = Registry("thing", GROUP)
    fake_entry_points.append(ep("plugin", "json:loads", "somedist"))
    reg.register("lazy", "json:dumps")
    reg.register("given", lambda: None)
    assert not reg.only_in_this_process("lazy") and not reg.only_in_this_process("plugin")
    reg.get("lazy"), reg.get("plugin")  # loading keeps them findable
    assert not reg.only_in_this_process("lazy") and not reg.only_in_this_process("plugin")
    assert reg.only_in_this_process("given")
    reg._items["lazy"] = lambda: None  # swapped in place (as a test's monkeypatch does)
    assert reg.only_in_this_process("lazy")
    assert not reg.only_in_this_process("unknown")
