#!/usr/bin/env bash
# Installs the system packages mqttbed needs (Debian/Ubuntu), or says exactly how to.
set -euo pipefail

need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
# The forkpipe backend is C, built from source with make on first use.
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
# The agents' native load engine (agents/native) is C too; its instructions per message
# (bench/native_engine.py, P3b) are counted with callgrind.
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
# The engine speaks TLS (and hashes the WebSocket handshake) through OpenSSL: its headers
# and libssl/libcrypto to link (-lssl -lcrypto).
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
# The engine is also cross-built for the Pis (arm64, armhf) and its selftest run under qemu
# user-mode emulation (`make -C agents/native cross`, tests/test_native_cross.py). The C
# library's headers come in the libc6-dev-*-cross packages, which the compilers only
# recommend. qemu-user rather than qemu-user-static: 12 MB to download and 99 MB installed
# against 63 MB and 379 MB, and as fast here. All five (40 packages): 16 s to download and
# install from an empty cache (measured on this machine). On the Pis themselves the
# engine is built natively and none of this is needed.
# The cross builds link OpenSSL too: Debian's multiarch libssl-dev:arm64 and :armhf
# (dpkg --add-architecture; Multi-Arch: same, so apt keeps them at the amd64 package's
# version, upgrading it with them when needed). The qemu runs load their libssl.so.3
# from /usr/lib/<triplet>. About 10 MB with the arm C libraries they pull in.
foreign_archs=()
if [ "$(uname -m)" = x86_64 ]; then
    [ -f /usr/lib/aarch64-linux-gnu/libssl.so ] || { need+=(libssl-dev:arm64); foreign_archs+=(arm64); }
    [ -f /usr/lib/arm-linux-gnueabihf/libssl.so ] || { need+=(libssl-dev:armhf); foreign_archs+=(armhf); }
    # the amd64 headers with them: one apt call keeps the three at one version
    [ ${#foreign_archs[@]} -eq 0 ] || [[ " ${need[*]} " == *" libssl-dev "* ]] || need+=(libssl-dev)
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
    [ -f /usr/aarch64-linux-gnu/include/stdio.h ] || need+=(libc6-dev-arm64-cross)
    command -v arm-linux-gnueabihf-gcc >/dev/null 2>&1 || need+=(gcc-arm-linux-gnueabihf)
    [ -f /usr/arm-linux-gnueabihf/include/stdio.h ] || need+=(libc6-dev-armhf-cross)
    { command -v qemu-aarch64 && command -v qemu-arm; } >/dev/null 2>&1 || need+=(qemu-user)
fi
# The fpga backend's board path is tested against a real local sshd.
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
# The browser test drives Debian's Chromium (Playwright never downloads a browser here).
[ -x /usr/bin/chromium ] || need+=(chromium)
# The p4 backend's data plane is an eBPF program built with clang -target bpf (headers from
# libbpf-dev), attached with tc and read through bpftool, inside network namespaces (ip).
command -v clang >/dev/null 2>&1 || need+=(clang)
# The fork/pipe broker's parser is fuzzed with libFuzzer (clang -fsanitize=fuzzer), whose
# runtime comes in the compiler-rt package of the installed clang's version.
fuzzer_runtime() {
    command -v clang >/dev/null 2>&1 || return 0
    local rt
    rt="$(clang -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a"
    [ "$(uname -m)" != x86_64 ] || [ -f "$rt" ] || \
        echo "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
}
rt_package=$(fuzzer_runtime)
[ -z "$rt_package" ] || need+=("$rt_package")
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
command -v bpftool >/dev/null 2>&1 || [ -x /usr/sbin/bpftool ] || need+=(bpftool)
{ command -v ip && command -v tc; } >/dev/null 2>&1 || need+=(iproute2)
# Link impairment (network/impairment.py) drops packets at random with iptables'
# statistic match inside namespaces; iptables-legacy is used where nf_tables is missing.
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
# The fpga backend's RTL engine: Verilator simulates the design (brokers/fpga/rtl/), yosys
# synthesizes it for a Xilinx UltraScale target as a check (no latches, resource counts).
command -v verilator >/dev/null 2>&1 || need+=(verilator)
command -v yosys >/dev/null 2>&1 || need+=(yosys)
# Agents read their clock discipline with chronyc; the chrony parser is tested against a
# real chronyd (two of them, with -x: they never touch this machine's clock).
[ -x /usr/sbin/chronyd ] && command -v chronyc >/dev/null 2>&1 || need+=(chrony)
# Third-party brokers run as `command` presets (brokers/command/presets.py), each a private
# instance per run: RabbitMQ with its MQTT plugin (Erlang comes with it) and NATS server.
[ -x /usr/sbin/rabbitmq-server ] || need+=(rabbitmq-server)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
# ActiveMQ 5.17 (a JVM; Java comes for Spark below): 73 packages, 28 MB to download, 39 MB
# installed. Debian's package lacks the MQTT codec's library, which libmqtt-client-java
# (with libhawtdispatch-java: 0.5 MB) brings. ejabberd 23.01 (Erlang comes with RabbitMQ):
# 27 packages, 13 MB to download, 22 MB installed. Measured here: 40 s and 23 s.
[ -f /usr/share/activemq/bin/activemq.jar ] || need+=(activemq)
[ -f /usr/share/java/mqtt-client.jar ] || need+=(libmqtt-client-java)
compgen -G "/usr/lib/*/ejabberd-*/ebin/mod_mqtt.beam" >/dev/null || need+=(ejabberd)
# The controller's database on PostgreSQL (MQTTBED_DATABASE_URL) is tested against a private
# cluster the tests start (tests/postgres_cluster.py: initdb and pg_ctl, run as the package's
# `postgres` user since initdb refuses root); Debian keeps them in /usr/lib/postgresql/N/bin.
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || ! id postgres >/dev/null 2>&1
then
    need+=(postgresql)
fi
# Spark 4 needs Java 17 or newer.
if ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then
    need+=(default-jre-headless)
fi

# The exported HdrHistogram logs are read in a test by Java's HistogramLogProcessor, the
# tool their users know (tests/test_hdr_export.py).
[ -f /usr/share/java/hdrhistogram.jar ] || need+=(libhdrhistogram-java)

if [ ${#need[@]} -eq 0 ]; then
    echo "system packages: all present"
    exit 0
fi
add_archs=""
for arch in "${foreign_archs[@]}"; do add_archs+="dpkg --add-architecture $arch && "; done
cmd="${add_archs}apt-get update && apt-get install -y --no-install-recommends ${need[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "mqttbed needs these system packages: ${need[*]}" >&2
    echo "run as root:  sudo sh -c '$cmd'" >&2
    exit 1
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
for arch in "${foreign_archs[@]}"; do dpkg --add-architecture "$arch"; done
# A mirror caught mid-sync fails one index (seen here: bookworm-security's armhf Packages,
# "File has unexpected size ... Mirror sync in progress?") and apt-get update exits 100;
# what it could read is enough to install from, and a package that is truly missing still
# fails the install below, naming it.
apt-get update -qq || echo "apt-get update: an index failed to download (above); " \
    "installing from the indexes that did" >&2
install_flags=()
if [ ${#foreign_archs[@]} -gt 0 ]; then
    # libssl-dev is Multi-Arch: same, so its amd64, arm64 and armhf packages must be one
    # version; when an index failed they can differ (security's for one architecture,
    # main's for another). Take the oldest candidate of the three for all of them.
    ssl_version=$(for p in libssl-dev libssl-dev:arm64 libssl-dev:armhf; do
                      apt-cache policy "$p" | awk '/Candidate:/ {print $2}'
                  done | sort -V | head -n 1)
    for i in "${!need[@]}"; do
        case "${need[$i]}" in
            libssl-dev|libssl-dev:arm64|libssl-dev:armhf) need[i]="${need[$i]}=$ssl_version" ;;
        esac
    done
    need+=("libssl3=$ssl_version" "libssl3:arm64=$ssl_version" "libssl3:armhf=$ssl_version")
    install_flags+=(--allow-downgrades)
fi
apt-get install -y -qq --no-install-recommends "${install_flags[@]}" "${need[@]}"
# clang itself was missing: its compiler-rt package is known only now.
rt_package=$(fuzzer_runtime)
[ -z "$rt_package" ] || apt-get install -y -qq --no-install-recommends "$rt_package"
