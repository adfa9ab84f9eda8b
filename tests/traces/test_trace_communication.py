"""Which GPU kernels are communication, on real traces of each collective library (origins in data/README.md).

A kernel is communication when the profiler recorded it as a collective (Kineto's
``Collective name`` on it, or a collective op launched it: ``External id``), else
when its name is of a collective library's family; ``--like-hta`` counts HTA's
``nccl.*Kernel`` names only. Families with no public trace (vLLM's custom
all-reduce, MSCCL++, RCCL's ``rcclGenericKernel`` spelling, DeepEP's intranode
kernels) are checked by renaming the real multimem kernels of the B200 trace in
memory, with their link to the op removed so that only the name can tell.
"""

from __future__ import annotations

import gzip
import json
import pathlib
from collections.abc import Callable

import pytest

from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_summary import RankSummary, covered, summarize, union

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"
DEEPSEEK = "deepseek_v3_train_ep64_rank0.json.gz"  # DeepEP's dispatch/combine, no NCCL kernel
VLLM_B200 = "tracelens_b200_vllm_multimem_rank0.json.gz"  # symmetric-memory all-reduce under vllm::all_reduce
RCCL_MI300X = "tracelens_mi300x_rccl_rank0.json.gz"  # RCCL's ncclDevKernel_Generic with Collective name
MULTIMEM = "multimem_all_reduce_kernel"


def load(name: str) -> dict:
    return json.loads(gzip.decompress((CORPUS / name).read_bytes()))


def summary_of(document: dict, tmp_path: pathlib.Path, like_hta: bool = False) -> RankSummary:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(document))
    merged = merge_traces([TraceInput(path)], tmp_path / "m.json.gz", workers=1, timeline=False, like_hta=like_hta)
    [rank] = summarize(merged.ranks).ranks
    return rank


def kernels_union(document: dict, chosen: Callable[[dict], bool]) -> float:
    return covered(union([(e["ts"], e["ts"] + e["dur"]) for e in document["traceEvents"]
                          if e.get("cat") == "kernel" and chosen(e)]))


def renamed(document: dict, old: str, new: str, drop_args: tuple[str, ...] = ()) -> dict:
    """The document with every kernel whose name contains ``old`` named ``new``, without ``drop_args``."""
    for event in document["traceEvents"]:
        if event.get("cat") == "kernel" and old in event["name"]:
            event["name"] = new
            for arg in drop_args:
                event["args"].pop(arg, None)
    return document


def test_deepep_kernels_are_communication_by_their_family(tmp_path):
    document = load(DEEPSEEK)
    deepep = kernels_union(document, lambda e: "dpsk::ep::internode::" in e["name"])
    rank = summary_of(document, tmp_path)
    assert deepep > 0.8 * rank.span_us  # 113 of 129 ms
    assert rank.communication_us == pytest.approx(deepep, abs=1e-3)
    assert summary_of(document, tmp_path, like_hta=True).communication_us == 0  # HTA's 0 %


def test_symmetric_memory_all_reduce_is_communication_through_the_op_that_launched_it(tmp_path):
    document = load(VLLM_B200)
    launchers = {e["args"]["External id"] for e in document["traceEvents"]
                 if e.get("cat") == "cpu_op" and e["name"] == "symm_mem::multimem_all_reduce_"}
    multimem = [e for e in document["traceEvents"] if e.get("cat") == "kernel" and MULTIMEM in e["name"]]
    assert len(multimem) == 73 and all(e["args"]["External id"] in launchers for e in multimem)
    expected = kernels_union(document, lambda e: MULTIMEM in e["name"] or e["name"].startswith("nccl"))
    assert summary_of(document, tmp_path).communication_us == pytest.approx(expected, abs=1e-3)
    # A name no family has: still communication, because symm_mem::multimem_all_reduce_ launched it ...
    unknown = renamed(load(VLLM_B200), MULTIMEM, "void reduce_in_place_kernel<c10::BFloat16>(c10::BFloat16*)")
    assert summary_of(unknown, tmp_path).communication_us == pytest.approx(expected, abs=1e-3)
    # ... and compute once nothing records that (only the NCCL all-gather is left).
    unlinked = renamed(load(VLLM_B200), MULTIMEM, "void reduce_in_place_kernel<c10::BFloat16>(c10::BFloat16*)",
                       ("External id",))
    nccl = kernels_union(unlinked, lambda e: e["name"].startswith("nccl"))
    assert nccl < expected
    assert summary_of(unlinked, tmp_path).communication_us == pytest.approx(nccl, abs=1e-3)


def test_rccl_kernels_are_communication_by_their_collective_name_and_launching_op(tmp_path):
    document = load(RCCL_MI300X)
    rccl = kernels_union(document, lambda e: e["name"].startswith("ncclDevKernel_Generic"))
    assert summary_of(document, tmp_path).communication_us == pytest.approx(rccl, abs=1e-3)
    recorded = [e for e in document["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e["args"]]
    assert recorded and all(e["name"].startswith("ncclDevKernel_Generic") for e in recorded)
    # Renamed out of every family, the kernels with Collective name or an External id of record_param_comms stay
    # communication; the 5 queued before the capture (neither) become compute.
    anonymous = renamed(load(RCCL_MI300X), "ncclDevKernel_Generic", "void generic_kernel(void*)")
    ops = {e["args"]["External id"] for e in anonymous["traceEvents"]
           if e.get("cat") == "cpu_op" and e["name"] == "record_param_comms"}
    kept = kernels_union(anonymous, lambda e: e["name"] == "void generic_kernel(void*)" and (
        "Collective name" in e["args"] or e["args"].get("External id") in ops))
    assert 0 < kept < rccl
    assert summary_of(anonymous, tmp_path).communication_us == pytest.approx(kept, abs=1e-3)


# Kernel names as each library's sources and public kernel summaries spell them (demangled, as Kineto writes them).
FAMILIES_WITHOUT_A_PUBLIC_TRACE = [
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
    "__nv_bfloat16*, int, int)",
    "void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
    "__nv_bfloat16*, int, int)",
    "void allreduce7<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, "
    "mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, unsigned long, int, int, unsigned long, unsigned int)",
    "void rcclGenericKernel<1, false>(ncclDevKernelArgsStorage<4096ul>)",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*)",
    "void deep_ep::internode_ll::combine<false>(void*, void*, int*, void*, void const*, long const*, int const*)",
]


@pytest.mark.parametrize("kernel", FAMILIES_WITHOUT_A_PUBLIC_TRACE)
def test_families_without_a_public_trace_are_communication_by_name(kernel, tmp_path):
    document = renamed(load(VLLM_B200), MULTIMEM, kernel, ("External id",))
    expected = kernels_union(document, lambda e: e["name"] == kernel or e["name"].startswith("nccl"))
    assert summary_of(document, tmp_path).communication_us == pytest.approx(expected, abs=1e-3)
    like = summary_of(document, tmp_path, like_hta=True)
    hta_rule = kernels_union(document, lambda e: e["name"].startswith("nccl"))
    assert hta_rule < expected
    assert like.communication_us == pytest.approx(hta_rule, abs=1.0)  # µs-rounded, as HTA
