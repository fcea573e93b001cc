"""The one registry: register by name, duplicates refused, unknown names listed, options read from a config section."""

from types import SimpleNamespace

import pytest

from ragen_core.registry import Registry


def _registry() -> Registry:
    things: Registry = Registry("widget")

    @things.register("b", options=("scale",))
    def b(x, scale=1.0, extra=None):
        return x * scale

    @things.register("a", options={"offset": "widget_offset"})
    def a(x, offset=0.0):
        return x + offset

    return things


def test_register_get_and_iterate():
    things = _registry()
    assert things.names() == ["a", "b"] and list(things) == ["a", "b"] and len(things) == 2
    assert "a" in things and "c" not in things and ["unhashable"] not in things
    assert things.get("b")(2.0) == 2.0 and things["a"](1.0) == 1.0
    assert [name for name, _ in things.items()] == ["a", "b"]


def test_a_second_registration_of_a_name_is_refused():
    things = _registry()
    with pytest.raises(ValueError, match=r"widget 'a' is registered twice \(first: .*a\)"):
        things.register("a")(lambda x: x)
    with pytest.raises(ValueError, match="registered twice"):
        Registry("widget", {"a": 1}).add("a", 2)


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown widget 'c'; registered: a, b"):
        _registry().get("c")
    with pytest.raises(ValueError, match="registered: none"):
        Registry("widget").get("c")


def test_options_are_read_from_the_section_by_field_name():
    things = _registry()
    section = SimpleNamespace(scale=3.0, widget_offset=0.5, unrelated=True)
    assert things.options("a") == {"offset": "widget_offset"}
    assert things.options_from("a", section) == {"offset": 0.5}
    assert things.call("b", section, 2.0) == 6.0 and things.call("a", section, 2.0) == 2.5
    assert things.bind("b", section)(1.0) == 3.0
    # keyword inputs reach only the functions that take them; one no function takes is a typo
    assert things.call("a", section, 2.0, extra="ignored by a") == 2.5
    with pytest.raises(TypeError, match=r"unknown widget keyword\(s\) exra"):
        things.call("a", section, 2.0, exra=1)
    with pytest.raises(ValueError, match="reads option 'scale', which SimpleNamespace lacks"):
        things.call("b", SimpleNamespace(), 2.0)


def test_an_option_the_function_does_not_take_is_refused_at_registration():
    with pytest.raises(ValueError, match="declares option.* gama it does not take"):
        Registry("widget").register("c", options=("gama",))(lambda x, gamma=1.0: x)


def test_remove_unregisters():
    things = _registry()
    things.remove("a")
    del things["b"]
    assert things.names() == []
    with pytest.raises(ValueError, match="unknown widget 'a'"):
        things.remove("a")
