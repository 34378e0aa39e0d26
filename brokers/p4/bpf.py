"""Pinned eBPF maps read and written through the bpf() system call (ctypes, no bpftool).

A table update from the controller is one syscall (microseconds) instead of a bpftool
process (milliseconds), which matters when a burst of SUBACKs arrives at once.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

from mqttbed.core.errors import MqttbedError

BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "armv7l": 386}
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM = 1, 2, 3
BPF_MAP_GET_NEXT_KEY, BPF_OBJ_GET, BPF_OBJ_GET_INFO_BY_FD = 4, 7, 15
BPF_ANY = 0
ENOENT = 2


class BpfError(MqttbedError):
    """A bpf() call failed; the message names the operation, the map and the errno."""


class _ElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _ObjGetAttr(ctypes.Structure):
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32),
                ("file_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


class _MapInfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


PERCPU_TYPES = {5, 6, 10}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    number = BPF_SYSCALL.get(platform.machine())
    if number is None:
        raise BpfError(f"no bpf() syscall number known for {platform.machine()}")
    result = _libc.syscall(number, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def possible_cpus() -> int:
    """How many per-CPU slots a per-CPU map value has (``/sys/devices/system/cpu/possible``)."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    total = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total


class PinnedMap:
    """One eBPF map opened from its bpffs pin; keys and values are raw bytes."""

    def __init__(self, path: Path):
        self.path = path
        name = str(path).encode()
        attr = _ObjGetAttr(pathname=ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p).value)
        try:
            self.fd = _bpf(BPF_OBJ_GET, attr)
        except OSError as exc:
            raise BpfError(f"cannot open the pinned map {path}: {exc.strerror} (is the data "
                           "plane loaded, and is this root?)") from None
        info = _MapInfo()
        _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=self.fd, info_len=ctypes.sizeof(info),
                                               info=ctypes.addressof(info)))
        self.key_size, self.value_size = info.key_size, info.value_size
        self.per_cpu = info.type in PERCPU_TYPES
        self._slot = (info.value_size + 7) // 8 * 8
        self._buffer_size = self._slot * possible_cpus() if self.per_cpu else info.value_size

    def close(self) -> None:
        """Release the map's file descriptor (the pin keeps the map)."""
        os.close(self.fd)

    def _elem(self, what: str, cmd: int, key: bytes, value: ctypes.Array | None,
              flags: int = 0) -> bool:
        """One element command; False if the key is absent, BpfError on any other failure."""
        if len(key) != self.key_size:
            raise BpfError(f"{self.path.name}: key of {len(key)} bytes, map wants "
                           f"{self.key_size}")
        key_buf = ctypes.create_string_buffer(key, len(key))
        try:
            _bpf(cmd, _ElemAttr(map_fd=self.fd, key=ctypes.addressof(key_buf),
                                value=ctypes.addressof(value) if value is not None else 0,
                                flags=flags))
        except OSError as exc:
            if exc.errno == ENOENT:
                return False
            raise BpfError(f"{what} {self.path.name} failed: {exc.strerror}") from None
        return True

    def update(self, key: bytes, value: bytes) -> None:
        """Insert or replace ``key``'s value."""
        if len(value) != self.value_size or self.per_cpu:
            raise BpfError(f"{self.path.name}: value of {len(value)} bytes, map wants "
                           f"{self.value_size} (per-CPU maps are read-only here)")
        self._elem("updating", BPF_MAP_UPDATE_ELEM, key,
                   ctypes.create_string_buffer(value, len(value)), BPF_ANY)

    def delete(self, key: bytes) -> bool:
        """Delete ``key``; return False if it was not there."""
        return self._elem("deleting from", BPF_MAP_DELETE_ELEM, key, None)

    def lookup(self, key: bytes) -> bytes | None:
        """The value of ``key`` (per-CPU maps: every CPU's slot, concatenated), or None."""
        value = ctypes.create_string_buffer(self._buffer_size)
        return value.raw if self._elem("reading", BPF_MAP_LOOKUP_ELEM, key, value) else None

    def lookup_sum(self, key: bytes) -> int:
        """A per-CPU u64 counter summed over the CPUs (0 if absent)."""
        raw = self.lookup(key)
        if raw is None:
            return 0
        return sum(int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), self._slot))

    def list_keys(self) -> list[bytes]:
        """Every key in the map."""
        found: list[bytes] = []
        current: bytes | None = None
        while True:
            next_key = ctypes.create_string_buffer(self.key_size)
            key_buf = ctypes.create_string_buffer(current or b"", self.key_size)
            attr = _ElemAttr(map_fd=self.fd, key=ctypes.addressof(key_buf) if current else 0,
                             value=ctypes.addressof(next_key))
            try:
                _bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except OSError as exc:
                if exc.errno == ENOENT:
                    return found
                raise BpfError(f"listing {self.path.name} failed: {exc.strerror}") from None
            current = next_key.raw
            found.append(current)
