"""Names of the profiler and NVTX ranges the plugin opens (one place, no imports).

``fusioncheck::op#<i>`` wraps each ATen op the op observer sees, ``fusioncheck::triton#<i>``
each interpreted Triton launch, ``fusioncheck::rep#<i>`` each timed repeat,
``fusioncheck::graph#<g>`` each call of a compiled graph's wrapper while a profiler runs,
``fusioncheck::call`` the profiled call itself, ``fusioncheck::sync#<i>`` each explicit CUDA
synchronize inside it (host_syncs.py); the NVTX range
``fusioncheck:<seq>:<label>`` wraps one profiled call (what ``--fusion-counters=ncu``
filters on).
"""

OP_RANGE_PREFIX = "fusioncheck::op#"
TRITON_RANGE_PREFIX = "fusioncheck::triton#"
REP_RANGE_PREFIX = "fusioncheck::rep#"
GRAPH_RANGE_PREFIX = "fusioncheck::graph#"
CALL_RANGE = "fusioncheck::call"
SYNC_RANGE_PREFIX = "fusioncheck::sync#"
NVTX_PREFIX = "fusioncheck:"


def nvtx_range_name(seq: int, label: str) -> str:
    """``fusioncheck:<seq>:<label>``: the NVTX range ncu filters and attributes kernels by."""
    return f"{NVTX_PREFIX}{seq}:{label}"
