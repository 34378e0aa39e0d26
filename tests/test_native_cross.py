"""The native load engine on the Pis' architectures (issue 27), checked on this x86_64
machine: ``make -C agents/native cross`` builds it for aarch64 and armhf with the host's
-Werror warnings, and its selftest (agents/native/tests/selftest.c) runs under qemu
user-mode emulation. What the engine encodes, what it makes of broker replies (generated
streams and the fuzz seeds and regressions) and a run through its loop against a real
Mosquitto must read the same as on this machine: a byte-order, type-width or alignment
difference would show as a line that differs. What it does not show: a Pi's timing or its
kernel (qemu-user runs arm instructions on this kernel)."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from mqttbed.agents.native import engine as native

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]  # the C cross compilers

FUZZ_INPUTS = sorted(str(p) for d in ("seeds", "regressions")
                     for p in (native.SOURCE_DIR / "fuzz" / d).iterdir()
                     if not p.name.startswith("."))
# architecture: (compiler, qemu, sysroot, ELF class, ELF machine)
ARCHS = {"aarch64": ("aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu", 2, 183),
         "armhf": ("arm-linux-gnueabihf-gcc", "qemu-arm", "/usr/arm-linux-gnueabihf", 1, 40)}
# qemu-user 7.2 answers ENOPROTOOPT to SO_TIMESTAMPING (it does not translate the option),
# so the engine under it falls back to user-space receive stamps, as it is built to
KERNEL_STAMPS_LINE = "kernel stamps on every socket: "


def _missing() -> list[str]:
    tools = [tool for compiler, qemu, _, _, _ in ARCHS.values() for tool in (compiler, qemu)]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    missing += [f"{sysroot}/include/stdio.h" for _, _, sysroot, _, _ in ARCHS.values()
                if not Path(sysroot, "include", "stdio.h").is_file()]
    return missing


if platform.machine() != "x86_64":
    pytest.skip(f"the arm cross check runs on x86_64, this is {platform.machine()}",
                allow_module_level=True)
if _missing():
    pytest.skip(f"no arm cross toolchain here (missing: {', '.join(_missing())}); "
                "scripts/system-deps.sh installs it (make install)", allow_module_level=True)


def _run(argv: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own process group; on a timeout the whole group is killed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """A fresh build: the host's selftest, and library and selftest for each arm."""
    build = tmp_path_factory.mktemp("native-cross")
    made = _run(["make", "-C", str(native.SOURCE_DIR), f"BUILD={build}", "selftest", "cross"],
                timeout_s=100)
    assert made.returncode == 0, made.stderr + made.stdout
    for compiler, *_ in ARCHS.values():
        assert f"{compiler} -O2 -g -std=c11" in made.stdout
        assert "-Wall -Wextra -Werror -Wshadow -Wformat=2" in made.stdout
    return build


def selftest(build: Path, arch: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """The selftest of ``arch`` under qemu (None: this machine's, natively)."""
    if arch is None:
        return _run([str(build / "selftest"), *args])
    _, qemu, sysroot, _, _ = ARCHS[arch]
    return _run([qemu, "-L", sysroot, str(build / arch / "selftest"), *args])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_cross_builds_are_elf_files_for_the_arm_cpu(build, arch):
    _, _, _, elf_class, machine = ARCHS[arch]
    for name in (native.LIBRARY_NAME, "selftest"):
        header = (build / arch / name).read_bytes()[:20]
        assert header[:4] == b"\x7fELF"
        assert (header[4], int.from_bytes(header[18:20], "little")) == (elf_class, machine), \
            f"{arch}/{name}: ELF class {header[4]}, machine {header[18:20].hex()}"


@pytest.fixture(scope="module")
def host_output(build) -> dict[str, str]:
    outputs = {}
    for mode, args in (("wire", []), ("replies", FUZZ_INPUTS)):
        done = selftest(build, None, mode, *args)
        assert done.returncode == 0, done.stderr
        outputs[mode] = done.stdout
    return outputs


def test_the_host_output_covers_the_engine_s_paths(host_output):
    # the comparison below is worth what these outputs hold
    wire = host_output["wire"]
    assert "varint 4 bytes, publish-prefix 10:30ffffff7f0003742f71" in wire  # 268,435,455
    # the third payload of selftest.c's wire(): every bit of each field in use
    assert (f"decoded 0 seq {0x0123456789ABCDEF ^ (2 << 59)} publisher {0xFEDCBA98 - 2} "
            f"t_pub {-2**63} t_intended {2**63 - 1}") in wire.splitlines()
    assert "parsed 49 of 49: PUBLISH qos 1 id 4660 topic t/q payload 40" in wire
    replies = host_output["replies"]
    assert replies.count("case ") == 300
    assert all(f"file {Path(p).name}:" in replies for p in FUZZ_INPUTS)
    assert replies.count("  delivery ") > 100
    assert replies.count("malformed packet from the broker") > 100
    assert "CONNACK refused" in replies and "SUBACK refused" in replies
    queued = [line for line in replies.splitlines() if line.startswith("  queued ")]
    for ack in ("4002", "5002", "7002"):  # PUBACK, PUBREC, PUBCOMP sent in answer
        assert any(ack in line for line in queued), ack
    assert "  edge 3 - 1 -" in replies


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["wire", "replies"])
def test_encoding_and_replies_read_the_same_under_qemu(build, host_output, arch, mode):
    done = selftest(build, arch, mode, *(FUZZ_INPUTS if mode == "replies" else []))
    assert done.returncode == 0, done.stderr
    host = host_output[mode].splitlines()
    emulated = done.stdout.splitlines()
    # the first line that differs (or where the shorter output ends)
    first = next((i for i, (a, b) in enumerate(zip(host, emulated, strict=False)) if a != b),
                 min(len(host), len(emulated)))
    assert emulated == host, (f"{arch} differs from the host at line {first + 1}:\n"
                              f"host:  {host[first] if first < len(host) else '(end)'}\n"
                              f"{arch}: {emulated[first] if first < len(emulated) else '(end)'}")


def _without_stamps_line(output: str) -> list[str]:
    return [line for line in output.splitlines() if not line.startswith(KERNEL_STAMPS_LINE)]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_run_through_mosquitto_under_qemu_delivers_every_message_as_on_the_host(
        build, broker, arch):
    host = selftest(build, None, "broker", broker.host, str(broker.port))
    assert host.returncode == 0, host.stdout + host.stderr
    emulated = selftest(build, arch, "broker", broker.host, str(broker.port))
    assert emulated.returncode == 0, emulated.stdout + emulated.stderr
    assert "run ended: done" in emulated.stdout
    for qos in (0, 1, 2):
        assert f"subscriber qos {qos}: 40 of 40 seqs delivered once, 4 warm-up" \
            in emulated.stdout
    assert "client 4 sent 40 acked 40 unique 0 deliveries 0 failed 0" in emulated.stdout
    assert _without_stamps_line(emulated.stdout) == _without_stamps_line(host.stdout)


# -- GPIO character device (uAPI v2) on arm: the structs and the engine's calls --------

FAKE_CHIP = Path(__file__).resolve().parent / "fakes" / "fake_gpiochip.c"
_LAYOUT_PROBE = r"""
#include <linux/gpio.h>
#include <stddef.h>
#include <stdio.h>
#define AT(type, field) printf(#type "." #field " %zu\n", offsetof(struct type, field))
int main(void) {
    printf("request %zu config %zu attribute %zu values %zu\n",
           sizeof(struct gpio_v2_line_request), sizeof(struct gpio_v2_line_config),
           sizeof(struct gpio_v2_line_config_attribute), sizeof(struct gpio_v2_line_values));
    AT(gpio_v2_line_request, consumer); AT(gpio_v2_line_request, config);
    AT(gpio_v2_line_request, num_lines); AT(gpio_v2_line_request, event_buffer_size);
    AT(gpio_v2_line_request, padding); AT(gpio_v2_line_request, fd);
    AT(gpio_v2_line_config, num_attrs); AT(gpio_v2_line_config, attrs);
    AT(gpio_v2_line_values, mask);
    printf("ioctls %lx %lx %lx\n", (unsigned long)GPIO_V2_GET_LINE_IOCTL,
           (unsigned long)GPIO_V2_LINE_SET_VALUES_IOCTL, (unsigned long)GPIO_GET_CHIPINFO_IOCTL);
    return 0;
}
"""


def _compile(compiler: str, args: list[str]) -> None:
    done = _run([compiler, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *args])
    assert done.returncode == 0, done.stderr


def _emulated(arch: str | None, program: Path, *args: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``program`` natively (None) or under qemu, with ``env`` set for it alone (qemu's
    -E: an LD_PRELOAD of the arm fake must reach the arm loader, not qemu itself)."""
    if arch is None:
        proc = subprocess.run([str(program), *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **(env or {})},
                              start_new_session=True)
        return proc
    _, qemu, sysroot, _, _ = ARCHS[arch]
    sets = [arg for name, value in (env or {}).items() for arg in ("-E", f"{name}={value}")]
    return _run([qemu, "-L", sysroot, *sets, str(program), *args])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_v2_uapi_structs_are_laid_out_on_arm_as_here(tmp_path, arch):
    # a 32-bit Raspberry Pi OS on a 64-bit kernel passes these structs unconverted
    (tmp_path / "probe.c").write_text(_LAYOUT_PROBE)
    _compile("gcc", ["-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")])
    _compile(ARCHS[arch][0], ["-o", str(tmp_path / f"probe-{arch}"), str(tmp_path / "probe.c")])
    host = _emulated(None, tmp_path / "probe")
    emulated = _emulated(arch, tmp_path / f"probe-{arch}")
    assert host.returncode == emulated.returncode == 0, emulated.stderr
    assert host.stdout.startswith("request 592 config 272 attribute 24 values 16\n")
    assert emulated.stdout == host.stdout


@pytest.mark.parametrize("arch", ARCHS)
def test_the_engine_drives_a_chip_s_lines_on_arm_as_on_the_host(build, tmp_path, arch):
    """The arm engine's line request and writes, through the fake chip built for arm."""
    outputs = {}
    for which in (None, arch):
        compiler = "gcc" if which is None else ARCHS[which][0]
        library = tmp_path / f"fake-{which or 'host'}.so"
        _compile(compiler, ["-shared", "-fPIC", "-o", str(library), str(FAKE_CHIP), "-ldl"])
        chip, log = tmp_path / f"chip-{which or 'host'}", tmp_path / f"log-{which or 'host'}"
        env = {"LD_PRELOAD": str(library), "FAKE_GPIOCHIP_PATH": str(chip),
               "FAKE_GPIOCHIP_LOG": str(log)}
        program = build / "selftest" if which is None else build / which / "selftest"
        done = _emulated(which, program, "gpio", str(chip), env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        seen = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
        outputs[which] = (done.stdout, seen)
    host_out, host_seen = outputs[None]
    assert host_seen[:2] == ["request mqttbed 2 3 40", "set 2 1"]
    assert host_seen.count("release 2 3 40") == 2 and "refused writes 0" in host_out
    assert outputs[arch] == outputs[None]
