"""``ragen env serve``: an environment served over HTTP (OpenEnv's protocol) for runs to play with ``env.remote``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import typer

from ragen_cli.common import console, fail, shown, warn

env_app = typer.Typer(
    help="Environments over HTTP: serve one (OpenEnv's protocol) for runs to play with env.remote=URL.",
    add_completion=False,
    no_args_is_help=True,
)


def env_options(given: list[str]) -> dict[str, Any]:
    """``key=value`` options (YAML values, as ``env.options.key=value`` overrides read them) as a dict; a malformed
    one is one line."""
    from ragen_core.config import ConfigError
    from ragen_core.config.yaml_text import load_yaml

    options: dict[str, Any] = {}
    for text in given:
        key, equals, value = text.partition("=")
        if not equals or not key.strip() or not key.strip().isidentifier():
            fail(f"--option {shown(text)}: write key=value (e.g. --option size=6)")
        try:  # the reader of config files and overrides: bounded, no key given twice
            options[key.strip()] = load_yaml(value, f"the value of --option {shown(text)}") if value.strip() else ""
        except ConfigError as exc:
            fail(str(exc))
    return options


@env_app.command("serve")
def env_serve(
    name: str = typer.Argument(
        ..., help="The env: a registered name (frozen_lake), an installed distribution's, or package.module:Class."
    ),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (beyond loopback: reachable from elsewhere)."
    ),
    option: list[str] | None = typer.Option(
        None, "--option", "-o", help="An env option key=value (a YAML value, as env.options.key=value); repeatable."
    ),
    max_episodes: int = typer.Option(
        2048,
        "--max-episodes",
        help="Episodes held at once (env instances); beyond, the least recently used is let go (a run's client "
        "releases its own, and rebuilds one let go).",
    ),
) -> None:
    """Serve an env over HTTP, OpenEnv's protocol (/reset, /step, /state, /health, /schema, /ws): a fresh env per
    episode, many episodes at once. A run plays it with env.remote=URL (its env.name and env.options the served
    ones). It prints its URL; Ctrl-C stops it."""
    from ragen_core.envs.serving import EnvServer, serve
    from ragen_view.access import is_loopback_host
    from ragen_view.server import ViewError, bind

    options = env_options(option or [])
    if max_episodes < 1:
        fail(f"--max-episodes must be at least 1, not {max_episodes}")
    try:
        server = EnvServer(name, options, max_episodes)
    except ValueError as exc:  # unknown, not importable, no TextEnv, an option it does not take
        fail(str(exc))
    try:
        binding = bind(host, port)
    except ViewError as exc:
        fail(str(exc))
    url = f"http://{urlsplit(binding.url).netloc}"  # as clients name it (this machine's name for 0.0.0.0)
    if not binding.loopback:  # said before the URL, which tells whoever waits for it that the server is up
        warn(f"listening on {host}: anyone who can reach this machine can play this env and run its code")
    console.print(
        f"ragen env serve: {url}  ({shown(name)}; a run plays it with env.remote={url}; Ctrl-C stops it)",
        highlight=False,
        soft_wrap=True,
    )
    serve(server, binding.sock, is_loopback_host if binding.loopback else None)  # loopback: no DNS rebinding


__all__ = ["env_app", "env_options"]
