# mqttbed: `make install`, `make test`, `make demo`.
PYTHON ?= python3
# the venv's folder: `make demo VENV=/tmp/demo-venv` installs into a fresh one
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS := agent,controller,analytics,p4,brokers,dev
# What the quickstart imports: the controller (its local agents come with it) and Spark's
# analytics; the wheel test runs a quickstart run from an install of these two alone.
DEMO_EXTRAS := controller,analytics
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
# System packages come in profiles (`scripts/system-deps.sh --help` lists what each holds):
# every target installs the profiles it uses; `make install`, which CI runs, all of them.
SYSTEM_PROFILES := build demo network lab brokers postgres cross fuzz rtl bench browser gpio vm test system

.PHONY: install class-archive system-deps test test-system test-system-parallel test-system-serial test-postgres rtl-test rtl-build lint fuzz demo bench docs clean lab-up lab-down postgres-up postgres-down
.PHONY: $(addprefix system-deps-,$(SYSTEM_PROFILES))

# Everything: every system profile and every extra (CI, `make test`, development).
install: system-deps $(VENV)/.installed class-archive

# The Spark JVM's class archive for this Java and Spark, made once (about a minute): every
# later session's JVM starts on less CPU (mqttbed.analytics.class_archive).
class-archive: $(VENV)/.installed
	$(PY) -m mqttbed.controller.class_archive

# `make system-deps PROFILES="demo postgres"` installs those profiles only.
PROFILES ?= all
system-deps:
	@scripts/system-deps.sh $(PROFILES)

$(addprefix system-deps-,$(SYSTEM_PROFILES)): system-deps-%:
	@scripts/system-deps.sh $*

# Every extra; a venv with all of them has the demo's too.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@ $(VENV)/.installed-spark $(VENV)/.installed-demo

# The demo's extras only, with the venv's own pip (any pip since 21.3 installs a
# pyproject.toml project editable), in two steps: mqttbed with Spark (the `spark` extra),
# then the rest. Between them Spark's jars are there, and demo-class-archive has Java dump
# the classes mqttbed lists into a class archive (half a minute of a core) while pip
# installs the rest: a newcomer's first quickstart then starts its JVM from the archive
# (mqttbed.analytics.class_archive). `make demo` runs these with two jobs.
$(VENV)/.installed-spark: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[spark]'
	touch $@

$(VENV)/.installed-demo: $(VENV)/.installed-spark
	$(PY) -m pip install --quiet -e '.[$(DEMO_EXTRAS)]'
	touch $@

# Nothing where this install has an archive already (`make install` makes the dynamic one).
.PHONY: demo-class-archive demo-install
demo-class-archive: system-deps-demo $(VENV)/.installed-spark
	$(PY) -m mqttbed.controller.class_archive --from-list

# apt beside pip's first step; the class archive beside its second
demo-install: system-deps-demo $(VENV)/.installed-demo demo-class-archive

lint: $(VENV)/.installed   # ruff, the import contracts of pyproject.toml (the dependency direction), mypy
	$(VENV)/bin/ruff check .
	$(PY) scripts/lint_imports.py
	$(PY) scripts/typecheck.py

# Three tiers, which together are every test (CI, .ci/run, runs rtl-test beside test,
# then test-system-parallel and test-system-serial):
#   test         everything but the long end-to-end tests (`system` marker): minutes
#   test-system  the `system` tests (whole campaigns through the CLI, REST, a lab, a Spark
#                cluster, a browser) but the RTL's, which rtl-test runs: first
#                test-system-parallel, then test-system-serial
#   rtl-test     every `rtl` test, the FPGA broker's RTL in full
# make test runs on TEST_WORKERS processes (pytest-xdist; each with its own Spark session
# and fixtures): its tests wait on brokers, agents and Spark more than they compute. Its
# tests are dealt by module (`--dist loadgroup`; tests/conftest.py gives each test its
# module's group), so a module's fixtures are made on one worker only. A system test
# whose campaign measures runs alone (test-system-serial): a second campaign beside it
# would be part of what it measures. The others (marker `parallel`: they assert counts,
# states and text, and share nothing machine-wide) run on two workers
# (test-system-parallel), tests that share a module's or the session's campaign on one
# (`--dist loadgroup`). No load can move what they assert; run beside make test in CI
# they made CI 23-24 minutes, but some of make test's own tests failed under that load
# (.ci/run says which), so CI runs the tiers one after another. In a clean-clone CI run (2026-11-29, ci12, one tier after another) the three
# took 11:27 (make test, the RTL's tier beside it), 9:01 (46 parallel) and 11:51 (23
# alone), 35:11 in all; with the parallel tier beside make test (2026-11-30, ci2), make
# test took 12:21 (the 46 parallel ones 10:15 and the RTL's 3:13 beside it), then 7:54
# (29 alone: the arm64 GPIO guest's 7 joined, amqtt's capacity search left), 23:02 in
# all. The tests' JVMs use the JIT's quick tier (tests/conftest.py): a one-analysis
# command took 61.6 s of CPU with the full JIT and 32.5 s with it
# (tests/test_spine_end_to_end.py).
TEST_WORKERS ?= 2
test: install lint
	$(PY) -m pytest -ra --durations=40 -m "not system" -n $(TEST_WORKERS) --dist loadgroup --junitxml=build/junit/test.xml

test-system: test-system-parallel test-system-serial

test-system-parallel: install
	$(PY) -m pytest -ra --durations=20 -m "system and not rtl and parallel" -n 2 --dist loadgroup --junitxml=build/junit/system-parallel.xml

test-system-serial: install
	$(PY) -m pytest -ra --durations=40 -m "system and not rtl and not parallel" --junitxml=build/junit/system-serial.xml

# The database's tests on PostgreSQL only: the migrations, the types, tokens, run states and
# recovery, a restart under a running campaign (each on a private cluster the tests start
# and stop: `make test` runs them too, beside their SQLite twins).
test-postgres: system-deps-demo system-deps-postgres $(VENV)/.installed
	$(PY) -m pytest -ra --durations=10 -m postgres

# The FPGA broker's RTL suite in full (brokers/fpga/rtl, `rtl` marker): what `make test`
# runs of it, plus the Verilator harness and whole-broker cocotb tests, the 4,096th
# subscriber, the yosys synthesis and a campaign against the RTL (minutes).
rtl-test: system-deps-rtl $(VENV)/.installed
	MQTTBED_RTL_FULL=1 $(PY) -m pytest -ra --durations=20 -m rtl

# The RTL's two builds ahead of rtl-test, niced: the Verilated harness, then yosys
# synthesis (~4 min of one core). Each is kept by a hash of its sources, so the tests that
# need them find them built; .ci/run starts this, then rtl-test, beside `make test` and waits
# for both before the system tier, whose campaigns measure.
rtl-build: system-deps-rtl $(VENV)/.installed
	nice -n 10 $(PY) -c "from mqttbed.brokers.fpga.rtl.build import ensure_sim, ensure_synth; \
	print(ensure_sim()); print(ensure_synth())"

# Longer fuzz runs than the tests' bounded ones: random examples for the Python parsers
# and the REST API, then libFuzzer on the fork/pipe broker's packet path and on the agents'
# native engine's broker replies, each for FUZZ_SECONDS.
FUZZ_EXAMPLES ?= 20000
FUZZ_SECONDS ?= 300
fuzz: system-deps-fuzz $(VENV)/.installed
	MQTTBED_FUZZ_RANDOM=1 MQTTBED_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q \
		-p no:cacheprovider tests/test_fuzz_codecs.py tests/test_api_schema.py
	$(MAKE) -C brokers/forkpipe fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)
	$(MAKE) -C agents/native fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

# The quickstart into the default data dir (MQTTBED_DATA_DIR or ./data), the one
# `mqttbed report latest`, `compare` and `campaigns list` read when given no --data-dir.
# Installs only what it runs: the demo profile and the demo's extras (demo-install, with
# two jobs: apt beside pip, Spark's class archive beside pip's second step).
demo:
	$(MAKE) -j2 --no-print-directory demo-install
	$(VENV)/bin/mqttbed run quickstart
	$(VENV)/bin/mqttbed report latest --out data/quickstart-report.html

# `make demo` timed as a newcomer meets it: in a fresh Debian 12 root (debootstrap, cached
# by its recipe in ~/.cache/mqttbed/fresh-demo) on this machine's kernel and network, a
# clean clone of this checkout's HEAD, apt and pip included; one JSON line of each phase's
# seconds and the downloads' sizes (scripts/fresh-demo.sh). Needs root and debootstrap.
.PHONY: fresh-demo
fresh-demo: system-deps-vm
	@[ "$$(id -u)" -eq 0 ] || { echo "make fresh-demo needs root (debootstrap, chroot, mounts): run it as root" >&2; exit 1; }
	scripts/fresh-demo.sh

bench: system-deps-bench $(VENV)/.installed   # every bench/ script, then one table of their closing JSON lines
	$(PY) bench/run_all.py

# The published JSON schema of the results document, then the docs site (mkdocs.yml), built
# strict into build/site; its Reference pages are generated from the code as it builds.
docs: $(VENV)/.installed
	$(VENV)/bin/mqttbed schema stats > docs/stats.schema.json
	$(PY) -m mkdocs build --strict --site-dir build/site

# A lab on this machine: LAB_HOSTS network namespaces with their own sshd on a private
# bridge (python -m mqttbed.network.lab); it prints how to provision them. Needs root.
LAB_HOSTS ?= 2
LAB_DIR ?= data/lab
lab-up: system-deps-lab $(VENV)/.installed
	$(PY) -m mqttbed.network.lab up --hosts $(LAB_HOSTS) --dir $(LAB_DIR)

lab-down:
	$(PY) -m mqttbed.network.lab down --dir $(LAB_DIR)

# A lab host with its own kernel and clock: a Debian 12 VM under QEMU without KVM (TCG) on
# a lab bridge of its own (network/lab_vm.py). `make lab-vm` builds its image from Debian's
# packages (scripts/lab-vm/build.sh: debootstrap, mkfs.ext4 -d), cached by the digest of
# its recipe in ~/.cache/mqttbed/lab-vm (MQTTBED_LAB_VM_CACHE), so a second build is
# instant; lab-vm-up boots it and prints how to provision it; test-vm runs its test.
# Needs root.
LAB_VM_DIR ?= data/lab-vm
.PHONY: lab-vm lab-vm-up lab-vm-down test-vm
lab-vm: system-deps-vm
	scripts/lab-vm/build.sh

# LAB_VM_BRIDGE=PREFIXbr joins a namespace lab's bridge (`make lab-up`) instead of its own
lab-vm-up: lab-vm $(VENV)/.installed
	$(PY) -m mqttbed.network.lab_vm up --dir $(LAB_VM_DIR) $(if $(LAB_VM_BRIDGE),--bridge $(LAB_VM_BRIDGE))

lab-vm-down:
	$(PY) -m mqttbed.network.lab_vm down --dir $(LAB_VM_DIR)

test-vm: lab-vm $(VENV)/.installed
	MQTTBED_LAB_VM_TESTS=1 $(PY) -m pytest -ra -s -p no:cacheprovider --junitxml=build/junit/vm.xml \
		tests/test_lab_vm.py

# A PostgreSQL of your own for the controller (tests/postgres_cluster.py): a cluster in
# POSTGRES_DIR on 127.0.0.1:POSTGRES_PORT with a database `mqttbed`; it prints the
# MQTTBED_DATABASE_URL to export. Root runs it as the `postgres` user.
POSTGRES_DIR ?= data/postgres
POSTGRES_PORT ?= 5433
postgres-up: system-deps-postgres $(VENV)/.installed
	$(PY) -m tests.postgres_cluster up --dir $(POSTGRES_DIR) --port $(POSTGRES_PORT)

postgres-down:
	$(PY) -m tests.postgres_cluster down --dir $(POSTGRES_DIR)

clean:
	rm -rf $(VENV) data build *.egg-info .pytest_cache
