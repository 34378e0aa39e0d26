#!/bin/sh
# The controller image's entry point: `mqttbed ARGS...` (default: serve), with
# MQTTBED_LAB_ADDRESS set to this machine's address unless it is given. Spark's executors
# connect back to the driver there, and the agents and brokers the controller starts reach
# it there: the default, loopback, would keep a Spark worker in another container from
# reaching the driver. Runs the same outside a container, with mqttbed and python on PATH.
set -eu
if [ -z "${MQTTBED_LAB_ADDRESS:-}" ]; then
    # In a container the host name resolves to the container's address on its network.
    if ! address="$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')"
    then
        echo "mqttbed-controller-entrypoint: cannot resolve this host's name to an address;" \
             "set MQTTBED_LAB_ADDRESS to the controller's IP on the lab network" >&2
        exit 2
    fi
    MQTTBED_LAB_ADDRESS="$address"
    export MQTTBED_LAB_ADDRESS
fi
exec mqttbed "$@"
