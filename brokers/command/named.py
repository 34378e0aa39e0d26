"""Third-party brokers by name: each preset of :mod:`.presets` as a backend of its own.

``broker: {backend: rabbitmq}`` is ``broker: {backend: command, preset: rabbitmq}`` with the
broker's name kept everywhere a result is labelled (report curves, the ranking, the run's
record), and the conformance suite run on it. Every other field of the ``command``
backend may still be given, and overrides the preset's.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from mqttbed.brokers.certificates import write_server_tls
from mqttbed.brokers.command.backend import CommandBackend
from mqttbed.brokers.command.backend import unavailable as command_unavailable
from mqttbed.brokers.command.listeners import (
    CERTIFICATE_NAMES,
    EjabberdListener,
    ListenerPlan,
    listener_config,
)
from mqttbed.brokers.command.options import Options
from mqttbed.brokers.command.presets import ACTIVEMQ_CLASSPATH, EJABBERD_LIBS, preset
from mqttbed.core.backends import AccessRecord, BackendDeclaration, BrokerAccess
from mqttbed.core.broker_access import ClientCredentials, EndpointTls, MqttProtocol
from mqttbed.core.errors import BackendError, system_deps_hint
from mqttbed.core.protocol import Endpoint


class PresetOptions(Options):
    """A preset's own backend: its options name the preset, which fills what is left out."""

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        name = cls.model_fields["preset"].default
        if isinstance(data, dict):
            return {**data, "backend": data.get("backend", name), "preset": name}
        return data


class RabbitMqOptions(PresetOptions):
    """The broker section of a campaign spec for the ``rabbitmq`` backend."""

    backend: Literal["rabbitmq"] = "rabbitmq"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["rabbitmq"] = "rabbitmq"


class NatsOptions(PresetOptions):
    """The broker section of a campaign spec for the ``nats`` backend."""

    backend: Literal["nats"] = "nats"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["nats"] = "nats"


class AmqttOptions(PresetOptions):
    """The broker section of a campaign spec for the ``amqtt`` backend."""

    backend: Literal["amqtt"] = "amqtt"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["amqtt"] = "amqtt"


class ActiveMqOptions(PresetOptions):
    """The broker section of a campaign spec for the ``activemq`` backend."""

    backend: Literal["activemq"] = "activemq"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["activemq"] = "activemq"


class EjabberdOptions(PresetOptions):
    """The broker section of a campaign spec for the ``ejabberd`` backend."""

    backend: Literal["ejabberd"] = "ejabberd"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["ejabberd"] = "ejabberd"


class AccessBackend(CommandBackend):
    """A named broker whose listener mqttbed configures from the run's
    :class:`~mqttbed.core.backends.BrokerAccess` (TLS, WebSocket, a user): a
    :class:`~mqttbed.core.backends.ConfiguresAccess` backend (see :mod:`.listeners`)."""

    def __init__(self) -> None:
        super().__init__()
        self._access = BrokerAccess()
        self._listener = listener_config(self.name)
        self._plan: ListenerPlan | None = None
        self._ca_pem: str | None = None
        self._certificate_names: list[str] = []
        self._client_credentials: ClientCredentials | None = None

    def configure_access(self, access: BrokerAccess) -> None:
        """Take the run's listener, MQTT version and user (before deploy)."""
        if self._options is not None or self._torn_down:
            raise BackendError("configure_access comes before deploy")
        self._listener.check(access)
        self._access = access

    def _configured(self) -> bool:
        return not self._access.plain or isinstance(self._listener, EjabberdListener)

    def _config_template(self, options: Options) -> str | None:
        if not self._configured():
            return options.config_template
        self._listener.check(self._access)
        if options.config_template != self._listener.plain_config:
            raise BackendError(
                f"broker.config_template is given: with broker.transport, broker.tls or "
                f"broker.auth the {self.name} backend writes its listener into its own "
                f"config; leave config_template out (or use backend command, unconfigured)")
        self._plan = self._listener.plan(self._access)
        return self._plan.config_template

    def _env_template(self, options: Options) -> dict[str, str]:
        extra = {} if self._plan is None else self._plan.env
        return {**options.env, **extra}

    def _prepare(self, directory: Path, address: str,
                 account: pwd.struct_passwd | None) -> None:
        """The run's CA, server certificate and key, and the user file: 0600, the broker's."""
        written: list[Path] = []
        if self._plan is not None and self._access.transport.tls:
            names = list(dict.fromkeys([address, *CERTIFICATE_NAMES, *(
                [self._access.tls.server_name] if self._access.tls is not None
                and self._access.tls.server_name else [])]))
            tls = write_server_tls(directory, names)
            self._ca_pem, self._certificate_names = tls.ca_pem, names
            written += [tls.ca_file, tls.cert_file, tls.key_file]
            for name, data in self._listener.tls_files(tls).items():
                written.append(_write_private(directory / name, data))
        if self._plan is not None:
            for name, text in self._plan.private_files.items():
                written.append(_write_private(directory / name,
                                              text.get_secret_value().encode()))
        for path in written:
            os.chmod(path, 0o600)
            if account is not None:
                os.chown(path, account.pw_uid, account.pw_gid)

    def _endpoint(self, address: str, port: int, options: Options) -> Endpoint:
        access = self._access
        tls = None
        if self._plan is not None and access.transport.tls:
            tls = EndpointTls(
                ca_pem=self._ca_pem,
                server_name=None if access.tls is None else access.tls.server_name,
                verify=True if access.tls is None else access.tls.verify)
        return Endpoint(host=address, port=port, transport=options.transport, tls=tls,
                        websocket_path=self._listener.websocket_path(access))

    def _credentials(self) -> ClientCredentials | None:
        # read once per deploy, not at every readiness try
        if self._client_credentials is None:
            self._client_credentials = self._access.client_credentials()
        return self._client_credentials

    def _protocol(self) -> MqttProtocol:
        return self._access.protocol

    def _clients_connect_as(self) -> str:
        auth = self._access.auth
        if auth is None:
            return super()._clients_connect_as()
        return f"mqttbed connected as user {auth.username!r} (broker.auth)"

    def _sys_topics_reachable(self) -> bool:
        # The $SYS sampler speaks plain anonymous MQTT; none of these brokers publishes
        # $SYS over MQTT anyway (brokers/thirdparty-notes.md).
        return self._plan is None

    def _access_record(self) -> AccessRecord | None:
        if self._plan is None:
            return None
        return AccessRecord.of(self._access, ca_pem=self._ca_pem,
                               certificate_names=self._certificate_names,
                               websocket_path=self._listener.websocket_path(self._access))


def _write_private(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


class RabbitMqBackend(AccessBackend):
    """RabbitMQ's MQTT plugin, a private node per run (the ``rabbitmq`` preset)."""

    name = "rabbitmq"
    options_model = RabbitMqOptions


class NatsBackend(AccessBackend):
    """NATS server's MQTT support with JetStream, per run (the ``nats`` preset)."""

    name = "nats"
    options_model = NatsOptions


class AmqttBackend(AccessBackend):
    """amqtt, the Python broker, per run (the ``amqtt`` preset)."""

    name = "amqtt"
    options_model = AmqttOptions


class ActiveMqBackend(AccessBackend):
    """Apache ActiveMQ's MQTT transport, a private JVM per run (the ``activemq`` preset)."""

    name = "activemq"
    options_model = ActiveMqOptions


class EjabberdBackend(AccessBackend):
    """ejabberd's mod_mqtt, a private Erlang node per run (the ``ejabberd`` preset)."""

    name = "ejabberd"
    options_model = EjabberdOptions


def _needs(program: str, install: str) -> str | None:
    """Why the preset cannot run here: its program is missing (and how to install it)."""
    if (reason := command_unavailable()) is not None:
        return reason
    if shutil.which(program) is None and not any(
            shutil.which(program, path=p) for p in ("/usr/sbin", "/usr/lib/rabbitmq/bin")):
        return f"{program} is not installed; {install}"
    return None


def _needs_files(files: tuple[str, ...], install: str) -> str | None:
    """Why the preset cannot run here: a file of its package is missing."""
    if (reason := command_unavailable()) is not None:
        return reason
    for file in files:
        if not glob.glob(file):
            return f"{file} is missing; {install}"
    return None


def _declare(name: str, summary: str, options: type[Options], backend: type[CommandBackend],
             program: str, install: str, *,
             unavailable: Callable[[], str | None] | None = None,
             example: Callable[[], AbstractContextManager[dict[str, Any]]] | None = None,
             ) -> BackendDeclaration:
    return BackendDeclaration(
        name=name, summary=summary, options=options,
        backend=f"{__name__}:{backend.__name__}",
        unavailable=unavailable or (lambda: _needs(program, install)),
        features=preset(name).features, example_options=example)


# The environment variable ejabberd's example run reads its password from.
EXAMPLE_PASSWORD_ENV = "MQTTBED_EJABBERD_EXAMPLE_PASSWORD"


@contextmanager
def _ejabberd_example() -> Iterator[dict[str, Any]]:
    """ejabberd refuses every CONNECT without a password: its example run has a user,
    whose random password lives in this process's environment while the example runs."""
    previous = os.environ.get(EXAMPLE_PASSWORD_ENV)
    os.environ[EXAMPLE_PASSWORD_ENV] = secrets.token_urlsafe(16)
    try:
        yield {"auth": {"username": "mqttbed", "password_env": EXAMPLE_PASSWORD_ENV}}
    finally:
        if previous is None:
            os.environ.pop(EXAMPLE_PASSWORD_ENV, None)
        else:
            os.environ[EXAMPLE_PASSWORD_ENV] = previous


RABBITMQ = _declare("rabbitmq", "RabbitMQ's MQTT plugin, a private node per run",
                    RabbitMqOptions, RabbitMqBackend, "rabbitmq-server",
                    system_deps_hint("brokers", "rabbitmq-server"))
NATS = _declare("nats", "NATS server's MQTT support (JetStream), per run", NatsOptions,
                NatsBackend, "nats-server", system_deps_hint("brokers", "nats-server"))
AMQTT = _declare("amqtt", "amqtt, the asyncio Python broker, per run", AmqttOptions,
                 AmqttBackend, str(Path(sys.executable).parent / "amqtt"),
                 "pip install 'mqttbed[brokers]' (`make install` does)")
# ActiveMQ runs on the Java runtime the brokers profile brings too (/usr/bin/java).
ACTIVEMQ_INSTALL = system_deps_hint("brokers",
                                    "activemq libmqtt-client-java default-jre-headless")
ACTIVEMQ = _declare(
    "activemq", "Apache ActiveMQ's MQTT transport, a private JVM per run", ActiveMqOptions,
    ActiveMqBackend, "java", ACTIVEMQ_INSTALL,
    unavailable=lambda: _needs_files(
        ("/usr/bin/java", "/usr/share/activemq/bin/activemq.jar",
         *ACTIVEMQ_CLASSPATH.split(":")), ACTIVEMQ_INSTALL))
EJABBERD = _declare(
    "ejabberd", "ejabberd's mod_mqtt (MQTT 5), a private Erlang node per run",
    EjabberdOptions, EjabberdBackend, "erl", system_deps_hint("brokers", "ejabberd"),
    unavailable=lambda: _needs_files(
        ("/usr/bin/erl", f"{EJABBERD_LIBS}/ejabberd-*/ebin/mod_mqtt.beam"),
        system_deps_hint("brokers", "ejabberd")),
    example=_ejabberd_example)
