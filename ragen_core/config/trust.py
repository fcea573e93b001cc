"""Keys that name what runs or what is read from outside the data root: trusted only when the user names them.

A data root is shared: anyone who can write one of its files (a run's manifest, a stored sweep plan) can write any
config into it. A config read back from the data root (``ragen resume``, ``ragen eval RUN``, a stored sweep plan)
is therefore never allowed to choose a program to run, a module to import, hosts to reach or a folder outside the
data root to read: such a key is declared once, on its field, with :func:`trusted_only`, and
:func:`check_stored_trust` refuses a stored config whose value of one is not harmless unless the user names the key
again on the command line (or, for a key with an environment variable, sets that variable to the same value).

What "harmless" means is the key's kind (:data:`KINDS`): a program, a hostfile or a launcher only at its default
(none, in-process); a path inside the data root or inside a folder the user listed in :data:`TRUSTED_PATHS_VARIABLE`;
a module only as a name (no ``pkg.module:Class``): an environment of this project or one that an installed
distribution registers (entry points of ``ragen.envs``), which the user installed as they installed this project;
a tracking URI only as a store inside those folders (a server, a database host, a service is named by the user); a
tracker's account or project only at its default; a server to connect to (an env server) only on this machine's
loopback interface. The user allows every stored module at once with
:data:`TRUST_MODULE_FLAG`. A new key plugs in by its declaration, e.g.
``name: str = Field("bandit", json_schema_extra=trusted_only("module"))``; entries of a dict field (the env's
options) by :func:`trusted_entries`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel

from ragen_core.config.errors import ConfigError

TRUST_MARK = "trusted_only"  # the key of a field's json_schema_extra that declares it
# Folders (separated by os.pathsep) whose models a stored config may name, e.g. a cluster's shared model store.
TRUSTED_PATHS_VARIABLE = "RAGEN_TRUSTED_PATHS"


def _at_default(value: Any, default: Any, root: Path) -> bool:
    return value == default


def _inside_trusted_folder(value: Any, default: Any, root: Path) -> bool:
    return value is None or value == default or trusted_path(str(value), root)


def _registered_name(value: Any, default: Any, root: Path) -> bool:
    """A name, never an import path: an env of this project, or one an installed distribution registers (entry
    points of ``ragen.envs``: the user installed it, as they installed this project). Looking a name up imports no
    module a file names; a list (``env.val_envs``) is harmless when each of its names is."""
    if value is None:
        return True
    names = value if isinstance(value, list) else [value]
    return all(isinstance(name, str) and ":" not in name and "/" not in name for name in names)


def loopback_host(url: str) -> bool:
    """Whether ``url`` names a server on this machine's loopback interface (``127.0.0.0/8``, ``::1``,
    ``localhost``): a stored URL of one reaches nothing outside the machine."""
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: resolved elsewhere, so it may be any host
        return False


def _loopback_server(value: Any, default: Any, root: Path) -> bool:
    return value is None or value == default or loopback_host(str(value))


def _own_servers(value: Any, default: Any, root: Path) -> bool:
    return all(entry == "local" for entry in value or ())  # a loopback port may be another user's: not harmless


def local_store_path(uri: str) -> str | None:
    """The file or folder a tracking URI names on this machine (a plain path, ``file:``, ``sqlite:///``), or None
    for a URI that names a host or a service (``http(s)://``, ``databricks``, ``postgresql://``, ...)."""
    if uri.startswith("sqlite:///"):
        return uri.removeprefix("sqlite:///").split("?", 1)[0] or None  # four slashes: an absolute path
    if uri.startswith("file:"):
        parsed = urlparse(uri)  # file:///a and file:a name a path here, file://host/a another machine's
        return parsed.path or None if parsed.netloc in ("", "localhost") else None
    if uri in ("databricks", "databricks-uc", "uc") or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", uri):
        return None  # MLflow's names of services, and every other scheme
    return uri


def _local_tracking_store(value: Any, default: Any, root: Path) -> bool:
    if value is None or value == default:
        return True
    path = local_store_path(str(value))
    return path is not None and trusted_path(path, root)


@dataclass(frozen=True)
class TrustKind:
    """What a kind of key names (for the message), when a stored value of it is harmless, and how else than by
    naming it again the user can allow one (for the message)."""

    names: str
    harmless: Callable[[Any, Any, Path], bool]
    allow: str = ""


# The command-line flag that allows every stored key of kind "module" (resume, eval: the commands that rebuild a
# stored config).
TRUST_MODULE_FLAG = "--trust-env-module"
KINDS: dict[str, TrustKind] = {
    "program": TrustKind("a program to run", _at_default),
    "launcher": TrustKind("a launcher that starts processes", _at_default),
    "hostfile": TrustKind("hosts to start processes on", _at_default),
    "rendezvous": TrustKind("an address where the update group's nodes meet", _at_default),
    "path": TrustKind(
        "a folder outside the data root", _inside_trusted_folder, f" (or list its folder in {TRUSTED_PATHS_VARIABLE})"
    ),
    "module": TrustKind(
        "a module to import", _registered_name, f" (or allow the file's modules: {TRUST_MODULE_FLAG})"
    ),
    "tracker": TrustKind("a tracking server or a store outside the data root", _local_tracking_store),
    "account": TrustKind("an account or project of a tracking service to log metrics under", _at_default),
    "host": TrustKind("a host other than this machine's loopback to connect to", _loopback_server),
    "servers": TrustKind("rollout servers other than the run's own to send its token to", _own_servers),
}


def trusted_only(kind: str, env: str | None = None) -> dict[str, Any]:
    """The ``json_schema_extra`` of a field that names :data:`KINDS` ``kind`` (a program, a path, ...): a stored
    config's value of it is used only when the user names it again (``env``: an environment variable that names it
    too, such as ``RAGEN_VLLM_PYTHON``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trust kind {kind!r}; known: {', '.join(KINDS)}")
    return {TRUST_MARK: {"kind": kind, "env": env}}


def trusted_entries(**kinds: str) -> dict[str, Any]:
    """The ``json_schema_extra`` of a dict field (``env.options``) whose entries of the given names name
    :data:`KINDS` kinds, e.g. ``trusted_entries(data_file="path", reward_fn="module")``: each is declared as the
    key ``<field>.<entry>`` (default: absent), held to the rule of :func:`trusted_only`."""
    unknown = sorted(set(kinds.values()) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown trust kind(s) {unknown}; known: {', '.join(KINDS)}")
    return {TRUST_MARK: {"entries": {entry: {"kind": kind, "env": None} for entry, kind in kinds.items()}}}


@dataclass(frozen=True)
class TrustedKey:
    """A declared key: its dotted name, kind, environment variable (or None) and default."""

    key: str
    kind: str
    env: str | None
    default: Any


def trusted_keys(model: type[BaseModel]) -> list[TrustedKey]:
    """Every key of ``model`` (a config tree, sections nested) declared with :func:`trusted_only`, dotted."""
    return list(_walk(model, ""))


def _walk(model: type[BaseModel], prefix: str) -> Iterator[TrustedKey]:
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra
        mark = extra.get(TRUST_MARK) if isinstance(extra, dict) else None
        if isinstance(mark, dict) and "entries" in mark:
            for entry, declared in mark["entries"].items():  # type: ignore[union-attr]
                yield TrustedKey(f"{prefix}{name}.{entry}", str(declared["kind"]), declared.get("env"), None)
        elif isinstance(mark, dict):
            default = None if field.default_factory is not None else field.default
            yield TrustedKey(prefix + name, str(mark["kind"]), mark.get("env"), default)  # type: ignore[arg-type]
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _walk(annotation, f"{prefix}{name}.")


def trusted_folders() -> list[Path]:
    """The folders :data:`TRUSTED_PATHS_VARIABLE` lists (resolved; empty entries skipped)."""
    listed = os.environ.get(TRUSTED_PATHS_VARIABLE, "")
    return [Path(part).expanduser().resolve() for part in listed.split(os.pathsep) if part.strip()]


def trusted_path(path: str, root: Path) -> bool:
    """Whether ``path`` (a folder a stored config or manifest names) lies inside the data root ``root`` or inside a
    folder of :data:`TRUSTED_PATHS_VARIABLE`, links resolved (a link in the root pointing out is outside)."""
    if "\x00" in path:
        return False
    resolved = Path(path).expanduser().resolve()
    return any(resolved.is_relative_to(folder) for folder in [Path(root).resolve(), *trusted_folders()])


class UntrustedConfigError(ConfigError):
    """A config read from the data root names a program, module, host or outside folder the user did not name:
    ``key`` (dotted), its :data:`KINDS` ``kind`` and the stored ``value``, for a command with its own way to allow
    it."""

    def __init__(self, message: str, key: str = "", kind: str = "", value: Any = None) -> None:
        super().__init__(message)
        self.key, self.kind, self.value = key, kind, value


@dataclass(frozen=True)
class StoredConfig:
    """A config tree read from a file of the data root: ``source`` names the file (relative to ``root``)."""

    tree: dict[str, Any]
    source: str
    root: Path


def named_keys(overrides: list[str]) -> set[str]:
    """The dotted keys ``key.sub=value`` overrides set (a section's key covers every key below it)."""
    keys = (text.split("=", 1)[0] for text in overrides if "=" in text)
    return {".".join(part for part in key.strip().split(".") if part) for key in keys}  # as parse_override reads it


def _value_at(config: BaseModel, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part)  # a dict's entry: None if absent
    return value


def check_stored_trust(
    config: BaseModel, stored: StoredConfig, named: set[str], trusted_kinds: frozenset[str] = frozenset()
) -> None:
    """Refuse (:class:`UntrustedConfigError`, one line naming the file, the key and how to allow it) a config built
    from ``stored`` whose value of a :func:`trusted_only` key is not harmless and came from the file: the user named
    neither the key nor a section above it (``named``), nor set the key's environment variable to the same value,
    nor allowed its kind (``trusted_kinds``: ``{"module"}`` for :data:`TRUST_MODULE_FLAG`)."""
    for declared in trusted_keys(type(config)):
        value = _value_at(config, declared.key)
        if declared.kind in trusted_kinds or KINDS[declared.kind].harmless(value, declared.default, stored.root):
            continue
        parts = declared.key.split(".")
        if any(".".join(parts[:end]) in named for end in range(1, len(parts) + 1)):
            continue  # the user's own value (the same or another): nothing of the file is used
        if declared.env and os.environ.get(declared.env) == str(value):
            continue
        if isinstance(value, BaseModel):  # a section (env.mcp): named again as its JSON, which the override reads
            value = value.model_dump(mode="json")
        shown = json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else value
        again = shlex.quote(f"{declared.key}={shown}")
        env = f" (or set {declared.env} to it)" if declared.env else ""
        raise UntrustedConfigError(
            f"{stored.source} sets {declared.key}={value!r}; a config stored in the data root does not name "
            f"{KINDS[declared.kind].names}: pass {again} again to use it{env}{KINDS[declared.kind].allow}",
            declared.key,
            declared.kind,
            value,
        )
