"""Reading YAML safely: no objects built, no key given twice, bounded in size and depth before anything is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ragen_core.config.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' merges may override, as YAML allows
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one section (lines {first} and {line}); keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


YAML_MAX_BYTES = 1_000_000  # a config is a few kilobytes; a megabyte is room for long env options
YAML_MAX_DEPTH = 64  # sections nest a few levels: deeper is a mistake (and would exhaust Python's recursion)
YAML_MAX_NODES = 100_000  # values after expanding aliases: an alias bomb (billion laughs) is refused, not expanded


def _yaml_bounds(text: str, what: str) -> None:
    """Refuse YAML whose nesting or alias-expanded size exceed the limits, from its parse events, before any object
    is built (the parser keeps its own stack, so a 20,000-deep text costs no recursion here)."""
    sizes: dict[str, int] = {}  # anchor -> expanded size of its node
    open_nodes: list[list[Any]] = []  # [size so far, anchor] of each collection being read
    total = 0

    def add(size: int) -> None:
        nonlocal total
        total += size
        if total > YAML_MAX_NODES:
            raise ConfigError(
                f"{what} expands to more than {YAML_MAX_NODES:,} values (aliases included): a config never needs "
                "that many; remove the repeated aliases (*name)"
            )
        if open_nodes:
            open_nodes[-1][0] += size

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(open_nodes) >= YAML_MAX_DEPTH:
                raise ConfigError(f"{what} nests deeper than {YAML_MAX_DEPTH} levels; configs nest a few sections")
            add(1)  # the collection itself, counted in its parent
            open_nodes.append([0, event.anchor])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            size, anchor = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = size + 1
        elif isinstance(event, yaml.ScalarEvent):
            add(1)
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            add(sizes.get(event.anchor, 1))


def load_yaml(text: str, what: str) -> Any:
    """Parse YAML ``text`` (``what`` names it in errors, e.g. ``config file 'x.yaml'``) with a safe loader that builds
    no objects, refuses a key given twice, and is bounded (:data:`YAML_MAX_DEPTH`, :data:`YAML_MAX_NODES`) before
    anything is built; every problem is a one-line :class:`ConfigError`."""
    try:
        _yaml_bounds(text, what)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: builds no objects
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError(f"{what} is not valid YAML: {problem}") from exc


def read_yaml_file(path: Path) -> Any:
    """The YAML of a config file: a text file of at most :data:`YAML_MAX_BYTES`, UTF-8, parsed by
    :func:`load_yaml`."""
    what = f"config file {str(path)!r}"
    try:
        size = path.stat().st_size
        if size > YAML_MAX_BYTES:
            raise ConfigError(f"{what} is {size:,} bytes; a config is YAML text of at most {YAML_MAX_BYTES:,} bytes")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 at byte {exc.start}"
        raise ConfigError(f"{what} is not a YAML text file ({problem}); give a .yaml config") from exc
    if "\x00" in text:
        raise ConfigError(f"{what} is not a YAML text file (it holds NUL bytes); give a .yaml config")
    return load_yaml(text, what)
