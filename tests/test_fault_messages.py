"""How a run's reason reads when its broker fails (unit: no processes)."""

from __future__ import annotations

from mqttbed.controller.engine import broker_died


def test_a_broker_killed_by_a_signal_reads_broker_died_with_the_signal_first():
    health = ("broker mosquitto (pid 41) exited with code -9 (killed by SIGKILL); "
              "last log lines:\nstarting")
    assert broker_died(health) == f"broker died: SIGKILL; {health}"


def test_a_broker_that_exited_reads_broker_died_with_its_exit_code():
    health = "mosquitto of broker 1 (pid 7) exited with code 3; last log lines:\n"
    assert broker_died(health) == f"broker died: exit code 3; {health}"


def test_a_backend_that_says_broker_died_itself_is_not_said_twice():
    health = "broker died: broker mqtt-sn (pid 9) exited with code -15 (killed by SIGTERM)"
    assert broker_died(health) == ("broker died: SIGTERM; broker mqtt-sn (pid 9) exited with "
                                   "code -15 (killed by SIGTERM)")


def test_other_broken_health_is_kept_as_it_is():
    health = "broker forkpipe could not create a process: fork failed: EAGAIN"
    assert broker_died(health) == health
