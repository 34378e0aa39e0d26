"""What mqttbed-forkpipe writes into its run directory: its log and sanitizer reports.

Every process of the broker logs to one file, one ``write()`` per line. The sanitizer
build writes one report file per process that had a finding (a memory error, undefined
behaviour, or a leak at exit), which is how a finding in a forked child is not lost.
"""

from __future__ import annotations

from pathlib import Path

LOG_NAME = "broker.log"
SANITIZER_PREFIX = "sanitizer"
# Lines the broker writes when the machine refuses it a process: the run cannot be valid.
PROCESS_FAILURES = ("cannot fork", "cannot start a subscription process")


class BrokerReports:
    """Scans one deploy's log for refused processes (new lines only) and reads sanitizer reports."""

    def __init__(self, workdir: Path, sanitizers: bool):
        self.workdir = workdir
        self.sanitizers = sanitizers
        self._scanned_bytes = 0
        self._process_failure: str | None = None

    @property
    def log_path(self) -> Path:
        """The file the broker's stdout and stderr go to."""
        return self.workdir / LOG_NAME

    def sanitizer_env(self) -> dict[str, str] | None:
        """Environment that sends sanitizer reports to per-process files, or None."""
        if not self.sanitizers:
            return None
        prefix = self.workdir / SANITIZER_PREFIX
        return {"ASAN_OPTIONS": f"log_path={prefix}:detect_leaks=1:abort_on_error=0",
                "UBSAN_OPTIONS": f"log_path={prefix}:print_stacktrace=1:halt_on_error=1"}

    def process_failure(self) -> str | None:
        """Return the first line saying the broker could not create a process, if any.

        Cheap enough to call every few milliseconds: only text added since the last call
        is read.
        """
        if self._process_failure is not None:
            return self._process_failure
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._scanned_bytes)
                new = log.read()
        except OSError:
            return None
        complete = new[:new.rfind(b"\n") + 1]
        self._scanned_bytes += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if any(marker in line for marker in PROCESS_FAILURES):
                self._process_failure = line
                break
        return self._process_failure

    def sanitizer_reports(self) -> list[str]:
        """Return the text of every sanitizer report written so far (none without sanitizers)."""
        if not self.sanitizers:
            return []
        reports = []
        for path in sorted(self.workdir.glob(f"{SANITIZER_PREFIX}.*")):
            try:
                reports.append(path.read_text(errors="replace"))
            except OSError:
                continue
        return reports
