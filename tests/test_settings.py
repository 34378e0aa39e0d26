"""Settings: MQTTBED_* variables, a .env file, options over both, bad values named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mqttbed.core.settings import ClientSettings, Settings, SettingsError


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No MQTTBED_* variable from the caller's environment, and a working dir of our own."""
    import os

    for name in [n for n in os.environ if n.startswith("MQTTBED_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_defaults(clean_env, tmp_path):
    settings = Settings.load()
    assert settings.data_dir == tmp_path / "data"
    assert (settings.spark_master, settings.spark_driver_memory,
            settings.spark_shuffle_partitions) == ("local[*]", "2g", 4)
    assert settings.lab_address == "127.0.0.1" and settings.spark_conf == {}


def test_environment_over_dotenv_and_options_over_both(clean_env, tmp_path):
    (tmp_path / ".env").write_text("MQTTBED_SPARK_SHUFFLE_PARTITIONS=16\n"
                                   "MQTTBED_SPARK_DRIVER_MEMORY=6g\n"
                                   "MQTTBED_DATA_DIR=from-dotenv\n"
                                   'MQTTBED_SPARK_CONF={"spark.executor.cores": "2"}\n'
                                   "MQTTBED_URL=http://lab:8000\n")
    clean_env.setenv("MQTTBED_SPARK_DRIVER_MEMORY", "512m")
    settings = Settings.from_env(data_dir="from-option")
    assert settings.spark_shuffle_partitions == 16          # .env
    assert settings.spark_driver_memory == "512m"           # environment over .env
    assert settings.data_dir == tmp_path / "from-option"    # option over both
    assert settings.spark_conf == {"spark.executor.cores": "2"}
    assert ClientSettings.load().url == "http://lab:8000"   # another role, the same file


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("MQTTBED_SPARK_SHUFFLE_PARTITIONS", "0", "greater than or equal to 1"),
    ("MQTTBED_SPARK_DRIVER_MEMORY", "lots", "JVM memory size"),
    ("MQTTBED_SPARK_MASTER", "spark://nowhere", "spark://HOST:PORT"),
    ("MQTTBED_LAB_ADDRESS", "lab-host", "IPv4 or IPv6"),
])
def test_a_bad_value_names_its_variable_and_the_value(clean_env, variable, value, says):
    clean_env.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    message = str(caught.value)
    assert variable in message and repr(value) in message and says in message


def test_the_command_line_says_what_is_wrong_and_exits(tmp_path):
    cli = Path(sys.executable).with_name("mqttbed")
    done = subprocess.run([str(cli), "analyze", "latest", "--data-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "MQTTBED_SPARK_DRIVER_MEMORY": "2 GB"})
    assert done.returncode == 1
    assert done.stderr.strip() == ("mqttbed analyze: bad setting: MQTTBED_SPARK_DRIVER_MEMORY: "
                                   "expected a JVM memory size such as 512m or 2g (got '2 GB')")
