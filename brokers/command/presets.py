"""Named brokers for the ``command`` backend: ``broker: {backend: command, preset: NAME}``.

A preset fills a command broker's fields (command, config template, version command,
environment, user, readiness timeout, features); fields given in the spec override the
preset's (``env`` key by key).

The presets are third-party brokers started as private instances: ``rabbitmq`` (RabbitMQ's
MQTT plugin, Debian's ``rabbitmq-server``), ``nats`` (NATS server's MQTT support, Debian's
``nats-server``) and ``amqtt`` (the Python broker, mqttbed's ``brokers`` extra).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from pydantic import ConfigDict, Field

from mqttbed.brokers.command.templates import TemplateChecks
from mqttbed.core.backends import BrokerFeatures


class CommandPreset(TemplateChecks):
    """A broker the ``command`` backend knows by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: str = Field(description="the command line, with {port}, {config}, {dir}")
    config_template: str | None = Field(None, description="written to {config}")
    version_command: str | None = Field(None, description="its output's first line is "
                                                          "the version")
    env: dict[str, str] = Field(default_factory=dict, description="environment; values "
                                                                   "take the placeholders")
    user: str | None = Field(None, description="run as this user")
    ready_timeout_s: float = Field(30.0, gt=0, description="how long it may take to answer")
    features: BrokerFeatures = Field(default_factory=BrokerFeatures,
                                     description="what the broker delivers")


# -- third-party brokers ------------------------------------------------------------------
# Each runs as a private instance: config, data and logs in the run's directory, listening
# on 127.0.0.1:{port} only, nothing read from /etc or written to /var. What each delivers
# was measured over MQTT 3.1.1 with paho-mqtt (brokers/thirdparty-notes.md).

# RabbitMQ's boot asks an epmd (the Erlang port mapper) whether its node name is taken.
# An epmd started by Erlang itself puts itself in the background in a session of its own
# and outlives the broker, so this one is started here: in the broker's process group (a
# teardown stops it too), on a random port below the kernel's ephemeral range (where
# {port} comes from), another port tried while the chosen one is taken. Then the broker
# replaces this shell.
_RABBITMQ_LAUNCH = """\
started=
for _ in 1 2 3 4 5 6 7 8; do
    ERL_EPMD_PORT=$(shuf -i 20000-32767 -n 1)
    epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 &
    epmd_pid=$!
    while kill -0 "$epmd_pid" 2>/dev/null; do
        if epmd -port "$ERL_EPMD_PORT" -names >/dev/null 2>&1; then started=yes; break 2; fi
        sleep 0.02
    done
done
if [ -z "$started" ]; then echo "mqttbed: no private epmd would start" >&2; exit 1; fi
export ERL_EPMD_PORT
exec /usr/lib/rabbitmq/bin/rabbitmq-server
"""

RABBITMQ = CommandPreset(
    # /usr/sbin/rabbitmq-server is Debian's wrapper: it su's to rabbitmq and logs to
    # /var/log/rabbitmq; the script it calls runs the broker in the foreground as it is.
    command=shlex.join(["/bin/sh", "-c", _RABBITMQ_LAUNCH]),
    config_template="""\
# rabbitmq.conf rendered by mqttbed into {config}
# MQTT only: no AMQP listener (it would take port 5672 from any other RabbitMQ).
listeners.tcp = none
mqtt.listeners.tcp.1 = 127.0.0.1:{port}
mqtt.allow_anonymous = true
log.console = true
log.console.level = info
log.console.use_colors = off
log.file = false
""",
    # Asking rabbitmqctl would start an Erlang node (and a stray epmd) just for this.
    version_command="dpkg-query -W rabbitmq-server",
    env={
        # Erlang keeps its cookie in $HOME: a fresh one per run, not /var/lib/rabbitmq's.
        "HOME": "{dir}",
        "RABBITMQ_NODENAME": "mqttbed-{port}@localhost",
        # Never source /etc/rabbitmq/rabbitmq-env.conf (the file named here is not written).
        "RABBITMQ_CONF_ENV_FILE": "{dir}/rabbitmq-env.conf",
        "RABBITMQ_CONFIG_FILE": "{config}",
        "RABBITMQ_ADVANCED_CONFIG_FILE": "{dir}/advanced.config",
        "RABBITMQ_ENABLED_PLUGINS": "rabbitmq_mqtt",
        "RABBITMQ_ENABLED_PLUGINS_FILE": "{dir}/enabled_plugins",
        "RABBITMQ_MOTD_FILE": "{dir}/motd",
        "RABBITMQ_MNESIA_BASE": "{dir}/mnesia",
        "RABBITMQ_LOG_BASE": "{dir}/log",
        "ERL_CRASH_DUMP": "{dir}/erl_crash.dump",
        # The node never listens for other Erlang nodes (-dist_listen false), so it needs
        # no distribution port of its own: RabbitMQ only checks that the one it is told
        # is free before the MQTT listener takes it. -start_epmd false: no Erlang VM of
        # this run ever puts an epmd in the background (the launch above started one).
        "RABBITMQ_DIST_PORT": "{port}",
        "ERL_AFLAGS": "-start_epmd false -dist_listen false",
    },
    # Debian's package makes its files that account's; mqttbed makes the run's dir too.
    user="rabbitmq",
    # 7-12 s here: its MQTT plugin alone waits 3-6 s (at random) for cluster peers.
    ready_timeout_s=90.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1}), retained=True, wildcards=True,
        note="rabbitmq_mqtt 3.10: a QoS 2 SUBSCRIBE is granted QoS 1 and a QoS 2 PUBLISH is "
             "delivered at QoS 1; no $SYS topics; payloads of 64 MiB delivered"),
)

NATS = CommandPreset(
    command="nats-server -c {config}",
    config_template="""\
# nats-server.conf rendered by mqttbed into {config}
# MQTT needs JetStream (sessions, retained messages, QoS 1), and JetStream a server name.
server_name: mqttbed_{port}
# NATS' own client port: any free one (the agents speak MQTT).
listen: 127.0.0.1:-1
jetstream {
    store_dir: "{dir}/jetstream"
}
mqtt {
    listen: 127.0.0.1:{port}
}
""",
    version_command="nats-server --version",
    ready_timeout_s=30.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1}), retained=True, wildcards=True,
        note="nats-server 2.9: a QoS 2 SUBSCRIBE is granted QoS 1 and a QoS 2 PUBLISH closes "
             "the connection; no $SYS topics over MQTT; payloads of 16 MiB delivered, a "
             "64 MiB one cuts the subscriber off (slow consumer: 64 MiB pending)"),
)

# amqtt is a Python package (the `brokers` extra): its console script sits beside the
# interpreter running mqttbed, which need not be on PATH.
_AMQTT = Path(sys.executable).parent / "amqtt"

AMQTT = CommandPreset(
    command=f"{shlex.quote(str(_AMQTT))} -c {{config}}",
    config_template="""\
# amqtt broker config rendered by mqttbed into {config}
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
# Anonymous clients only. Left out on purpose: the packet logger (a log line per packet)
# and the $SYS plugin (periodic publishes; after a $SYS/# subscription amqtt 0.12.1 was
# seen to hand a retained $SYS message to a client that never subscribed to it).
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
""",
    version_command=f"{shlex.quote(str(_AMQTT))} --version",
    ready_timeout_s=30.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1, 2}), retained=True, wildcards=True,
        note="amqtt 0.12: MQTT 3.1.1 with QoS 0, 1, 2; $SYS only with its BrokerSysPlugin "
             "(not loaded); payloads of 200 MiB delivered"),
)

# name -> preset; see the module docstring.
PRESETS: dict[str, CommandPreset] = {
    "rabbitmq": RABBITMQ,
    "nats": NATS,
    "amqtt": AMQTT,
}


def preset_names() -> list[str]:
    """The names of the known presets, sorted."""
    return sorted(PRESETS)


def preset(name: str) -> CommandPreset:
    """The preset called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(preset_names()) or "none yet"
        raise ValueError(f"unknown preset {name!r}; known presets: {known}") from None
