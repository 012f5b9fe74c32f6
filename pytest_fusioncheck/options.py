"""Options, ini keys and markers: the table, the one precedence rule, the validation.

Every ``--fusion-<name>`` option has an ini twin ``fusioncheck_<name>`` sharing its help
text; ``get_option`` resolves command line over ini over default, and every error names
where the bad value came from (the flag, the ini key, or the test and marker). No torch
import: the plugin loads this module into every pytest run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from .baseline import DEFAULT_PATH as DEFAULT_BASELINE
from .budget import parse_bytes
from .graph_replay import MODES as GRAPH_REPLAY_MODES
from .state import Settings

# name -> (help, kind, default). One text serves the CLI option and its ini key.
OPTIONS: dict[str, tuple[str, str, Any]] = {
    "device": ('device to profile on: "cuda", "cuda:<index>" or "cpu" (default: cuda when a GPU is present, else cpu; under pytest-xdist with several GPUs, worker gw<i> takes GPU i mod count)', "string", None),
    "warmup": ("unprofiled calls before the profiled one (default 1)", "string", "1"),
    "peak_bandwidth": ('peak memory bandwidth in bytes/s, e.g. 4.25e12 or "4250 GB/s" (default: measured once per device with a large copy)', "string", None),
    "counters": ('hardware byte counters: "none" (default) or "ncu" (re-run the selected tests under Nsight Compute)', "string", "none"),
    "baseline": ("compare kernel counts and bytes with a committed baseline JSON file (default path .fusioncheck-baseline.json)", "string", None),
    "update_baseline": ("write the baseline file at the end of the session (atomically)", "bool", False),
    "baseline_strict": ("with --fusion-baseline: a test that has no entry in the baseline fails", "bool", False),
    "json": ("write every fusion report of the session to this JSON file", "string", None),
    "trace_dir": ("write Chrome traces of failing profiled regions into this directory", "string", None),
    "roofline": ("write a roofline plot (PNG/SVG) of the session's kernels to this path", "string", None),
    "html": ("write one self-contained HTML page of every profiled test's reports (module summaries, headroom, full kernel tables) to this path", "string", None),
    "report": ("print the kernel table of every profiled test in the terminal summary", "bool", False),
    "graph_replay": (
        'replay profiled calls from a CUDA graph and report the graph time a call beside the eager wall time: '
        '"auto" (the flag alone: reports that are launch-bound), "all" (every profiled call) or "off" (default); '
        "fusion.profile(fn, ..., graph_replay=True) asks for one call",
        "string",
        "off",
    ),
    "require_gpu": ("a test that would profile on CUDA (--fusion-device cuda, or a GPU job) fails when no GPU is usable, instead of being skipped; a GPU CI job with a broken driver then goes red, not green with everything skipped", "bool", False),
    "enforce_cpu_timing": ("enforce bandwidth assertions on CPU too (default: reported only)", "bool", False),
    "torch_logs": ("keep torch's DEBUG log records in the captured logs of tests that use a fusion feature (default: dropped, so failures show the kernel table)", "bool", False),
}

MARKERS = (
    "max_kernels(n, *, cpu=None, cuda=None): every fusion report of the test has at most n kernels "
    "(a per-device value wins); without the fusion fixture the test body itself is profiled",
    'max_hbm_bytes(n): modelled (or measured, with counters on) HBM bytes at most n; int or string such as "128 MiB"',
    "bandwidth_bound(fraction): every report reaches at least this fraction (0, 1] of peak bandwidth "
    "(enforced on GPUs; reported on CPU)",
    "fusion_headroom(fraction): what fusing each report's memory-bound chains would save is at most this "
    "fraction [0, 1] of its device time (GPU) or of its modelled bytes (CPU)",
    "max_launch_overhead(fraction): (GPU) wall time not covered by device time is at most this fraction (0, 1] "
    "of each report's wall time (reported, not enforced, on CPU)",
    "no_graph_breaks: any TorchDynamo graph break during the test fails it, naming each break's reason and file:line",
    "no_host_syncs: a device-to-host synchronisation (.item(), .cpu(), nonzero, an explicit synchronize) in a "
    "profiled region fails the test with its line (measured on GPUs; on CPU the ops that sync on a GPU)",
    "max_recompiles(n): more than n TorchDynamo recompilations during the test fail it, naming each failed guard and its function's line",
)
FUSION_MARKERS = (
    "max_kernels", "max_hbm_bytes", "bandwidth_bound", "fusion_headroom", "max_launch_overhead", "no_graph_breaks",
    "no_host_syncs", "max_recompiles",
)
DEVICES = ("cuda", "cpu")
# Flags whose value may be left out: name -> (the value the flag alone gives, metavar).
OPTIONAL_VALUE = {"baseline": (DEFAULT_BASELINE, "PATH"), "graph_replay": ("auto", "MODE")}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("fusioncheck", "kernel-fusion regression checks (pytest-fusioncheck)")
    for name, (help_text, kind, default) in OPTIONS.items():
        flag = "--fusion-" + name.replace("_", "-")
        if name in OPTIONAL_VALUE:
            const, metavar = OPTIONAL_VALUE[name]
            group.addoption(flag, action="store", nargs="?", const=const, default=None, metavar=metavar, help=help_text)
        elif kind == "bool":
            group.addoption(flag, action="store_true", default=None, help=help_text)
        else:
            group.addoption(flag, action="store", default=None, help=help_text)
        parser.addini(f"fusioncheck_{name}", help_text, type="bool" if kind == "bool" else "string", default=default)


def get_option(config: pytest.Config, name: str) -> Any:
    """Command line over ini over default: the one precedence rule for every option."""
    value = config.getoption("fusion_" + name)
    if value is not None:
        return value
    return config.getini(f"fusioncheck_{name}")


def where(config: pytest.Config, name: str) -> str:
    """Where an option's value came from, as the user wrote it: the flag or the ini key."""
    if config.getoption("fusion_" + name, None) is not None:
        return "--fusion-" + name.replace("_", "-")
    return f"fusioncheck_{name} (ini file)"


def _warmup(config: pytest.Config) -> int:
    raw = get_option(config, "warmup")
    try:
        value = int(raw)
        if value < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--fusion-warmup / fusioncheck_warmup must be a non-negative int, got {raw!r}") from None
    return value


def _peak(config: pytest.Config) -> float | None:
    raw = get_option(config, "peak_bandwidth")
    if raw in (None, ""):
        return None
    text = str(raw).strip()
    try:
        value = float(parse_bytes(text[:-2])) if text.lower().endswith("/s") else float(text)
        if value <= 0:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(
            f"--fusion-peak-bandwidth: cannot read {raw!r}; give bytes/s (4.25e12) or a rate such as '4250 GB/s'"
        ) from None
    return value


def _is_cuda_index(device: str) -> bool:
    return device.startswith("cuda:") and device[5:].isdigit()


def settings_from_config(config: pytest.Config) -> Settings:
    """The session's ``Settings``, every option validated (a ``UsageError`` names the source)."""
    device = get_option(config, "device") or None
    if device in ("", "auto"):
        device = None
    if device is not None and device not in DEVICES and not _is_cuda_index(device):
        raise pytest.UsageError(f"{where(config, 'device')} must be 'cuda', 'cuda:<index>' or 'cpu', got {device!r}")
    counters = str(get_option(config, "counters") or "none")
    if counters not in ("none", "ncu"):
        raise pytest.UsageError(f"{where(config, 'counters')} must be 'none' or 'ncu', got {counters!r}")
    if counters == "ncu" and (config.getoption("numprocesses", None) or hasattr(config, "workerinput")):
        raise pytest.UsageError(
            f"{where(config, 'counters')} ncu does not run under pytest-xdist (-n): ncu re-runs the "
            "selected tests once, serially, in one child process; drop -n for the counters run"
        )
    graph_replay = str(get_option(config, "graph_replay") or "off").strip().lower()
    if graph_replay not in GRAPH_REPLAY_MODES:
        raise pytest.UsageError(
            f"{where(config, 'graph_replay')} must be 'off', 'auto' (launch-bound reports) or 'all', got {get_option(config, 'graph_replay')!r}"
        )
    return Settings(
        enforce_cpu_timing=bool(get_option(config, "enforce_cpu_timing")),
        peak_bandwidth=_peak(config),
        counters=counters,
        warmup=_warmup(config),
        device=device,
        peak_cache=getattr(config, "cache", None),
        trace_dir=get_option(config, "trace_dir") or None,
        torch_logs=bool(get_option(config, "torch_logs")),
        graph_replay=graph_replay,
        require_gpu=bool(get_option(config, "require_gpu")),
    )


def uses_fusion(item: pytest.Item) -> bool:
    """Whether a test requests the fixture or carries a fusion marker."""
    if "fusion" in getattr(item, "fixturenames", ()):
        return True
    return any(item.get_closest_marker(m) is not None for m in FUSION_MARKERS)


# --------------------------------------------------------------------------- markers


class MarkerError(ValueError):
    pass


@dataclass
class Limits:
    """A test's fusion markers, validated."""

    max_kernels: int | None = None
    max_kernels_by_device: dict[str, int] = field(default_factory=dict)
    has_max_kernels: bool = False
    max_hbm_bytes: int | None = None
    bandwidth_fraction: float | None = None
    headroom_fraction: float | None = None
    launch_fraction: float | None = None
    no_graph_breaks: bool = False
    no_host_syncs: bool = False
    max_recompiles: int | None = None

    @property
    def profiled(self) -> bool:
        return (
            self.has_max_kernels
            or self.no_host_syncs
            or self.max_hbm_bytes is not None
            or self.bandwidth_fraction is not None
            or self.headroom_fraction is not None
            or self.launch_fraction is not None
        )

    def kernel_limit(self, device: str) -> int | None:
        return self.max_kernels_by_device.get(device, self.max_kernels)

    def needs_timing(self, device: str) -> bool:
        """Whether a marker judges a time on ``device`` (headroom is a byte share on CPU)."""
        return (
            self.bandwidth_fraction is not None
            or self.launch_fraction is not None
            or (self.headroom_fraction is not None and device == "cuda")
        )


# Names that read or judge a timed figure: a test whose code (or a function of its module it
# calls) names one has its calls timed (docs/bytes.md, "Time").
TIMING_NAMES = frozenset({
    "assert_bandwidth_bound_within", "assert_fusion_headroom_within", "efficiency", "benchmark",
    "median_time_s", "median_wall_time_s", "launch_overhead_s", "launch_overhead_share", "launch_bound",
    "graph_recovered_share",
})


def _code_names(code: Any) -> set[str]:
    """The names a code object and the code nested in it (lambdas, inner functions) use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def names_timing(item: pytest.Item, depth: int = 2) -> bool:
    """Whether the test function's code, or a function of its module it calls (to
    ``depth`` calls down), names a timed figure or a timing assertion (``TIMING_NAMES``)."""
    import inspect

    fn = getattr(item, "obj", None)
    scope = getattr(getattr(item, "module", None), "__dict__", {})
    seen: set[int] = set()
    todo = [(fn, 0)]
    while todo:
        fn, level = todo.pop()
        code = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None) if callable(fn) else None
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        names = _code_names(code)
        if names & TIMING_NAMES:
            return True
        if level < depth:
            todo += [(scope[n], level + 1) for n in names if inspect.isfunction(scope.get(n))]
    return False


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MarkerError(f"{what} must be a non-negative int, got {value!r}")
    return value


def _fraction(item: pytest.Item, marker: str, fail: Any, *, zero_ok: bool, what: str = "") -> float | None:
    """The one fraction a marker takes, in (0, 1] (or [0, 1] with ``zero_ok``), else ``None``."""
    mark = item.get_closest_marker(marker)
    if mark is None:
        return None
    if len(mark.args) != 1 or mark.kwargs:
        raise fail(marker, f"takes exactly one fraction, got args={mark.args!r} kwargs={mark.kwargs!r}")
    fraction = mark.args[0]
    low_ok = fraction == 0 if zero_ok else False
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (0 < fraction <= 1 or low_ok):
        bounds = "[0, 1]" if zero_ok else "(0, 1]"
        raise fail(marker, f"fraction must be a number in {bounds}{what}, got {fraction!r}")
    return float(fraction)


def parse_limits(item: pytest.Item) -> Limits:
    """Read and validate the fusion markers of ``item``; errors name the test and marker."""
    limits = Limits()

    def fail(marker: str, message: str) -> MarkerError:
        return MarkerError(f"{item.nodeid}: @pytest.mark.{marker}: {message}")

    mark = item.get_closest_marker("max_kernels")
    if mark is not None:
        limits.has_max_kernels = True
        unknown = set(mark.kwargs) - set(DEVICES)
        if unknown:
            raise fail("max_kernels", f"unknown keyword(s) {', '.join(sorted(unknown))}; accepted: cpu=, cuda=")
        if len(mark.args) > 1:
            raise fail("max_kernels", f"takes one positional count, got {len(mark.args)}: {mark.args!r}")
        try:
            if mark.args:
                limits.max_kernels = _count(mark.args[0], "n")
            for dev in DEVICES:
                if mark.kwargs.get(dev) is not None:
                    limits.max_kernels_by_device[dev] = _count(mark.kwargs[dev], f"{dev}=")
        except MarkerError as exc:
            raise fail("max_kernels", str(exc)) from None
        if limits.max_kernels is None and not limits.max_kernels_by_device:
            raise fail("max_kernels", "needs a count: max_kernels(n) or max_kernels(cpu=..., cuda=...)")
    mark = item.get_closest_marker("max_hbm_bytes")
    if mark is not None:
        if len(mark.args) != 1 or mark.kwargs:
            raise fail("max_hbm_bytes", f"takes exactly one byte count, got args={mark.args!r} kwargs={mark.kwargs!r}")
        try:
            limits.max_hbm_bytes = parse_bytes(mark.args[0])
        except ValueError as exc:
            raise fail("max_hbm_bytes", str(exc)) from None
    limits.bandwidth_fraction = _fraction(item, "bandwidth_bound", fail, zero_ok=False, what=" (a share of peak bandwidth)")
    limits.headroom_fraction = _fraction(item, "fusion_headroom", fail, zero_ok=True)
    limits.launch_fraction = _fraction(item, "max_launch_overhead", fail, zero_ok=False)
    mark = item.get_closest_marker("no_graph_breaks")
    if mark is not None:
        if mark.args or mark.kwargs:
            raise fail("no_graph_breaks", f"takes no arguments, got args={mark.args!r} kwargs={mark.kwargs!r}")
        limits.no_graph_breaks = True
    mark = item.get_closest_marker("no_host_syncs")
    if mark is not None:
        if mark.args or mark.kwargs:
            raise fail("no_host_syncs", f"takes no arguments, got args={mark.args!r} kwargs={mark.kwargs!r}")
        limits.no_host_syncs = True
    mark = item.get_closest_marker("max_recompiles")
    if mark is not None:
        if len(mark.args) != 1 or mark.kwargs:
            raise fail("max_recompiles", f"takes exactly one count, got args={mark.args!r} kwargs={mark.kwargs!r}")
        try:
            limits.max_recompiles = _count(mark.args[0], "n")
        except MarkerError as exc:
            raise fail("max_recompiles", str(exc)) from None
    return limits
