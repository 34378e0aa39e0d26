#!/usr/bin/env bash
# Installs the system packages (Debian/Ubuntu) that mqttbed's commands need, by profile, or
# says exactly how to.
#
#   scripts/system-deps.sh [PROFILE...]           install what the profiles need and lack
#   scripts/system-deps.sh --list [PROFILE...]    print the profiles' packages, one a line
#   scripts/system-deps.sh --missing [PROFILE...] print those not installed here
#
# No PROFILE means `all`. Each target of the Makefile installs the profiles it uses (`make
# demo` demo, `make rtl-test` rtl, ...), `make install` (CI) all of them; an error about a
# missing program names the profile that brings it. A profile includes the ones it names.
#
#   build    C builds on first use: the agents' native engine, the fork/pipe broker
#   demo     `make demo`, the quickstart: build, Mosquitto, a Java runtime for Spark
#   network  the p4 backend, impaired links, network namespaces: iproute2, eBPF, iptables
#   lab      `make lab-up`, the one-machine lab: network, sshd
#   brokers  the command backend's third-party presets: RabbitMQ, NATS, ActiveMQ, ejabberd
#   postgres `make test-postgres`, `make postgres-up`: PostgreSQL
#   cross    `make -C agents/native cross`: the engine for the Pis (arm64, armhf) and qemu
#   fuzz     `make fuzz`: build, clang and its libFuzzer runtime
#   rtl      `make rtl-build`, `make rtl-test`: demo, Verilator, yosys
#   bench    `make bench`, every bench/ script: rtl, network, brokers, Valgrind
#   browser  the browser test (test-system): Chromium
#   gpio     the arm64 GPIO guest (its test is in test-system): cross, qemu-system-arm, cpio
#   vm       `make lab-vm`, `make lab-vm-up`, `make fresh-demo`: debootstrap, QEMU, time,
#            gpio
#   test     `make test`: demo, fuzz, lab, brokers, postgres, cross, and the tests' own tools
#   system   `make test-system`: test, browser, gpio
#   all      every profile but vm: `make install`, what CI runs
set -euo pipefail

PROFILES=(build demo network lab brokers postgres cross fuzz rtl bench browser gpio vm test system all)

wanted=()        # the selected profiles' packages, in order, each once
need=()          # those of them this machine lacks
foreign_archs=()
declare -A seen=() used=()

# want PACKAGE CHECK: PACKAGE belongs to the profile; it is missing unless CHECK succeeds.
want() {
    local package=$1 check=$2
    [ -z "${seen[$package]:-}" ] || return 0
    seen[$package]=1
    wanted+=("$package")
    eval "$check" >/dev/null 2>&1 || need+=("$package")
}

# use PROFILE...: the packages of each profile, once however often it is named.
use() {
    local profile
    for profile; do
        [ -z "${used[$profile]:-}" ] || continue
        used[$profile]=1
        "profile_$profile"
    done
}

# Spark 4 needs Java 17 or newer.
java_17() { java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; }

# The fork/pipe broker's parser is fuzzed with libFuzzer (clang -fsanitize=fuzzer), whose
# runtime comes in the compiler-rt package of the installed clang's version.
# Its package's name, or nothing before clang is installed (or off x86_64).
fuzzer_runtime() {
    command -v clang >/dev/null 2>&1 && [ "$(uname -m)" = x86_64 ] || return 0
    echo "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
}
fuzzer_runtime_installed() {
    [ -f "$(clang -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]
}

profile_build() {
    # The forkpipe backend and the agents' native engine (agents/native) are C, built from
    # source with make on first use. gcc only recommends the C library's headers, which
    # --no-install-recommends leaves out.
    want gcc 'command -v cc'
    want libc6-dev '[ -f /usr/include/stdio.h ]'
    want make 'command -v make'
    # The engine speaks TLS (and hashes the WebSocket handshake) through OpenSSL: its
    # headers and libssl/libcrypto to link (-lssl -lcrypto).
    want libssl-dev '[ -f /usr/include/openssl/ssl.h ]'
}

profile_demo() {
    use build
    want mosquitto 'command -v mosquitto || [ -x /usr/sbin/mosquitto ]'
    want default-jre-headless java_17
}

profile_network() {
    # The p4 backend's data plane is an eBPF program built with clang -target bpf (headers
    # from libbpf-dev), attached with tc and read through bpftool, inside network
    # namespaces (ip).
    want iproute2 'command -v ip && command -v tc'
    want clang 'command -v clang'
    want libbpf-dev '[ -f /usr/include/bpf/bpf_helpers.h ]'
    want bpftool 'command -v bpftool || [ -x /usr/sbin/bpftool ]'
    # Link impairment (network/impairment.py) drops packets at random with iptables'
    # statistic match inside namespaces; iptables-legacy is used where nf_tables is missing.
    want iptables 'command -v iptables || [ -x /usr/sbin/iptables ]'
}

profile_lab() {
    use network
    # The lab's hosts are namespaces with their own sshd; the fpga backend's board path
    # and the remote agents are tested against a real local sshd too.
    want openssh-server '[ -x /usr/sbin/sshd ]'
}

profile_brokers() {
    # Third-party brokers run as `command` presets (brokers/command/presets.py), each a
    # private instance per run: RabbitMQ with its MQTT plugin (Erlang comes with it) and
    # NATS server.
    want rabbitmq-server '[ -x /usr/sbin/rabbitmq-server ]'
    want nats-server 'command -v nats-server'
    # ActiveMQ 5.17 (a JVM): 73 packages, 28 MB to download, 39 MB installed. Debian's
    # package lacks the MQTT codec's library, which libmqtt-client-java (with
    # libhawtdispatch-java: 0.5 MB) brings. ejabberd 23.01 (Erlang comes with RabbitMQ):
    # 27 packages, 13 MB to download, 22 MB installed. Measured here: 40 s and 23 s.
    want default-jre-headless java_17
    want activemq '[ -f /usr/share/activemq/bin/activemq.jar ]'
    want libmqtt-client-java '[ -f /usr/share/java/mqtt-client.jar ]'
    want ejabberd 'compgen -G "/usr/lib/*/ejabberd-*/ebin/mod_mqtt.beam"'
}

profile_postgres() {
    # The controller's database on PostgreSQL (MQTTBED_DATABASE_URL) is tested against a
    # private cluster the tests start (tests/postgres_cluster.py: initdb and pg_ctl, run as
    # the package's `postgres` user since initdb refuses root); Debian keeps them in
    # /usr/lib/postgresql/N/bin.
    want postgresql 'compgen -G "/usr/lib/postgresql/*/bin/initdb" && id postgres'
}

profile_cross() {
    # The engine is cross-built for the Pis (arm64, armhf) and its selftest run under qemu
    # user-mode emulation (`make -C agents/native cross`, tests/test_native_cross.py). The
    # C library's headers come in the libc6-dev-*-cross packages, which the compilers only
    # recommend. qemu-user rather than qemu-user-static: 12 MB to download and 99 MB
    # installed against 63 MB and 379 MB, and as fast here. All five (40 packages): 16 s to
    # download and install from an empty cache (measured on this machine). On the Pis
    # themselves the engine is built natively and none of this is needed.
    # The cross builds link OpenSSL too: Debian's multiarch libssl-dev:arm64 and :armhf
    # (dpkg --add-architecture; Multi-Arch: same, so apt keeps them at the amd64 package's
    # version, upgrading it with them when needed). The qemu runs load their libssl.so.3
    # from /usr/lib/<triplet>. About 10 MB with the arm C libraries they pull in.
    [ "$(uname -m)" = x86_64 ] || return 0
    want libssl-dev:arm64 '[ -f /usr/lib/aarch64-linux-gnu/libssl.so ]'
    [ -f /usr/lib/aarch64-linux-gnu/libssl.so ] || foreign_archs+=(arm64)
    want libssl-dev:armhf '[ -f /usr/lib/arm-linux-gnueabihf/libssl.so ]'
    [ -f /usr/lib/arm-linux-gnueabihf/libssl.so ] || foreign_archs+=(armhf)
    # the amd64 headers with them: one apt call keeps the three at one version
    want libssl-dev '[ -f /usr/include/openssl/ssl.h ]'
    want gcc-aarch64-linux-gnu 'command -v aarch64-linux-gnu-gcc'
    want libc6-dev-arm64-cross '[ -f /usr/aarch64-linux-gnu/include/stdio.h ]'
    want gcc-arm-linux-gnueabihf 'command -v arm-linux-gnueabihf-gcc'
    want libc6-dev-armhf-cross '[ -f /usr/arm-linux-gnueabihf/include/stdio.h ]'
    want qemu-user 'command -v qemu-aarch64 && command -v qemu-arm'
}

profile_fuzz() {
    use build
    want clang 'command -v clang'
    local rt_package
    rt_package=$(fuzzer_runtime)
    # with clang missing, the runtime's version is known only once clang is installed (the
    # install below adds it then)
    [ -z "$rt_package" ] || want "$rt_package" fuzzer_runtime_installed
}

profile_rtl() {
    use demo
    # The fpga backend's RTL engine: Verilator simulates the design (brokers/fpga/rtl/),
    # compiled with g++; yosys synthesizes it for a Xilinx UltraScale target as a check (no
    # latches, resource counts).
    want g++ 'command -v g++'
    want verilator 'command -v verilator'
    want yosys 'command -v yosys'
}

profile_bench() {
    use rtl network brokers
    # The agents' native engine's instructions per message (bench/native_engine.py, P3b)
    # are counted with callgrind.
    want valgrind 'command -v valgrind'
}

profile_browser() {
    # The browser test drives Debian's Chromium (Playwright never downloads a browser).
    want chromium '[ -x /usr/bin/chromium ]'
}

profile_test() {
    use demo fuzz lab brokers postgres cross
    # Clients nobody here wrote, for the fork/pipe broker's tests.
    want mosquitto-clients 'command -v mosquitto_pub'
    # Agents read their clock discipline with chronyc; the chrony parser is tested against
    # a real chronyd (two of them, with -x: they never touch this machine's clock).
    want chrony '[ -x /usr/sbin/chronyd ] && command -v chronyc'
    # The exported HdrHistogram logs are read in a test by Java's HistogramLogProcessor,
    # the tool their users know (tests/test_hdr_export.py).
    want libhdrhistogram-java '[ -f /usr/share/java/hdrhistogram.jar ]'
}

profile_vm() {
    use lab
    # The lab VM (scripts/lab-vm, network/lab_vm.py): its root file system is debootstrapped
    # from Debian's packages and made an ext4 image with mkfs.ext4 -d; it boots under
    # qemu-system-x86_64 (TCG) from a qcow2 overlay (qemu-img). 20 s to install here.
    want debootstrap 'command -v debootstrap || [ -x /usr/sbin/debootstrap ]'
    want e2fsprogs 'command -v mkfs.ext4 || [ -x /usr/sbin/mkfs.ext4 ]'
    want qemu-system-x86 'command -v qemu-system-x86_64'
    want qemu-utils 'command -v qemu-img'
    # its test pings the guest from the lab bridge (netem's delay, seen from outside)
    want iputils-ping 'command -v ping'
    # `make fresh-demo` (scripts/fresh-demo.sh) debootstraps a bare Debian 12 too, and times
    # `make demo` in it with /usr/bin/time
    want time '[ -x /usr/bin/time ]'
    use gpio
}

profile_gpio() {
    # The arm64 GPIO guest (scripts/lab-vm/build-arm64.sh, network/lab_vm_gpio.py): Debian's
    # arm64 kernel on QEMU's `virt` board (qemu-system-aarch64, TCG), whose PL061 GPIO
    # controller its kernel drives; an initramfs packed with cpio holding a static busybox
    # and the engine cross-built statically (the cross profile's compiler and libssl). Its
    # test boots in seconds, so test-system (CI) runs it, unlike the lab VM's.
    use cross
    want qemu-system-arm 'command -v qemu-system-aarch64'
    want cpio 'command -v cpio'
}

profile_system() { use test browser gpio; }

profile_all() { use system rtl bench; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

mode=install
case "${1:-}" in
    --list|--missing) mode=${1#--}; shift ;;
    -h|--help) usage; exit 0 ;;
esac
[ $# -gt 0 ] || set -- all
for profile; do
    if [[ " ${PROFILES[*]} " != *" $profile "* ]]; then
        echo "system-deps.sh: no profile '$profile'; the profiles: ${PROFILES[*]}" >&2
        exit 2
    fi
done
use "$@"

# The cross profile's foreign libssl-dev and the amd64 one are installed in one apt call.
if [ ${#foreign_archs[@]} -gt 0 ] && [[ " ${need[*]} " != *" libssl-dev "* ]]; then
    need+=(libssl-dev)
fi

case $mode in
    list) printf '%s\n' "${wanted[@]}"; exit 0 ;;
    missing) [ ${#need[@]} -eq 0 ] || printf '%s\n' "${need[@]}"; exit 0 ;;
esac

if [ ${#need[@]} -eq 0 ]; then
    echo "system packages ($*): all present"
    exit 0
fi
add_archs=""
for arch in "${foreign_archs[@]}"; do add_archs+="dpkg --add-architecture $arch && "; done
cmd="${add_archs}apt-get update && apt-get install -y --no-install-recommends ${need[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "mqttbed ($*) needs these system packages: ${need[*]}" >&2
    echo "run as root:  sudo sh -c '$cmd'" >&2
    echo "       (or:   sudo scripts/system-deps.sh $*)" >&2
    exit 1
fi
echo "installing system packages ($*): ${need[*]}"
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
if [ -n "${used[fuzz]:-}" ]; then
    rt_package=$(fuzzer_runtime)
    [ -z "$rt_package" ] || fuzzer_runtime_installed || \
        apt-get install -y -qq --no-install-recommends "$rt_package"
fi
