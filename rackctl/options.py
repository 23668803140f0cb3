"""The broker connection options every talking verb of rackctl takes, declared once.

`connection_options` is a decorator for a typer command whose function takes a keyword
``conn: Connection``: it adds the connection options (``--config``, ``--host``, ``--port``,
``--protocol``, ``--username``, ``--ca-file``, ``--cert-file``, ``--key-file``, ``--site``,
``--rack``, ``--topic-root`` and, for verbs that send commands, ``--user``, ``--timeout``;
``--connect-timeout``) to the command's signature (typer reads ``__signature__`` and the
annotations), and hands the function one `Connection` with the values given. Their help
texts name the environment variables (`rackctl.client.load_client_settings` reads them) and
are the same in every verb. typer has no option groups of its own (a dataclass of options),
hence this decorator rather than a dozen parameters repeated per verb.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

__all__ = ["CONNECTION_PARAMS", "NO_OPTIONS", "Connection", "connection_options"]

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="TOML file of connection settings [RACKCTL_CONFIG; default "
    "~/.config/rackctl/config.toml if it exists]")]
HostOpt = Annotated[str | None, typer.Option(help="broker host [RACKCTL_HOST]")]
PortOpt = Annotated[int | None, typer.Option(help="broker port [RACKCTL_PORT]")]
ProtocolOpt = Annotated[str | None, typer.Option(
    help="MQTT 5, 3.1.1 or auto (v5, else 3.1.1; the default) [RACKCTL_PROTOCOL]")]
UsernameOpt = Annotated[str | None, typer.Option(
    help="broker username [RACKCTL_USERNAME]; password only from $RACKCTL_PASSWORD")]
CaOpt = Annotated[Path | None, typer.Option(help="CA file, enables TLS [RACKCTL_CA_FILE]")]
CertOpt = Annotated[Path | None, typer.Option(help="client certificate [RACKCTL_CERT_FILE]")]
KeyOpt = Annotated[Path | None, typer.Option(help="client key [RACKCTL_KEY_FILE]")]
SiteOpt = Annotated[str | None, typer.Option(help="topic level <site> [RACKCTL_SITE]")]
RackOpt = Annotated[str | None, typer.Option(help="topic level <rack> [RACKCTL_RACK]")]
RootOpt = Annotated[str | None, typer.Option(help="topic root [RACKCTL_TOPIC_ROOT]")]
UserOpt = Annotated[str | None, typer.Option(
    help="cmd/<user> level (default: the username) [RACKCTL_USER]")]
TimeoutOpt = Annotated[float | None, typer.Option(
    "--timeout", help="seconds to wait for the reply [RACKCTL_TIMEOUT_S]")]
ConnectTimeoutOpt = Annotated[float | None, typer.Option(
    "--connect-timeout", help="seconds to wait for the broker [RACKCTL_CONNECT_TIMEOUT_S]")]

CONNECTION_PARAMS: dict[str, Any] = {
    "config": ConfigOpt, "host": HostOpt, "port": PortOpt, "protocol": ProtocolOpt,
    "username": UsernameOpt, "ca_file": CaOpt, "cert_file": CertOpt, "key_file": KeyOpt,
    "site": SiteOpt, "rack": RackOpt, "topic_root": RootOpt, "user": UserOpt,
    "timeout": TimeoutOpt, "connect_timeout": ConnectTimeoutOpt,
}
"""Each connection option's parameter name and annotated type, in the order --help lists them."""

REPLY_PARAMS = ("user", "timeout")
"""The options only verbs that send a command and wait for its reply take."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Connection:
    """The connection options one invocation was given (None: not given; the settings file,
    the environment and the defaults then decide, `rackctl.client.load_client_settings`)."""

    config: Path | None = None
    host: str | None = None
    port: int | None = None
    protocol: str | None = None
    username: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    site: str | None = None
    rack: str | None = None
    topic_root: str | None = None
    user: str | None = None
    timeout: float | None = None
    connect_timeout: float | None = None

    def settings(self, *, rack_default: str | None = None) -> Any:
        """The verb's `rackctl.client.ClientSettings` (``rack_default``: the rack level when
        ``--rack`` is not given, e.g. ``rlc`` for rlc's verbs).

        Exits 2 (usage) with the reason on bad settings or a missing TLS file."""
        from rackctl.cli import _client_settings

        return _client_settings(
            self.config, host=self.host, port=self.port, protocol=self.protocol,
            username=self.username, ca_file=self.ca_file, cert_file=self.cert_file,
            key_file=self.key_file, site=self.site, rack=self.rack or rack_default,
            topic_root=self.topic_root, user=self.user, timeout_s=self.timeout,
            connect_timeout_s=self.connect_timeout)


NO_OPTIONS = Connection()
"""No connection option given: the default of a verb's ``conn`` parameter (the decorator
always passes the options given; a direct call in a test may leave it)."""


def connection_options(*, replies: bool = True, rack: Any = None) -> Callable[[F], F]:
    """Add the connection options to a typer command taking ``conn: Connection``.

    ``replies``: the verb sends a command and waits for its reply (adds ``--user`` and
    ``--timeout``); ``rack``: another annotated type for ``--rack`` (its help text).

    Raises:
        TypeError: the function has no ``conn`` parameter, or one of its own parameters has
            a connection option's name.
    """
    names = [n for n in CONNECTION_PARAMS if replies or n not in REPLY_PARAMS]

    def wrap(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)  # the verbs' modules use string annotations
        if "conn" not in sig.parameters:
            raise TypeError(f"{func.__name__}: connection_options needs a 'conn' parameter")
        clash = [n for n in names if n in sig.parameters]
        if clash:
            raise TypeError(f"{func.__name__}: parameters {clash} are connection options")
        own = [p for n, p in sig.parameters.items() if n != "conn"]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=rack if n == "rack" and rack is not None
                                   else CONNECTION_PARAMS[n]) for n in names]
        kinds = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            conn = Connection(**{n: kwargs.pop(n) for n in names if n in kwargs})
            return func(conn=conn, **kwargs)

        command.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=kinds + added)
        hints = {p.name: p.annotation for p in own}
        hints.update({p.name: p.annotation for p in added})
        command.__annotations__ = hints
        return command  # type: ignore[return-value]

    return wrap
