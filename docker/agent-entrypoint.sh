#!/bin/sh
# The agent image's entry point: `mqttbed agent ARGS...`, its token read from a file into
# MQTTBED_AGENT_TOKEN (unless that is set): a compose secret, mounted at
# /run/secrets/mqttbed_agent_token, or the file AGENT_TOKEN_FILE names. The token is
# never in the image and never on a command line, where ps would show it. Runs the same
# outside a container, with mqttbed on PATH.
set -eu
token_file="${AGENT_TOKEN_FILE:-/run/secrets/mqttbed_agent_token}"
if [ -z "${MQTTBED_AGENT_TOKEN:-}" ] && [ -e "$token_file" ]; then
    if [ ! -r "$token_file" ]; then
        # A compose secret from a file keeps the file's owner and mode on the host.
        echo "mqttbed-agent-entrypoint: cannot read the token file $token_file as uid" \
             "$(id -u); make it readable to that user (chmod 644, or chown it)" >&2
        exit 2
    fi
    MQTTBED_AGENT_TOKEN="$(tr -d '[:space:]' < "$token_file")"
    if [ -z "$MQTTBED_AGENT_TOKEN" ]; then
        echo "mqttbed-agent-entrypoint: the token file $token_file is empty; put an agent" \
             "token in it (mqttbed token create --name NAME --role agent)" >&2
        exit 2
    fi
    export MQTTBED_AGENT_TOKEN
fi
exec mqttbed agent "$@"
