"""Fixtures for the native tests: the stand-in GPU libraries (compiled here
with gcc from tests/native/standins/), `tuiprof run` invocations, and cleanup
of the segments the processes started by a test leave in /dev/shm."""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Iterator

import pytest

from native.support import HOOK, STANDINS, build_cuda_standins, gcc, remove_rank_files


def _build(out: pathlib.Path, nccl_flags: tuple[str, ...] = ()) -> pathlib.Path:
    rpath = "-Wl,-rpath,$ORIGIN"
    build_cuda_standins(out)
    # cuBLAS depends on the runtime, as the real one does (it calls nothing of it: kept against --as-needed)
    gcc("-shared", "-fPIC", "-o", str(out / "libcublas.so"), str(STANDINS / "cublas.c"), f"-L{out}",
        "-Wl,--no-as-needed", "-lcudart", "-Wl,--as-needed", str(out / "libcuda.so.1"), rpath)
    gcc(*nccl_flags, "-shared", "-fPIC", "-o", str(out / "libnccl.so"), str(STANDINS / "nccl.c"), "-ldl",
        "-lpthread")
    gcc("-shared", "-fPIC", "-o", str(out / "libworkload.so"), str(STANDINS / "workload.c"), f"-L{out}",
        "-lcublas", "-lcudart", str(out / "libcuda.so.1"), "-lnccl", "-lm", "-lpthread", rpath)
    gcc("-o", str(out / "driver"), str(STANDINS / "driver.c"), "-ldl")
    return out


@pytest.fixture(scope="session")
def standins(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Directory with libcuda.so.1, libcudart.so, libcublas.so, libnccl.so (NCCL 2.28, profiler v5), libworkload.so, driver."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in GPU libraries")
    return _build(tmp_path_factory.mktemp("standins"))


@pytest.fixture(scope="session")
def standins_v4(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The same, with a stand-in NCCL 2.27 (profiler v4)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in GPU libraries")
    return _build(tmp_path_factory.mktemp("standins_v4"), ("-DSTANDIN_V4",))


@pytest.fixture
def cleanup_segments() -> Iterator[list[int]]:
    """Pids whose segments (and the files beside them) are removed after the test."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        remove_rank_files(pid)


@pytest.fixture(scope="session", autouse=True)
def hook_built() -> None:
    if not HOOK.is_file():
        pytest.fail(f"{HOOK} is missing: build it with `python setup.py build_ext --inplace`")
