"""The system calls a rank at rest needs every interval, alone: its held /proc/<pid>/status read and parsed (the real
uid), its header's words (``Segment.pulse``: pid, data_seq), one read of its CPU counter group, and the ``lstat`` of
its segment's name (owner, identity). ``N`` ``sleep``s with real segments in a private folder, all read in a loop
once every ``SLEEP`` seconds (cold, as the collector reads them); CPU time a rank, best and median of ten passes.

    .venv/bin/python bench/containers/ranks_syscalls.py 1600 1

The floor under the ranks collector's cost (bench/containers/README.md), whatever Python runs around them. Root.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from agentd import procfs  # noqa: E402
from agentd.collectors import pmu  # noqa: E402
from native.segment_forge import PID_OFFSET, START_NS_OFFSET, recorded_segment  # noqa: E402
from testkit.op_segments import with_ops  # noqa: E402
from tuiprof_native import segment  # noqa: E402

PASSES = 10


def main() -> None:
    ranks, sleep_s = int(sys.argv[1]), float(sys.argv[2])
    prefix = with_ops(recorded_segment(), 4)
    folder = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(ranks)]
    opened: list[tuple[int, segment.Segment, pmu.Counters, str]] = []
    try:
        time.sleep(0.3)  # each sleep has started: its start time is before its segment's
        for sleeper in sleepers:
            data = bytearray(prefix)
            struct.pack_into("<i", data, PID_OFFSET, sleeper.pid)
            struct.pack_into("<Q", data, START_NS_OFFSET, time.time_ns())
            path = folder / f"{segment.SEGMENT_PREFIX}0-{sleeper.pid}"
            path.write_bytes(data)
            os.truncate(path, segment.SEGMENT_SIZE)
            opened.append((os.open(f"/proc/{sleeper.pid}/status", os.O_RDONLY | os.O_CLOEXEC),
                           segment.Segment(str(path)), pmu.process_counters(sleeper.pid), str(path)))
        seconds = []
        for _ in range(PASSES):
            time.sleep(sleep_s)
            started = time.process_time()
            for status, seg, counters, path in opened:
                procfs.parse_status(os.pread(status, 4096, 0))
                seg.pulse()
                counters.software.sample()
                os.lstat(path)
            seconds.append(time.process_time() - started)
        print(f"{ranks} ranks read every {sleep_s} s: best {min(seconds) / ranks * 1e6:.1f} µs a rank, median "
              f"{statistics.median(seconds) / ranks * 1e6:.1f}; load average {os.getloadavg()[0]:.1f}")
    finally:
        for status, seg, counters, _ in opened:
            os.close(status)
            seg.close()
            counters.close()
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
