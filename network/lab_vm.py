"""A lab host with its own kernel and clock: a Debian 12 VM under QEMU on a lab bridge.

The namespace lab (:mod:`mqttbed.network.lab`) shares this machine's kernel and clock;
this host does not. Its image is built by ``scripts/lab-vm/build.sh`` from Debian's own
packages (``make lab-vm``; cached by the digest of its recipe) and booted here, layout for
prefix ``P``::

    root namespace:  bridge ``Pbr`` with the lab address (.254 of a free 10.78.x.0/24), as
                     the namespace lab's; tap ``Pt0`` on it, opened here and handed to QEMU
    namespace P-vm0: nothing but QEMU itself (its only network is the tap's descriptor),
                     so the reaper of a prefix kills it with the namespace
    the guest:       Debian's linux-image-amd64 (6.1), ``eth0`` with .1 (from the kernel's
                     ``ip=``), sshd on port 22 with the image's host key, root's key the
                     image's client key; its root file system a qcow2 overlay of the
                     image, thrown away on ``down``

QEMU runs without KVM (TCG): ``/dev/kvm`` exists here, but Debian's kernel stopped after
"Probing EDD" under it (issue 45), and under TCG the guest's CLOCK_REALTIME and
CLOCK_MONOTONIC are its own kernel's, which is what this host is for. The guest has no
route beyond the lab's /24, and the bridge does not forward: nothing leaves the machine.

``python -m mqttbed.network.lab_vm up|down`` (``make lab-vm-up`` / ``make lab-vm-down``)
keeps the VM running between commands, its state in ``lab_vm.json`` of its directory;
``up`` prints the ``root@address`` to give ``mqttbed lab provision``.

``up --bridge B`` puts the guest on an existing lab bridge instead (a namespace lab's,
``make lab-up``), at .200 of its /24, out of the way of the namespace hosts' .1, .2, ...:
then one campaign can run agents both in namespaces (this machine's kernel and clock) and
in the guest (its own), and ``down`` leaves that bridge to its lab.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mqttbed.core.errors import MissingSystemDependency, MqttbedError, system_deps_hint
from mqttbed.core.procfs import is_live, process_strings
from mqttbed.network import netns
from mqttbed.network.commands import NetworkCommandError, ip
from mqttbed.network.lab import attach_to_bridge, create_bridge
from mqttbed.network.topology import leftovers, reap

# The recipe lives in the checkout (an editable install's network/ is beside scripts/).
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lab-vm" / "build.sh"
QEMU = "qemu-system-x86_64"
QEMU_IMG = "qemu-img"
STATE_FILE = "lab_vm.json"
GUEST_IFACE = "eth0"
GUEST_HOSTNAME = "mqttbed-vm"
DEFAULT_MEMORY_MB = 512
DEFAULT_CPUS = 1
BOOT_TIMEOUT_S = 300.0   # TCG on a busy two-core machine; a normal boot takes far less
TCG_CODE_CACHE_MB = 256
STOP_TIMEOUT_S = 5.0
SERIAL_TAIL_CHARS = 2000
SHARED_BRIDGE_HOST = 200   # the guest's host number on a namespace lab's bridge
# linux/if_tun.h
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


class LabVmError(MqttbedError):
    """Building, booting or stopping the lab VM failed; the message says where to look."""


@dataclass(frozen=True)
class VmImage:
    """A built image: its files and what its manifest says about them."""

    directory: Path
    kernel_release: str
    manifest: dict

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs.raw"

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def client_key(self) -> Path:
        return self.directory / "client_key"

    @property
    def host_key(self) -> str:
        """The guest sshd's public host key, ``type base64`` (a known_hosts entry's tail)."""
        fields = (self.directory / "host_key.pub").read_text().split()
        return f"{fields[0]} {fields[1]}"

    @classmethod
    def load(cls, directory: Path) -> VmImage:
        """The image built into ``directory`` (refused, naming the fix, if it is not one)."""
        manifest_path = directory / "manifest.json"
        if not manifest_path.is_file():
            raise LabVmError(f"--image {directory}: no manifest.json there, so no built "
                             "image; build one with `make lab-vm`")
        manifest = json.loads(manifest_path.read_text())
        return cls(directory=directory, kernel_release=manifest["kernel_release"],
                   manifest=manifest)


def build_image() -> VmImage:
    """Build the image with ``scripts/lab-vm/build.sh`` (instant when cached); return it."""
    return VmImage.load(run_build_script(BUILD_SCRIPT))


def run_build_script(script: Path) -> Path:
    """Run one of ``scripts/lab-vm``'s cached builds; return the directory it printed last.

    The script's progress goes to this process's stderr.
    """
    if not script.is_file():
        raise LabVmError(f"{script} not found: the image is built from an mqttbed "
                         "checkout; give a built image with --image DIR")
    done = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True,
                          check=False)
    if done.returncode != 0:
        raise LabVmError(f"{script} failed (exit {done.returncode}); its error is above")
    return Path(done.stdout.split()[-1])


@dataclass(frozen=True)
class VmState:
    """A booted VM: how to reach it, and what ``down`` must stop and remove."""

    prefix: str
    lab_address: str      # the bridge's: the controller's MQTTBED_LAB_ADDRESS
    address: str          # the guest's eth0
    bridge: str
    tap: str
    netns: str
    qemu_pid: int
    image: str
    kernel_release: str
    client_key: str
    known_hosts: str      # a known_hosts file pinning the guest's host key at its address
    serial_log: str
    memory_mb: int
    cpus: int
    boot_to_ssh_s: float

    @property
    def ssh_destination(self) -> str:
        return f"root@{self.address}"


class LabVm:
    """Boots one VM from an image on a lab bridge of its own; a context manager reaps it."""

    def __init__(self, image: VmImage, root: Path, *, prefix: str | None = None,
                 memory_mb: int = DEFAULT_MEMORY_MB, cpus: int = DEFAULT_CPUS,
                 boot_timeout_s: float = BOOT_TIMEOUT_S, bridge: str | None = None):
        self.image = image
        self.root = root
        self.prefix = prefix or "lb" + secrets.token_hex(3)[:5]
        self.memory_mb = memory_mb
        self.cpus = cpus
        self.boot_timeout_s = boot_timeout_s
        self.bridge, self.tap, self.netns = (f"{self.prefix}br", f"{self.prefix}t0",
                                             f"{self.prefix}-vm0")
        self.shared_bridge = bridge is not None
        if bridge is not None:
            self.bridge = bridge
        self.serial_log = root / "serial.log"
        self.state: VmState | None = None
        self._qemu: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LabVm:
        try:
            self.boot()
        except BaseException:
            self.reap()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.reap()

    def boot(self) -> VmState:
        """Create the bridge and tap, start QEMU and wait for the guest's sshd."""
        for program, package in ((QEMU, "qemu-system-x86"), (QEMU_IMG, "qemu-utils")):
            if shutil.which(program) is None:
                raise MissingSystemDependency(f"{program} not found: " + system_deps_hint(
                    "vm", package))
        self.root.mkdir(parents=True, exist_ok=True)
        # the prefix on disk before anything exists: `down` finds whatever was made
        (self.root / STATE_FILE).write_text(json.dumps({"prefix": self.prefix}))
        if self.shared_bridge:
            lab = bridge_address(self.bridge)
            address = str(lab.network.network_address + SHARED_BRIDGE_HOST)
        else:
            lab = create_bridge(self.bridge)
            address = str(lab.network.network_address + 1)
        overlay = self.root / "rootfs.qcow2"
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        str(self.image.rootfs), str(overlay)], check=True)
        known_hosts = self.root / "known_hosts"
        known_hosts.write_text(f"{address} {self.image.host_key}\n")
        netns.create(self.netns)
        tap_fd = _open_tap(self.tap)
        try:
            attach_to_bridge(self.tap, self.bridge)
            started = time.monotonic()
            with (self.root / "qemu.log").open("ab") as log:
                self._qemu = subprocess.Popen(
                    ["ip", "netns", "exec", self.netns,
                     *self._qemu_argv(address, lab.netmask, overlay, tap_fd)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    pass_fds=(tap_fd,), start_new_session=True)
        finally:
            os.close(tap_fd)   # QEMU holds it now; the tap goes away when QEMU exits
        self._wait_for_sshd(address, started)
        self.state = VmState(
            prefix=self.prefix, lab_address=str(lab.ip), address=address,
            bridge=self.bridge, tap=self.tap, netns=self.netns, qemu_pid=self._qemu.pid,
            image=str(self.image.directory), kernel_release=self.image.kernel_release,
            client_key=str(self.image.client_key), known_hosts=str(known_hosts),
            serial_log=str(self.serial_log), memory_mb=self.memory_mb, cpus=self.cpus,
            boot_to_ssh_s=round(time.monotonic() - started, 2))
        (self.root / STATE_FILE).write_text(json.dumps(asdict(self.state), indent=2))
        return self.state

    def _qemu_argv(self, address: str, netmask: ipaddress.IPv4Address, overlay: Path,
                   tap_fd: int) -> list[str]:
        mac = "52:54:00:" + ":".join(
            f"{b:02x}" for b in hashlib.sha256(self.prefix.encode()).digest()[:3])
        append = " ".join([
            "root=/dev/vda", "rw", "console=ttyS0", "net.ifnames=0", "panic=-1",
            # systemd-network-generator makes eth0's networkd unit from this; no gateway,
            # so the guest reaches the lab's /24 and nothing else
            f"ip={address}:::{netmask}:{GUEST_HOSTNAME}:{GUEST_IFACE}:off"])
        return [QEMU, "-name", self.netns, "-machine", "pc",
                # TCG's code cache defaults to 1 GiB of this machine's RAM; 256 MiB holds
                # what a booted guest runs
                "-accel", f"tcg,tb-size={TCG_CODE_CACHE_MB}",
                # TCG's own model of every feature it emulates; no host CPU is exposed
                "-cpu", "max", "-smp", str(self.cpus), "-m", str(self.memory_mb),
                # no monitor, no default devices: the serial port is a log file
                "-nodefaults", "-display", "none", "-serial", f"file:{self.serial_log}",
                "-no-reboot", "-rtc", "base=utc",
                "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
                "-append", append,
                "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe",
                "-netdev", f"tap,id=lab,fd={tap_fd}",
                "-device", f"virtio-net-pci,netdev=lab,mac={mac}",
                "-pidfile", str(self.root / "qemu.pid")]

    def _wait_for_sshd(self, address: str, started: float) -> None:
        assert self._qemu is not None
        deadline = started + self.boot_timeout_s
        while time.monotonic() < deadline:
            if self._qemu.poll() is not None:
                raise LabVmError(f"QEMU exited ({self._qemu.returncode}) before the guest's "
                                 f"sshd answered; {self._logs_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(
                    (address, 22), timeout=2.0) as s:
                s.settimeout(5.0)
                if s.recv(64).startswith(b"SSH-2.0"):
                    return
            time.sleep(0.5)
        raise LabVmError(f"the guest's sshd did not answer on {address}:22 within "
                         f"{self.boot_timeout_s:.0f} s of QEMU's start; {self._logs_tail()}")

    def _logs_tail(self) -> str:
        qemu_log = self.root / "qemu.log"
        parts = [f"QEMU's output ({qemu_log}): "
                 + (qemu_log.read_text(errors="replace")[-500:] if qemu_log.exists() else "")]
        serial = (self.serial_log.read_text(errors="replace")[-SERIAL_TAIL_CHARS:]
                  if self.serial_log.exists() else "(none yet)")
        parts.append(f"the serial console's tail ({self.serial_log}):\n{serial}")
        return "\n".join(parts)

    def reap(self) -> None:
        """Stop QEMU, then remove the namespace, the tap and the bridge (a shared one stays:
        its name does not start with this VM's prefix)."""
        if self._qemu is not None:
            stop_qemu(self._qemu.pid, self.netns)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._qemu.wait(timeout=STOP_TIMEOUT_S)   # our child: no zombie left
        reap(self.prefix)

    def leftovers(self) -> list[str]:
        """Whatever of this VM still exists on the machine (empty once reaped)."""
        return leftovers(self.prefix)


def bridge_address(bridge: str) -> ipaddress.IPv4Interface:
    """The lab address of an existing bridge (refused, naming the fix, if it has none)."""
    try:
        links = json.loads(ip("-j", "-4", "addr", "show", "dev", bridge))
    except NetworkCommandError as exc:
        raise LabVmError(f"--bridge {bridge}: no such link here ({exc}); give a lab's "
                         "bridge (`make lab-up` prints its prefix: the bridge is PREFIXbr) "
                         "or leave --bridge out for a bridge of the VM's own") from None
    addresses = [a for link in links for a in link.get("addr_info", [])]
    if not addresses:
        raise LabVmError(f"--bridge {bridge}: it has no IPv4 address, so it is no lab's "
                         "bridge; give one made by `make lab-up` or leave --bridge out")
    return ipaddress.IPv4Interface(f"{addresses[0]['local']}/{addresses[0]['prefixlen']}")


def _open_tap(name: str) -> int:
    """Create tap ``name`` and return its descriptor (the tap lives as long as it is open)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as exc:
        os.close(fd)
        raise LabVmError(f"creating tap {name} failed: {exc} (needs root and "
                         "/dev/net/tun)") from exc
    return fd


def stop_qemu(pid: int, name: str) -> None:
    """Stop the QEMU process ``pid`` if it is still the one named ``name`` (-name)."""
    argv = process_strings(pid, "cmdline") or []
    if name.encode() not in argv:
        return   # gone, or the pid is someone else's by now
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and is_live(pid):
            time.sleep(0.05)
        if not is_live(pid):
            return


def load(root: Path) -> dict:
    """The state ``up`` wrote into ``root``."""
    return json.loads((root / STATE_FILE).read_text())


def main(argv: list[str] | None = None) -> int:
    """``up --dir D`` boots the VM and leaves it running; ``down --dir D`` stops and reaps it."""
    parser = argparse.ArgumentParser(prog="python -m mqttbed.network.lab_vm")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot the lab VM (building its image if needed) on a "
                                   "private bridge")
    up.add_argument("--dir", type=Path, default=Path("data/lab-vm"))
    up.add_argument("--image", type=Path, help="a built image's directory (default: build "
                                               "or reuse the one of scripts/lab-vm)")
    up.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, help="guest RAM, MiB")
    up.add_argument("--cpus", type=int, default=DEFAULT_CPUS)
    up.add_argument("--timeout", type=float, default=BOOT_TIMEOUT_S,
                    help="seconds to wait for the guest's sshd")
    up.add_argument("--bridge", help="an existing lab bridge to join (a namespace lab's, "
                                     f"PREFIXbr), the guest at .{SHARED_BRIDGE_HOST}; "
                                     "default: a bridge of the VM's own")
    down = sub.add_parser("down", help="stop the VM in --dir and remove its bridge and tap")
    down.add_argument("--dir", type=Path, default=Path("data/lab-vm"))
    args = parser.parse_args(argv)
    if args.command == "up":
        if (args.dir / STATE_FILE).exists():
            parser.error(f"{args.dir / STATE_FILE} exists: a lab VM is up there; "
                         f"`make lab-vm-down` (or `down --dir {args.dir}`) first")
        if not 128 <= args.memory <= 16384:
            parser.error(f"--memory {args.memory}: between 128 and 16384 MiB")
        if not 1 <= args.cpus <= 8:
            parser.error(f"--cpus {args.cpus}: between 1 and 8")
        image = VmImage.load(args.image) if args.image else build_image()
        vm = LabVm(image, args.dir, memory_mb=args.memory, cpus=args.cpus,
                   boot_timeout_s=args.timeout, bridge=args.bridge)
        try:
            state = vm.boot()
        except BaseException:
            vm.reap()
            shutil.rmtree(args.dir, ignore_errors=True)
            raise
        print(f"lab VM {state.prefix}: controller address {state.lab_address}, guest "
              f"{state.ssh_destination} (kernel {state.kernel_release}), sshd answered "
              f"{state.boot_to_ssh_s:.1f} s after QEMU started")
        print(f"  ssh -i {state.client_key} -o UserKnownHostsFile={state.known_hosts} "
              f"{state.ssh_destination}")
        print(f"provision: mqttbed lab provision --key {state.client_key} --known-hosts "
              f"{state.known_hosts} vm-0={state.ssh_destination}")
        return 0
    state_path = args.dir / STATE_FILE
    if not state_path.exists():
        print(f"no lab VM in {args.dir} ({state_path} missing)", file=sys.stderr)
        return 1
    recorded = load(args.dir)
    if "qemu_pid" in recorded:   # else `up` died before QEMU ran: the reap below is all
        stop_qemu(recorded["qemu_pid"], recorded["netns"])
    reap(recorded["prefix"])
    shutil.rmtree(args.dir)
    print(f"lab VM in {args.dir} removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
