#!/usr/bin/env bash
# Builds the lab VM's image from Debian 12's own packages, or finds it already built.
#
#   scripts/lab-vm/build.sh             build if needed; print the image's directory last
#   scripts/lab-vm/build.sh --dir       print that directory only (built or not)
#
# debootstrap installs bookworm (minbase and packages.txt) into a directory, from the
# Debian mirror this machine's apt already uses (MQTTBED_LAB_VM_MIRROR overrides it); the
# directory becomes an ext4 raw image with `mkfs.ext4 -d` (no loop mount, no image
# fetched from anywhere). The kernel and its initramfs are copied out beside it for
# `qemu -kernel/-initrd`. The image is cached by a digest of its recipe (this script and
# packages.txt) in $MQTTBED_LAB_VM_CACHE (default ~/.cache/mqttbed/lab-vm)/<digest>/, so a
# second build is instant. That directory holds:
#
#   rootfs.raw         the root file system (ext4, /dev/vda in the guest; never written:
#                      a VM boots from a copy-on-write overlay of it)
#   vmlinuz initrd.img Debian's linux-image-amd64 kernel and initramfs
#   client_key{,.pub}  the key authorized for root in the guest (ed25519)
#   host_key.pub       the guest sshd's host key (pinned by `up` in a known_hosts file)
#   manifest.json      kernel release, digest, mirror, build time, sizes
#
# Needs root (debootstrap, chroot) and the `vm` profile: scripts/system-deps.sh vm.
set -euo pipefail

SUITE=bookworm
here=$(cd "$(dirname "$0")" && pwd)
digest=$( (cat "$here/build.sh" "$here/packages.txt"; echo "$SUITE") | sha256sum | cut -c1-16)
cache=${MQTTBED_LAB_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mqttbed/lab-vm}
out=$cache/$digest

if [ "${1:-}" = --dir ]; then echo "$out"; exit 0; fi
if [ -f "$out/manifest.json" ]; then echo "$out"; exit 0; fi

fail() { echo "lab-vm build: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot): run it as root"
for tool in debootstrap mkfs.ext4 ssh-keygen flock; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || \
        fail "$tool not found: install the vm profile (scripts/system-deps.sh vm, or make system-deps-vm)"
done

# The first bookworm (not -security) URI of this machine's apt sources, deb822 or one-line.
mirror() {
    if [ -n "${MQTTBED_LAB_VM_MIRROR:-}" ]; then echo "$MQTTBED_LAB_VM_MIRROR"; return; fi
    local found=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        found=$(awk -v suite="$SUITE" 'BEGIN { RS = ""; FS = "\n" } {
            uri = ""; ok = 0
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^URIs:/) { split($i, f, /[ \t]+/); uri = f[2] }
                if ($i ~ /^Suites:/ && $i ~ ("[ \t]" suite "([ \t]|$)")) ok = 1
            }
            if (ok && uri != "") { print uri; exit }
        }' /etc/apt/sources.list.d/*.sources)
    fi
    if [ -z "$found" ]; then
        found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
                awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2; exit }')
    fi
    [ -n "$found" ] || fail "no $SUITE mirror in /etc/apt/sources.list*: set MQTTBED_LAB_VM_MIRROR (e.g. http://deb.debian.org/debian)"
    echo "$found"
}

mkdir -p "$cache"
# One build per digest at a time: a second caller waits, then finds it built.
exec 9>"$cache/$digest.lock"
flock 9
if [ -f "$out/manifest.json" ]; then echo "$out"; exit 0; fi

started=$SECONDS
work=$cache/$digest.build.$$
root=$work/root
cleanup() {
    # debootstrap mounts proc and sys inside the target; never leave them behind
    for m in "$root/proc" "$root/sys" "$root/dev/pts"; do
        mountpoint -q "$m" 2>/dev/null && umount -l "$m"
    done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
mkdir -p "$work"

packages=$(sed 's/#.*//' "$here/packages.txt" | xargs | tr ' ' ',')
source_mirror=$(mirror)
echo "lab-vm build $digest: debootstrap $SUITE from $source_mirror" >&2
debootstrap --variant=minbase --components=main --include="$packages" \
    "$SUITE" "$root" "$source_mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 30 "$root/debootstrap/debootstrap.log" >&2
    fail "debootstrap failed (its log's tail above)"
}
bootstrapped=$SECONDS

# --- configure the guest -------------------------------------------------------------
echo mqttbed-vm >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tmqttbed-vm\n' >"$root/etc/hosts"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$root/etc/fstab"

# root over SSH with the key made here only; one host key, known before the first boot
ssh-keygen -q -t ed25519 -N '' -C mqttbed-lab-vm -f "$work/client_key"
install -d -m 700 "$root/root/.ssh"
install -m 600 "$work/client_key.pub" "$root/root/.ssh/authorized_keys"
rm -f "$root"/etc/ssh/ssh_host_*
ssh-keygen -q -t ed25519 -N '' -C mqttbed-vm -f "$root/etc/ssh/ssh_host_ed25519_key"
cp "$root/etc/ssh/ssh_host_ed25519_key.pub" "$work/host_key.pub"
cat >"$root/etc/ssh/sshd_config.d/mqttbed.conf" <<'EOF'
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 50
EOF

# eth0's address comes from the kernel command line (ip=ADDR:::MASK:HOST:eth0:off), which
# systemd-network-generator turns into a networkd unit; nothing waits for "online"
chroot "$root" systemctl enable systemd-networkd.service systemd-network-generator.service \
    >/dev/null 2>&1
ln -sf /dev/null "$root/etc/systemd/system/systemd-networkd-wait-online.service"
# chrony has no server to reach until the lab gives it one (nothing leaves the lab)
sed -i 's/^pool /#pool /' "$root/etc/chrony/chrony.conf"

rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
kernel_release=$(ls "$root/lib/modules" | sort -V | tail -n 1)
cp "$root/boot/vmlinuz-$kernel_release" "$work/vmlinuz"
cp "$root/boot/initrd.img-$kernel_release" "$work/initrd.img"
configured=$SECONDS

# --- the image: room for what provisioning adds (a venv, a wheelhouse, the engine) ----
for m in "$root/proc" "$root/sys" "$root/dev/pts"; do
    mountpoint -q "$m" 2>/dev/null && umount -l "$m"
done
used_mb=$(du -sm --one-file-system "$root" | cut -f1)
size_mb=$(( used_mb * 5 / 4 + 1536 ))
mkfs.ext4 -q -F -L mqttbed-vm -m 0 -d "$root" "$work/rootfs.raw" "${size_mb}M"
imaged=$SECONDS

cat >"$work/manifest.json" <<EOF
{
  "digest": "$digest",
  "suite": "$SUITE",
  "mirror": "$source_mirror",
  "kernel_release": "$kernel_release",
  "packages": "$packages",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "debootstrap_s": $((bootstrapped - started)),
  "configure_s": $((configured - bootstrapped)),
  "mkfs_s": $((imaged - configured)),
  "build_s": $((imaged - started)),
  "root_used_mb": $used_mb,
  "image_mb": $size_mb
}
EOF
rm -rf --one-file-system "$root"
mkdir -p "$out"
mv "$work"/{rootfs.raw,vmlinuz,initrd.img,client_key,client_key.pub,host_key.pub} "$out/"
mv "$work/manifest.json" "$out/manifest.json"   # last: its presence means "built"
echo "lab-vm build $digest: $((imaged - started)) s (kernel $kernel_release)" >&2
echo "$out"
