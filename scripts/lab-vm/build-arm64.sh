#!/usr/bin/env bash
# Builds the arm64 GPIO guest (issue 45) from Debian 12's own packages, or finds it built.
#
#   scripts/lab-vm/build-arm64.sh          build if needed; print the guest's directory last
#   scripts/lab-vm/build-arm64.sh --dir    print that directory only (built or not)
#
# The guest is Debian's arm64 kernel (linux-image-arm64: its PL061 GPIO driver and the GPIO
# character device are built in) booted by qemu-system-aarch64 on QEMU's `virt` board with
# no disk: its initramfs holds all it runs. That is a cpio (newc) of
#
#   /bin/busybox       Debian's busybox-static for arm64 (the shell, mount, ip, insmod)
#   /bin/gpio-edges    the native engine's GPIO run (agents/native/tests/gpio_edges.c),
#                      cross-built statically (`make -C agents/native gpio-edges-arm64`)
#   /lib/modules/*.ko  the kernel's virtio-mmio and virtio-net modules (with their
#                      dependencies), for the network to the broker on this machine
#   /init              mounts, loads those, brings eth0 up as QEMU's user network
#                      expects (10.0.2.15, this machine at 10.0.2.2), runs gpio-edges on
#                      the PL061's chip with the arguments of the kernel command line, and
#                      powers off (QEMU exits)
#
# The .debs come from the Debian mirror this machine's apt uses (`apt-get download`, the
# arm64 architecture added: scripts/system-deps.sh gpio does it, through cross), nothing
# from elsewhere; they are kept in $cache/debs. The guest is cached by a digest of its recipe (this script and
# the engine's sources) in $MQTTBED_LAB_VM_ARM64_CACHE (default
# ~/.cache/mqttbed/lab-vm-arm64)/<digest>/: vmlinuz, initrd.cpio, manifest.json.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
native=$(cd "$here/../../agents/native" && pwd)
# the order insmod needs: a module after those it depends on (their .ko's `depends=`)
MODULES="kernel/drivers/virtio/virtio_mmio kernel/net/core/failover
         kernel/drivers/net/net_failover kernel/drivers/net/virtio_net"
digest=$( (cat "$here/build-arm64.sh" "$native/Makefile" "$native/tests/gpio_edges.c" \
               "$native"/src/*.c "$native"/src/*.h) | sha256sum | cut -c1-16)
cache=${MQTTBED_LAB_VM_ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mqttbed/lab-vm-arm64}
out=$cache/$digest

if [ "${1:-}" = --dir ]; then echo "$out"; exit 0; fi
if [ -f "$out/manifest.json" ]; then echo "$out"; exit 0; fi

fail() { echo "lab-vm arm64 build: $*" >&2; exit 1; }
for tool in apt-get apt-cache dpkg-deb cpio aarch64-linux-gnu-gcc make flock; do
    command -v "$tool" >/dev/null || \
        fail "$tool not found: install the gpio profile (scripts/system-deps.sh gpio)"
done
# (into a variable first: grep -q ends early, and pipefail would count dpkg's SIGPIPE)
foreign=$(dpkg --print-foreign-architectures)
grep -qx arm64 <<<"$foreign" || \
    fail "apt has no arm64 architecture: scripts/system-deps.sh gpio adds it (dpkg --add-architecture arm64 && apt-get update)"

mkdir -p "$cache/debs"
exec 9>"$cache/$digest.lock"
flock 9
if [ -f "$out/manifest.json" ]; then echo "$out"; exit 0; fi

started=$SECONDS
work=$cache/$digest.build.$$
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root"/{bin,dev,proc,sys,lib/modules}

# download PACKAGE: the .deb of the mirror's candidate version, from $cache/debs if there
download() {
    local package=$1 version file
    version=$(apt-cache policy "$package:arm64" | awk '/Candidate:/ { print $2 }')
    [ -n "$version" ] && [ "$version" != "(none)" ] || \
        fail "apt knows no $package:arm64: apt-get update (the arm64 lists) first"
    file="$cache/debs/${package}_${version//:/%3a}_arm64.deb"
    if [ ! -f "$file" ]; then
        # apt's sandbox user may not write the cache: download where it can, then move
        (cd "$work" && apt-get download -q "$package:arm64=$version" >"$work/apt.log" 2>&1) || {
            cat "$work/apt.log" >&2; fail "apt-get download $package:arm64=$version failed"; }
        mv "$work/${package}_${version//:/%3a}_arm64.deb" "$file"
    fi
    echo "$file"
}

kernel_package=$(apt-cache depends linux-image-arm64:arm64 |
                 awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { sub(/:arm64$/, "", $2); print $2; exit }')
[ -n "$kernel_package" ] || fail "linux-image-arm64:arm64 names no kernel package"
echo "lab-vm arm64 build $digest: $kernel_package and busybox-static (arm64)" >&2
kernel_deb=$(download "$kernel_package")
busybox_deb=$(download busybox-static)
# only what the guest takes: the kernel, its config and the modules named above
mkdir -p "$work/kernel"
dpkg-deb --fsys-tarfile "$kernel_deb" | tar -x -C "$work/kernel" --wildcards './boot/*' \
    $(for module in $MODULES; do printf './lib/modules/*/%s.ko ' "$module"; done)
dpkg-deb -x "$busybox_deb" "$work/busybox"
kernel_release=$(ls "$work/kernel/lib/modules" | sort -V | tail -n 1)
for config in CONFIG_GPIO_PL061=y CONFIG_GPIO_CDEV=y CONFIG_SERIAL_AMBA_PL011_CONSOLE=y; do
    grep -qx "$config" "$work/kernel/boot/config-$kernel_release" || \
        fail "$kernel_package lacks $config, which the guest needs"
done
cp "$work/kernel/boot/vmlinuz-$kernel_release" "$work/vmlinuz"
for module in $MODULES; do
    cp "$work/kernel/lib/modules/$kernel_release/$module.ko" "$work/root/lib/modules/" || \
        fail "$kernel_package has no $module.ko"
done
install -m 755 "$work/busybox/bin/busybox" "$work/root/bin/busybox"

echo "lab-vm arm64 build $digest: the engine (make -C agents/native gpio-edges-arm64)" >&2
make -s -C "$native" gpio-edges-arm64 >"$work/make.log" 2>&1 || {
    cat "$work/make.log" >&2; fail "the engine's arm64 build failed (above)"; }
install -m 755 "$native/build/aarch64/gpio-edges" "$work/root/bin/gpio-edges"

# What the guest runs. The kernel command line carries the run (mqttbed.NAME=VALUE, set by
# network/lab_vm_gpio.py); every line the host reads starts with "mqttbed-".
modules=$(for module in $MODULES; do printf ' %s' "${module##*/}"; done)
cat >"$work/root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "mqttbed-init \$(cut -d' ' -f1 /proc/uptime)"
for module in$modules; do
    insmod "/lib/modules/\$module.ko" || echo "mqttbed-error insmod \$module"
done
for word in \$(cat /proc/cmdline); do
    case \$word in
        mqttbed.broker=*) broker=\${word#*=} ;;
        mqttbed.port=*) port=\${word#*=} ;;
        mqttbed.messages=*) messages=\${word#*=} ;;
        mqttbed.rate=*) rate=\${word#*=} ;;
        mqttbed.pub_line=*) pub_line=\${word#*=} ;;
        mqttbed.sub_line=*) sub_line=\${word#*=} ;;
    esac
done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
chip=""
for device in /sys/bus/gpio/devices/gpiochip*; do
    case \$(readlink -f "\$device") in *.pl061/*) chip=/dev/\${device##*/} ;; esac
done
if [ -z "\$chip" ]; then
    echo "mqttbed-error no PL061 among /sys/bus/gpio/devices: \$(ls /sys/bus/gpio/devices)"
else
    echo "mqttbed-chip \$chip \$(readlink -f /sys/bus/gpio/devices/\${chip#/dev/})"
    echo "mqttbed-run \$(cut -d' ' -f1 /proc/uptime)"
    /bin/gpio-edges "\$chip" "\$broker" "\$port" "\$messages" "\$rate" "\$pub_line" "\$sub_line"
    echo "mqttbed-exit \$?"
fi
poweroff -f
EOF
chmod 755 "$work/root/init"
(cd "$work/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$work/initrd.cpio"
kernel_version=$(dpkg-deb -f "$kernel_deb" Version)
busybox_version=$(dpkg-deb -f "$busybox_deb" Version)
cat >"$work/manifest.json" <<EOF
{
  "digest": "$digest",
  "kernel_package": "$kernel_package",
  "kernel_version": "$kernel_version",
  "kernel_release": "$kernel_release",
  "busybox_version": "$busybox_version",
  "engine_sha256": "$(sha256sum "$work/root/bin/gpio-edges" | cut -d' ' -f1)",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_s": $((SECONDS - started)),
  "initrd_bytes": $(stat -c %s "$work/initrd.cpio")
}
EOF
mkdir -p "$out"
mv "$work/vmlinuz" "$work/initrd.cpio" "$out/"
mv "$work/manifest.json" "$out/manifest.json"   # last: its presence means "built"
echo "lab-vm arm64 build $digest: $((SECONDS - started)) s (kernel $kernel_release)" >&2
echo "$out"
