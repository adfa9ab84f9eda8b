"""GEMMs timed alone with PyTorch, for ``tuiprof gemm-replay``: torch is imported here, when a replay runs.

PyTorch is no dependency of tuiprof: without it (or without CUDA, for a ``cuda`` device) the replay
stops with one line saying what to install or do. Each shape runs as PyTorch would hand it to cuBLAS
with neither operand transposed: ``torch.mm(X[n,k], Y[k,m])`` is cuBLAS's C[m,n] = A[m,k]·B[k,n] with
A = Y, B = X (``torch.bmm`` for b > 1); int8 through ``torch._int_mm`` and fp8 through
``torch._scaled_mm``, the calls PyTorch has for them. Warm-up calls first (the first call loads
kernels and picks cuBLAS's algorithm), then each timed call between two CUDA events on the device's
stream, or with ``time.perf_counter`` on the CPU (where torch runs a GEMM before returning).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tuiprof.analysis.gemm_replay import TORCH_DTYPES, AloneFigure, GemmShape, NotReplayed, alone_figure
from tuiprof.errors import BadInputError, TuiprofError


WARMUP_BATCH = 10  # warm-up calls between two looks at the clock (and syncs of the GPU)

class TorchMissingError(TuiprofError):
    """PyTorch cannot be imported here; the message says what to install."""

    exit_code = 2  # the command cannot run at all, as when its embedded agent cannot start


class ReplayDeviceError(BadInputError):
    """The device named is not one this PyTorch can replay on (unknown, no CUDA, no such GPU)."""


def import_torch() -> ModuleType:
    try:
        with warnings.catch_warnings():  # a torch without numpy says so on import; the replay needs none
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch
    except ImportError as exc:
        raise TorchMissingError(f"the replay runs the shapes with PyTorch, which cannot be imported here ({exc}): "
                                "install it (`pip install torch`, a CUDA build to replay on a GPU)") from exc
    return torch


class TorchDevice:
    """One device the replay runs on, checked: CPU, or a CUDA GPU this PyTorch sees."""

    def __init__(self, name: str) -> None:
        self.torch = torch = import_torch()
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise ReplayDeviceError(f"--device {name}: not a torch device ({exc}); "
                                    "name a GPU (cuda:1) or the CPU (cpu)") from None
        if device.type == "cuda":
            device = torch.device("cuda", self._cuda_index(name, device))
            self.description = f"{device} ({torch.cuda.get_device_name(device)})"
        elif device.type == "cpu":
            self.description = "cpu"
        else:
            raise ReplayDeviceError(f"--device {name}: the replay runs on a CUDA GPU (cuda:N) or the CPU (cpu)")
        self.device = device

    def _cuda_index(self, name: str, device: Any) -> int:
        torch = self.torch
        if torch.version.cuda is None:
            raise ReplayDeviceError(f"--device {name}: this PyTorch ({torch.__version__}) is built without CUDA; "
                                    "install a CUDA build of PyTorch (https://pytorch.org/get-started/locally/) "
                                    "or replay on --device cpu")
        if not torch.cuda.is_available():
            raise ReplayDeviceError(f"--device {name}: PyTorch sees no CUDA GPU here (driver, or CUDA_VISIBLE_DEVICES?)")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= count:
            raise ReplayDeviceError(f"--device {name}: PyTorch sees {count} GPU(s) here, cuda:0 to cuda:{count - 1}")
        return int(index)

    def replay(self, shape: GemmShape, dtype: str, warmup_seconds: float, calls: int) -> AloneFigure | NotReplayed:
        """``shape`` in the hook's ``dtype``, timed alone; why not when torch or the device cannot run it."""
        torch = self.torch
        torch_dtype = getattr(torch, TORCH_DTYPES[dtype], None)
        if torch_dtype is None:
            return NotReplayed(f"this PyTorch ({torch.__version__}) has no torch.{TORCH_DTYPES[dtype]}")
        try:
            made = self._gemm(shape, dtype, torch_dtype)
            if isinstance(made, NotReplayed):
                return made
            gemm, how = made
            gemm()  # the first call: where torch refuses a dtype or the device runs out of memory
        except torch.cuda.OutOfMemoryError:
            return NotReplayed(f"{shape} in {dtype} does not fit in {self.device}'s free memory")
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return NotReplayed(f"PyTorch cannot run this on {self.device}: {message}")
        seconds = self._timed(gemm, warmup_seconds, calls)
        try:
            return alone_figure(shape, seconds, how)
        except ValueError as exc:
            return NotReplayed(str(exc))

    def _gemm(self, shape: GemmShape, dtype: str, torch_dtype: Any) -> tuple[Callable[[], Any], str] | NotReplayed:
        """The call that runs ``shape`` (operands made) and how it is named, or why there is none."""
        torch, on = self.torch, {"device": self.device}
        batch = (shape.b,) if shape.b > 1 else ()
        if dtype == "int8":
            if batch:
                return NotReplayed("batched int8 GEMMs: torch._int_mm takes 2-D operands only")
            x = torch.randint(-8, 8, (shape.n, shape.k), dtype=torch.int8, **on)
            y = torch.randint(-8, 8, (shape.k, shape.m), dtype=torch.int8, **on)
            return lambda: torch._int_mm(x, y), "torch._int_mm"
        if dtype.startswith("fp8"):
            if batch:
                return NotReplayed("batched fp8 GEMMs: torch._scaled_mm takes 2-D operands only")
            x = torch.randn(shape.n, shape.k, dtype=torch.bfloat16, **on).to(torch_dtype)
            y = torch.randn(shape.m, shape.k, dtype=torch.bfloat16, **on).to(torch_dtype).t()
            one = torch.ones((), dtype=torch.float32, **on)
            return (lambda: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16),
                    "torch._scaled_mm, B column-major (its only layout)")
        x = torch.randn(*batch, shape.n, shape.k, dtype=torch_dtype, **on)
        y = torch.randn(*batch, shape.k, shape.m, dtype=torch_dtype, **on)
        if batch:
            return lambda: torch.bmm(x, y), "torch.bmm"
        return lambda: torch.mm(x, y), "torch.mm"

    def _warm_up(self, gemm: Callable[[], Any], seconds: float) -> None:
        """Calls for ``seconds`` of wall time, the device's work included: a kernel of tens of µs needs
        thousands before an idle GPU's clocks are up, a large one a few."""
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            for _ in range(WARMUP_BATCH):
                gemm()
            if self.device.type == "cuda":
                self.torch.cuda.synchronize(self.device)

    def _timed(self, gemm: Callable[[], Any], warmup_seconds: float, calls: int) -> list[float]:
        """Seconds of each of ``calls`` calls after ``warmup_seconds`` of more (the first one already ran)."""
        torch = self.torch
        self._warm_up(gemm, warmup_seconds)
        if self.device.type == "cpu":
            seconds = []
            for _ in range(calls):
                start = time.perf_counter()
                gemm()
                seconds.append(time.perf_counter() - start)
            return seconds
        with torch.cuda.device(self.device):
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(calls)]
            for start, end in pairs:
                start.record()
                gemm()
                end.record()
            torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]
