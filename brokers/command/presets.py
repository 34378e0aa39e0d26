"""Named brokers for the ``command`` backend: ``broker: {backend: command, preset: NAME}``.

A preset fills a command broker's fields (command, config template, version command,
environment, user, readiness timeout, features); fields given in the spec override the
preset's (``env`` key by key).

The presets are third-party brokers started as private instances: ``rabbitmq`` (RabbitMQ's
MQTT plugin, Debian's ``rabbitmq-server``), ``nats`` (NATS server's MQTT support, Debian's
``nats-server``), ``amqtt`` (the Python broker, mqttbed's ``brokers`` extra), ``activemq``
(Debian's ``activemq`` 5.17 with ``libmqtt-client-java``) and ``ejabberd`` (Debian's
``ejabberd`` 23.01, its ``mod_mqtt``). Each config is a base and a plain listener; a named
backend with ``broker.transport``/``tls``/``auth`` writes its own listener instead
(:mod:`.listeners`).
"""

from __future__ import annotations

import shlex
import sys
import sysconfig
from pathlib import Path

from pydantic import ConfigDict, Field

from mqttbed.brokers.command.templates import TemplateChecks
from mqttbed.core.backends import BrokerFeatures
from mqttbed.core.broker_access import ListenerTransport


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

# The part of each preset's config that does not depend on the listener: with
# broker.transport, broker.tls or broker.auth, the backend (brokers/command/listeners.py)
# appends its own listener lines to it instead of the plain ones.
RABBITMQ_BASE_CONFIG = """\
# rabbitmq.conf rendered by mqttbed into {config}
# MQTT only: no AMQP listener (it would take port 5672 from any other RabbitMQ).
listeners.tcp = none
log.console = true
log.console.level = info
log.console.use_colors = off
log.file = false
"""
RABBITMQ_PLAIN_LISTENER = """\
mqtt.listeners.tcp.1 = 127.0.0.1:{port}
mqtt.allow_anonymous = true
"""

RABBITMQ = CommandPreset(
    # /usr/sbin/rabbitmq-server is Debian's wrapper: it su's to rabbitmq and logs to
    # /var/log/rabbitmq; the script it calls runs the broker in the foreground as it is.
    command=shlex.join(["/bin/sh", "-c", _RABBITMQ_LAUNCH]),
    config_template=RABBITMQ_BASE_CONFIG + RABBITMQ_PLAIN_LISTENER,
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
        # retained: it keeps them, but sends them to a subscription of the exact topic
        # only; a wildcard filter, which workload.retained subscribes with, gets none
        qos=frozenset({0, 1}), retained=False, wildcards=True,
        protocols=frozenset({"3.1.1"}), transports=frozenset(ListenerTransport), auth=True,
        note="rabbitmq_mqtt 3.10: a QoS 2 SUBSCRIBE is granted QoS 1 and a QoS 2 PUBLISH is "
             "delivered at QoS 1; retained messages reach a subscription of their exact "
             "topic only (rt/y/1 got its value; rt/y/# and rt/+/1 got none), so retained "
             "state under wildcards is not declared; no $SYS topics; payloads of 64 MiB "
             "delivered; MQTT 3.1 "
             "and 3.1.1 only (MQTT 5 came in RabbitMQ 3.13); ws and wss through its "
             "rabbitmq_web_mqtt plugin; no shared subscriptions: members of "
             "$share/g-0/sh/x received nothing of a QoS 1 stream to sh/x"),
)

NATS_BASE_CONFIG = """\
# nats-server.conf rendered by mqttbed into {config}
# MQTT needs JetStream (sessions, retained messages, QoS 1), and JetStream a server name.
server_name: mqttbed_{port}
# NATS' own client port: any free one (the agents speak MQTT).
listen: 127.0.0.1:-1
jetstream {
    store_dir: "{dir}/jetstream"
}
"""
NATS_PLAIN_LISTENER = """\
mqtt {
    listen: 127.0.0.1:{port}
}
"""

NATS = CommandPreset(
    command="nats-server -c {config}",
    config_template=NATS_BASE_CONFIG + NATS_PLAIN_LISTENER,
    version_command="nats-server --version",
    ready_timeout_s=30.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1}), retained=True, wildcards=True,
        protocols=frozenset({"3.1.1"}),
        transports=frozenset({ListenerTransport.TCP, ListenerTransport.TLS}), auth=True,
        note="nats-server 2.9: a QoS 2 SUBSCRIBE is granted QoS 1 and a QoS 2 PUBLISH closes "
             "the connection; no $SYS topics over MQTT; payloads of 16 MiB delivered, a "
             "64 MiB one cuts the subscriber off (slow consumer: 64 MiB pending); MQTT "
             "3.1.1 only; no MQTT over WebSocket (its websocket block is NATS' protocol); "
             "no shared subscriptions: members of $share/g-0/sh/x received nothing of a "
             "QoS 1 stream to sh/x"),
)

# amqtt is a Python package (the `brokers` extra): its console script sits beside the
# interpreter running mqttbed, which need not be on PATH.
_AMQTT = Path(sys.executable).parent / "amqtt"

AMQTT_BASE_CONFIG = """\
# amqtt broker config rendered by mqttbed into {config}
"""
# Left out on purpose: the packet logger (a log line per packet) and the $SYS plugin
# (periodic publishes; after a $SYS/# subscription amqtt 0.12.1 was seen to hand a
# retained $SYS message to a client that never subscribed to it).
AMQTT_PLAIN_LISTENER = """\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
# Anonymous clients only.
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""

AMQTT = CommandPreset(
    command=f"{shlex.quote(str(_AMQTT))} -c {{config}}",
    config_template=AMQTT_BASE_CONFIG + AMQTT_PLAIN_LISTENER,
    version_command=f"{shlex.quote(str(_AMQTT))} --version",
    ready_timeout_s=30.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1, 2}), retained=True, wildcards=True,
        protocols=frozenset({"3.1.1"}), transports=frozenset(ListenerTransport), auth=True,
        persistent_sessions=False,
        note="amqtt 0.12: MQTT 3.1.1 with QoS 0, 1, 2; $SYS only with its BrokerSysPlugin "
             "(not loaded); payloads of 200 MiB delivered; no shared subscriptions: "
             "members of $share/g-0/sh/x received nothing of a QoS 1 stream to sh/x; no "
             "persistent sessions: a clean-session-0 subscriber back after 0.8 s (socket "
             "dropped or DISCONNECT) got CONNACK session present 0 and none of the QoS 1 "
             "messages sent while it was away"),
)

# -- ActiveMQ ------------------------------------------------------------------------------
# Debian's activemq 5.17 runs as a plain JVM here (no init script, no /var/lib/activemq):
# the launch shell writes a log4j config into the run's directory (log4j 1.2 takes none
# from the command line), then becomes the JVM. Debian builds ActiveMQ without its MQTT
# codec's library on the class path: every MQTT connection fails with
# NoClassDefFoundError org/fusesource/mqtt/codec/... until libmqtt-client-java's jars are
# added (activemq.classpath), and without activemq-http, so it has no ws transport.
ACTIVEMQ_CLASSPATH = ":".join(f"/usr/share/java/{jar}.jar" for jar in (
    "mqtt-client", "hawtdispatch", "hawtdispatch-transport"))
_ACTIVEMQ_LAUNCH = """\
cat > "$0/log4j.properties" <<'LOG4J'
log4j.rootLogger=INFO, console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d %-5p [%c{1}] %m%n
LOG4J
exec java -Xms64m -Xmx512m -Djava.io.tmpdir="$0" \
    -Dlog4j.configuration="file:$0/log4j.properties" \
    -Dactivemq.classpath="$1" -Dactivemq.home=/usr/share/activemq \
    -Dactivemq.base="$0" -Dactivemq.conf="$0" -Dactivemq.data="$0/data" \
    -jar /usr/share/activemq/bin/activemq.jar start "xbean:file:$2"
"""
ACTIVEMQ_CONFIG_HEAD = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- activemq.xml rendered by mqttbed into {config} -->
<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans
         http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
         http://activemq.apache.org/schema/core
         http://activemq.apache.org/schema/core/activemq-core.xsd">
"""
# Not persistent (a run measures the broker's delivery, not its disk), no JMX, no
# advisory topics (messages of its own on every connection).
ACTIVEMQ_BROKER_OPEN = """\
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="mqttbed-{port}"
          useJmx="false" persistent="false" advisorySupport="false"
          schedulerSupport="false" dataDirectory="{dir}/data">
"""
ACTIVEMQ_CONFIG_TAIL = """\
  </broker>
</beans>
"""
ACTIVEMQ_PLAIN_LISTENER = """\
    <transportConnectors>
      <transportConnector name="mqtt" uri="mqtt+nio://127.0.0.1:{port}"/>
    </transportConnectors>
"""

ACTIVEMQ = CommandPreset(
    command=shlex.join(["/bin/sh", "-c", _ACTIVEMQ_LAUNCH, "{dir}", ACTIVEMQ_CLASSPATH,
                        "{config}"]),
    config_template=(ACTIVEMQ_CONFIG_HEAD + ACTIVEMQ_BROKER_OPEN + ACTIVEMQ_PLAIN_LISTENER
                     + ACTIVEMQ_CONFIG_TAIL),
    version_command="dpkg-query -W activemq",
    ready_timeout_s=60.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1, 2}), retained=True, wildcards=True,
        protocols=frozenset({"3.1.1"}),
        transports=frozenset({ListenerTransport.TCP, ListenerTransport.TLS}), auth=True,
        note="ActiveMQ 5.17 (Debian 12): MQTT 3.1 and 3.1.1; Debian leaves out activemq-http, "
             "so no ws or wss transport; no shared subscriptions: members of "
             "$share/g-0/sh/x received nothing of a QoS 1 stream to sh/x"),
)

# -- ejabberd ------------------------------------------------------------------------------
# An Erlang node of its own per run, started without ejabberdctl (which su's to the
# ejabberd account and reads /etc/ejabberd): -dist_listen false, so it registers with no
# epmd and needs no distribution port; -start_epmd false, so none is left behind.
# mod_mqtt authenticates every client: a CONNECT without a password is refused (unless a
# TLS client certificate names the user), so a run on ejabberd needs broker.auth.
EJABBERD_LIBS = f"/usr/lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}"
# ejabberd reads a config as YAML only by its name (.yml); mqttbed writes {config}.
_EJABBERD_LAUNCH = """\
ln -sf "$1" "$0/ejabberd.yml"
export EJABBERD_CONFIG_PATH="$0/ejabberd.yml"
exec erl -sname "mqttbed-$2@localhost" -noinput -start_epmd false -dist_listen false \\
    +K true -mnesia dir "\\"$0/spool\\"" -s ejabberd
"""
EJABBERD_BASE_CONFIG = """\
# ejabberd.yml rendered by mqttbed into {config}
hosts:
  - localhost
loglevel: info
log_rotate_count: 0
"""
EJABBERD_MODULES = """\
modules:
  mod_mqtt: {}
"""
EJABBERD = CommandPreset(
    command=shlex.join(["/bin/sh", "-c", _EJABBERD_LAUNCH, "{dir}", "{config}", "{port}"]),
    # Without broker.auth every CONNECT is refused; the listener's lines come from the
    # backend (brokers/command/listeners.py), which refuses a run without broker.auth.
    config_template=EJABBERD_BASE_CONFIG + """\
auth_method: [anonymous]
listen:
  -
    port: {port}
    ip: 127.0.0.1
    module: mod_mqtt
""" + EJABBERD_MODULES,
    version_command="dpkg-query -W ejabberd",
    env={
        "HOME": "{dir}",   # Erlang's cookie
        "EJABBERD_LOG_PATH": "{dir}/ejabberd.log",
        "ERL_LIBS": EJABBERD_LIBS,
        "ERL_CRASH_DUMP": "{dir}/erl_crash.dump",
    },
    ready_timeout_s=60.0,
    features=BrokerFeatures(
        qos=frozenset({0, 1, 2}), retained=True, wildcards=True,
        protocols=frozenset({"3.1.1", "5"}),
        transports=frozenset({ListenerTransport.TCP, ListenerTransport.TLS}), auth=True,
        note="ejabberd 23.01 mod_mqtt: MQTT 3.1.1 and 5; every client must send a user name "
             "and password (broker.auth); no MQTT over WebSocket; no shared "
             "subscriptions: at MQTT 5 its DISCONNECT says 0x9E Shared Subscriptions not "
             "supported, at 3.1.1 it closes the connection"),
)

# name -> preset; see the module docstring.
PRESETS: dict[str, CommandPreset] = {
    "rabbitmq": RABBITMQ,
    "nats": NATS,
    "amqtt": AMQTT,
    "activemq": ACTIVEMQ,
    "ejabberd": EJABBERD,
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
