# mqttbed: `make install`, `make test`, `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS := agent,controller,analytics,p4,brokers,dev
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: install system-deps test rtl-test lint fuzz demo bench docs clean lab-up lab-down

install: system-deps $(VENV)/.installed

system-deps:
	@scripts/system-deps.sh

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest -ra --durations=40

# The FPGA broker's RTL suite in full (brokers/fpga/rtl): what `make test` runs of it, plus
# the whole-broker cocotb tests, the 4,096th subscriber and the yosys synthesis (minutes).
rtl-test: install
	MQTTBED_RTL_FULL=1 $(PY) -m pytest -q tests/test_fpga_rtl.py tests/test_fpga_rtl_cocotb.py \
		tests/test_fpga_rtl_synth.py tests/test_fpga_rtl_campaign.py

# Longer fuzz runs than the tests' bounded ones: random examples for the Python parsers
# and the REST API, then libFuzzer on the fork/pipe broker's packet path and on the agents'
# native engine's broker replies, each for FUZZ_SECONDS.
FUZZ_EXAMPLES ?= 20000
FUZZ_SECONDS ?= 300
fuzz: install
	MQTTBED_FUZZ_RANDOM=1 MQTTBED_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q \
		-p no:cacheprovider tests/test_fuzz_codecs.py tests/test_api_schema.py
	$(MAKE) -C brokers/forkpipe fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)
	$(MAKE) -C agents/native fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

demo: install
	$(VENV)/bin/mqttbed run campaigns/quickstart.yaml --data-dir data/demo
	$(VENV)/bin/mqttbed report latest --data-dir data/demo --out data/demo/quickstart-report.html

bench: install   # every bench/ script, then one table of their closing JSON lines
	$(PY) bench/run_all.py

docs: install   # the published JSON schema of the results document
	$(VENV)/bin/mqttbed schema stats > docs/stats.schema.json

# A lab on this machine: LAB_HOSTS network namespaces with their own sshd on a private
# bridge (python -m mqttbed.network.lab); it prints how to provision them. Needs root.
LAB_HOSTS ?= 2
LAB_DIR ?= data/lab
lab-up: install
	$(PY) -m mqttbed.network.lab up --hosts $(LAB_HOSTS) --dir $(LAB_DIR)

lab-down:
	$(PY) -m mqttbed.network.lab down --dir $(LAB_DIR)

clean:
	rm -rf $(VENV) data build *.egg-info .pytest_cache
