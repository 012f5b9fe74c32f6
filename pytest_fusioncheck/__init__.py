"""pytest-fusioncheck: make "this chain is fused" a test that fails in CI.

Public names (README.md, "What you get"): ``profile``, ``FusionReport``, ``Kernel``, ``Budget`` and
the ``assert_*`` helpers. They are loaded lazily: this module is imported with the pytest
plugin in every pytest run, and must not import torch or triton.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "profile": "capture",
    "Region": "capture",
    "FusionCheckError": "capture",
    "ProfilerBusyError": "capture",
    "FusionReport": "report",
    "Kernel": "report",
    "Budget": "budget",
    "parse_bytes": "budget",
    "assert_max_kernels": "api",
    "assert_hbm_bytes_within": "api",
    "assert_bandwidth_bound_within": "api",
    "assert_fusion_headroom_within": "api",
    "assert_matches_reference": "api",
    "assert_no_graph_breaks": "api",
    "assert_no_host_syncs": "api",
    "FusionAssertionError": "verdict",
    "FusionCheckWarning": "verdict",
    "FusionCompatWarning": "_compat",
    "NoReportError": "state",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_fusioncheck' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
