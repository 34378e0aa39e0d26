"""What a run asks of its broker and gives its clients, read when the run starts.

The spec names where secrets are (``broker.auth.password_file`` / ``password_env``,
``broker.tls.key_file``), never what they are; each run reads them afresh, so a password
changed between runs is the one used, and a file that vanished fails the run naming its
path. What is read lives in the :class:`BrokerAccess` handed to the backend and in the
assignments' :class:`ClientCredentials`, whose secrets are masked in every dump but the
agent protocol's commands (:func:`mqttbed.core.broker_access.reveal_secrets_context`);
the credentials are read by :meth:`BrokerAccess.client_credentials`, as the backends'
own probes read them.
"""

from __future__ import annotations

from mqttbed.campaigns.spec import CampaignSpec
from mqttbed.core.backends import BrokerAccess
from mqttbed.core.broker_access import MASK, ClientCredentials


def run_access(spec: CampaignSpec) -> BrokerAccess:
    """The run's access: listener, MQTT version, TLS and users, the password read now.

    Raises :class:`~mqttbed.core.broker_access.SecretUnavailable` naming the file or
    variable that cannot be read."""
    broker = spec.broker
    return BrokerAccess(transport=broker.resolved_transport(), protocol=spec.workload.protocol,
                        tls=broker.tls, auth=broker.auth,
                        password=None if broker.auth is None else broker.auth.read_password())


# A shorter secret is left as it is: masking every "ab" in a reason would garble it, and
# nothing of mqttbed's own writes a password into one (this is a second line of defence).
MIN_CONCEALED_CHARS = 4


def secret_values(access: BrokerAccess, credentials: ClientCredentials | None) -> list[str]:
    """The run's secret values (password, client key), for :func:`conceal`."""
    found = [access.password] if access.password is not None else []
    if credentials is not None and credentials.key_pem is not None:
        found.append(credentials.key_pem)
    return [value for secret in found if len(value := secret.get_secret_value().strip())
            >= MIN_CONCEALED_CHARS]


def conceal(text: str, secrets: list[str]) -> str:
    """``text`` (a run's reason) with each of ``secrets`` masked: a backend's or an agent's
    error that quotes one (a command line, a config) is stored without it."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
