"""The console's capture path merges with the CLI's code, inside a running Textual app.

Textual replaces ``sys.stderr`` with a capture whose ``fileno()`` is -1; the
merge's process pool then failed to start ("bad value(s) in fds_to_keep") and
left ``/dev/shm/sem.mp-*`` behind. Run in a fresh interpreter: a resource tracker
already started by another test in this process would hide the failure.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import subprocess
import sys

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"

SCRIPT = """
import asyncio, pathlib, sys
from textual.app import App
from tuiprof.analysis.trace_merge import merge_capture
from tuiprof.model.capture import ClusterCapture, FetchedFile, HostProgress

corpus, output = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
host = HostProgress("127.0.0.1:1")
host.files = [FetchedFile(host.host, 100 + rank, rank, f"r{rank}", corpus / f"hta_nccl_rank{rank}.json.gz")
              for rank in (0, 1)]

async def main():
    async with App().run_test():
        assert sys.stderr.fileno() == -1, "not inside Textual's stderr capture"
        # What TracesScreen._run does once the files are fetched.
        merged, summary = await asyncio.to_thread(merge_capture, ClusterCapture(0, [host]), output)
    print(merged.output, [r.rank for r in summary.ranks], file=sys.__stdout__)

asyncio.run(main())
"""


def _semaphores() -> set[str]:
    return {p.name for p in pathlib.Path("/dev/shm").glob("sem.mp-*")}


def test_merge_inside_the_console_uses_the_cli_code_and_a_process_pool(tmp_path):
    before = _semaphores()
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(CORPUS), str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / "merged.trace.json.gz"), "[0,", "1]"]
    merged = json.loads(gzip.decompress((tmp_path / "merged.trace.json.gz").read_bytes()))
    assert {r["rank"] for r in merged["tuiprof"]["ranks"]} == {0, 1}
    assert _semaphores() <= before
