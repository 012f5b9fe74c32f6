"""Options, ini keys and markers: behaviour that mutation testing (docs/mutation.md) found no test pinning.

Each test states what a user sees go wrong when the plugin reads its settings: a flag or
ini key missing from --help or ignored, the wrong one winning, a bad value accepted or a
good one refused, an error that names the wrong source or the wrong words, a marker read
wrongly. Configurations are parsed in-process (no test session, nothing profiled).
"""

import pytest
from conftest import PLUGIN_ARGS

from pytest_fusioncheck import options, state
from pytest_fusioncheck.baseline import DEFAULT_PATH
from pytest_fusioncheck.options import OPTIONS, Limits, MarkerError, parse_limits, settings_from_config, uses_fusion


# Inner configurations: no cache (unless asked) and no unraisable-exception plugin, whose
# clean-up runs the garbage collector several times per configuration (slow with torch loaded).
INNER = ("-p", "no:cacheprovider", "-p", "no:unraisableexception", *PLUGIN_ARGS)


def _settings(pytester, *args, ini=None):
    """The session's settings as the plugin reads them at configure time."""
    if ini is not None:
        pytester.makeini("[pytest]\n" + ini + "\n")
    config = pytester.parseconfigure(*INNER, *args)
    return config.stash[state.SETTINGS]


def _usage_error(pytester, *args, ini=None):
    if ini is not None:
        pytester.makeini("[pytest]\n" + ini + "\n")
    with pytest.raises(pytest.UsageError) as info:
        pytester.parseconfigure(*INNER, *args)
    return str(info.value)


def _squeeze(text):
    return "".join(text.split())


# --- add_options: every flag and ini key, with its help ------------------------------------


def test_help_shows_every_flag_and_ini_key_with_its_own_help_text_and_type(pytester):
    """Catches the options' heading reworded, a flag or ini key renamed, its help text lost,
    its metavar changed, or an ini key declared with the wrong type (help wraps lines
    anywhere, so whitespace is ignored)."""
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *PLUGIN_ARGS, "--help")
    result.stdout.fnmatch_lines(["kernel-fusion regression checks (pytest-fusioncheck):"])
    text = _squeeze(result.stdout.str())
    for name, (help_text, kind, _) in OPTIONS.items():
        flag = "--fusion-" + name.replace("_", "-")
        optional = options.OPTIONAL_VALUE.get(name)
        shown = flag + (f"=[{optional[1]}]" if optional else "" if kind == "bool" else f"=FUSION_{name.upper()}")
        assert _squeeze(f"{shown} {help_text}") in text, name
        assert _squeeze(f"fusioncheck_{name} ({kind}): {help_text}") in text, name


def test_the_baseline_flag_alone_names_the_default_file_and_absent_names_none(pytester):
    """Catches --fusion-baseline without a path not falling back to the default file."""
    assert pytester.parseconfig(*INNER, "--fusion-baseline").getoption("fusion_baseline") == DEFAULT_PATH
    assert pytester.parseconfig(*INNER, "--fusion-baseline", "b.json").getoption("fusion_baseline") == "b.json"
    assert pytester.parseconfig(*INNER).getoption("fusion_baseline") is None


def test_ini_defaults_apply_when_neither_flag_nor_ini_key_is_given(pytester):
    """Catches an ini default changed: warmup 1, counters none, bool switches off."""
    config = pytester.parseconfig(*INNER)
    assert options.get_option(config, "warmup") == "1"
    assert options.get_option(config, "counters") == "none"
    assert options.get_option(config, "report") is False
    assert options.get_option(config, "device") is None


# --- get_option and where: the flag over the ini key over the default ----------------------


@pytest.mark.parametrize(
    "args, ini, warmup",
    [((), None, 1), ((), "fusioncheck_warmup = 3", 3), (("--fusion-warmup=2",), "fusioncheck_warmup = 3", 2), (("--fusion-warmup=0",), None, 0)],
    ids=["default", "ini", "flag over ini", "zero"],
)
def test_the_flag_wins_over_the_ini_key_which_wins_over_the_default(pytester, args, ini, warmup):
    """Catches the precedence reversed, an ini key ignored, and a warmup of 0 refused."""
    assert _settings(pytester, *args, ini=ini).warmup == warmup


@pytest.mark.parametrize(
    "args, ini, on",
    [
        ((), None, False),
        ((), "fusioncheck_enforce_cpu_timing = true", True),
        ((), "fusioncheck_enforce_cpu_timing = false", False),
        (("--fusion-enforce-cpu-timing",), "fusioncheck_enforce_cpu_timing = false", True),
    ],
    ids=["default", "ini true", "ini false", "flag over ini"],
)
def test_a_switch_is_on_by_its_flag_or_a_true_ini_key_and_off_otherwise(pytester, args, ini, on):
    """Catches a bool ini key read as a string ("false" being true) and an unset flag
    hiding the ini key."""
    assert _settings(pytester, *args, ini=ini).enforce_cpu_timing is on


def test_the_torch_logs_and_trace_dir_settings_come_from_their_own_options(pytester):
    """Catches a setting read from another option, or an empty path kept as a path."""
    on = _settings(pytester, "--fusion-torch-logs", "--fusion-trace-dir=traces")
    assert (on.torch_logs, on.trace_dir, on.enforce_cpu_timing) == (True, "traces", False)
    off = _settings(pytester, ini="fusioncheck_trace_dir =")
    assert (off.torch_logs, off.trace_dir) == (False, None)


def test_the_session_keeps_pytests_cache_for_the_measured_peak_bandwidth(pytester):
    """Catches the cache not handed on (the peak measured again in every session)."""
    config = pytester.parseconfigure("-p", "no:unraisableexception", *PLUGIN_ARGS)
    assert config.stash[state.SETTINGS].peak_cache is config.cache
    assert _settings(pytester).peak_cache is None  # -p no:cacheprovider: no cache to keep it in


def test_a_bad_value_names_the_flag_when_given_there_and_the_ini_key_otherwise(pytester):
    """Catches an error naming the wrong source of the value."""
    assert _usage_error(pytester, "--fusion-counters=perf", ini="fusioncheck_counters = ncu") == (
        "--fusion-counters must be 'none' or 'ncu', got 'perf'"
    )
    assert _usage_error(pytester, ini="fusioncheck_counters = perf") == (
        "fusioncheck_counters (ini file) must be 'none' or 'ncu', got 'perf'"
    )


# --- warmup and peak bandwidth -------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "1.5", "two", ""])
def test_a_warmup_that_is_not_a_non_negative_int_is_refused_naming_flag_and_ini_key(pytester, value):
    """Catches a bad warmup accepted (or a reworded error)."""
    assert _usage_error(pytester, ini=f"fusioncheck_warmup = {value}") == (
        f"--fusion-warmup / fusioncheck_warmup must be a non-negative int, got {value!r}"
    )


@pytest.mark.parametrize(
    "value, peak",
    [("4.25e12", 4.25e12), ("4250 GB/s", 4.25e12), ("  4250 gb/S  ", 4.25e12), ("2 KiB/s", 2048.0), ("1e9/s", 1e9), ("0.5", 0.5)],
)
def test_a_peak_bandwidth_reads_as_bytes_per_second_or_as_a_rate_with_a_unit(pytester, value, peak):
    """Catches a rate's "/s" cut wrongly, its case or spacing refused, a figure misread, or
    the bound moved from "positive" (any rate above 0 is a rate)."""
    assert _settings(pytester, f"--fusion-peak-bandwidth={value}").peak_bandwidth == peak


def test_an_empty_peak_bandwidth_means_measure_it(pytester):
    """Catches an empty ini key refused instead of meaning "measure"."""
    assert _settings(pytester, ini="fusioncheck_peak_bandwidth =").peak_bandwidth is None
    assert _settings(pytester).peak_bandwidth is None


@pytest.mark.parametrize("value", ["0", "-4e12", "0 GB/s", "fast", "4250 parsecs/s", "4250 GB"])
def test_a_peak_bandwidth_that_is_not_a_positive_rate_is_refused_with_the_forms_accepted(pytester, value):
    """Catches a zero, negative or unreadable peak accepted (or a reworded error)."""
    assert _usage_error(pytester, f"--fusion-peak-bandwidth={value}") == (
        f"--fusion-peak-bandwidth: cannot read {value!r}; give bytes/s (4.25e12) or a rate such as '4250 GB/s'"
    )


# --- device and counters ---------------------------------------------------------------


@pytest.mark.parametrize("value, device", [("cuda", "cuda"), ("cpu", "cpu"), ("cuda:1", "cuda:1"), ("cuda:12", "cuda:12"), ("auto", None)])
def test_a_device_is_cuda_a_cuda_index_or_cpu_and_auto_picks_one(pytester, value, device):
    """Catches a valid device refused, or "auto" kept as a device name."""
    assert _settings(pytester, f"--fusion-device={value}").device == device


def test_an_empty_ini_device_picks_one(pytester):
    """Catches an empty ini key kept as a device name."""
    assert _settings(pytester, ini="fusioncheck_device =").device is None


@pytest.mark.parametrize("value", ["cuda:", "cuda:x", "cuda:x1", "cuda1", "cuda_1", "gpu:1", "CUDA", "xcuda:1"])
def test_a_device_that_is_not_cuda_a_cuda_index_or_cpu_is_refused(pytester, value):
    """Catches a misspelt device or index accepted."""
    assert _usage_error(pytester, f"--fusion-device={value}") == (
        f"--fusion-device must be 'cuda', 'cuda:<index>' or 'cpu', got {value!r}"
    )


def test_counters_are_none_by_default_and_ncu_when_asked(pytester):
    """Catches the counters setting not reaching the session, or an empty key refused."""
    assert _settings(pytester).counters == "none"
    assert _settings(pytester, ini="fusioncheck_counters =").counters == "none"
    assert _settings(pytester, "--fusion-counters=ncu").counters == "ncu"
    assert _settings(pytester, "-n", "0", "--fusion-counters=ncu").counters == "ncu"  # xdist off
    assert _settings(pytester, "-p", "no:xdist", "--fusion-counters=ncu").counters == "ncu"  # no -n option at all


def test_counters_in_an_xdist_worker_are_refused_with_the_reason(pytester):
    """Catches a worker (a config with workerinput) running ncu itself."""
    config = pytester.parseconfig(*INNER, "--fusion-counters=ncu")
    config.workerinput = {"workerid": "gw0"}
    with pytest.raises(pytest.UsageError) as info:
        settings_from_config(config)
    assert str(info.value) == (
        "--fusion-counters ncu does not run under pytest-xdist (-n): ncu re-runs the selected tests once, "
        "serially, in one child process; drop -n for the counters run"
    )


# --- uses_fusion -------------------------------------------------------------------------


def test_a_test_uses_fusion_through_the_fixture_or_any_fusion_marker_only(pytester):
    """Catches a fusion marker not recognised (its test then left unchecked) or a plain test
    treated as a fusion test."""
    items = _items(pytester, 
        """
import pytest

def test_plain():
    pass

def test_fixture(fusion):
    pass

@pytest.mark.slow
def test_other_marker():
    pass
"""
        + "".join(f"\n@pytest.mark.{m}\ndef test_{m}():\n    pass\n" for m in options.FUSION_MARKERS)
    )
    used = {item.name: uses_fusion(item) for item in items}
    assert used == {"test_plain": False, "test_fixture": True, "test_other_marker": False, **{f"test_{m}": True for m in options.FUSION_MARKERS}}


def test_a_test_item_of_another_plugin_without_fixtures_is_not_a_fusion_test(pytester):
    """Catches items without ``fixturenames`` (yaml, lint or doctest-like plugins' tests)
    crashing the plugin."""

    class OtherPluginItem(pytest.Item):
        def runtest(self):
            pass

    (python_item,) = _items(pytester, "def test_x():\n    pass\n")
    item = OtherPluginItem.from_parent(python_item.parent, name="lint")
    assert not hasattr(item, "fixturenames") and uses_fusion(item) is False


# --- parse_limits: markers ---------------------------------------------------------------


def _marked(pytester, *tests):
    """One collected test per list of markers (one module: pytester collects once per test)."""
    source = "import pytest\n" + "".join(
        "".join(f"@pytest.mark.{m}\n" for m in marks) + f"def test_{i}():\n    pass\n" for i, marks in enumerate(tests)
    )
    return _items(pytester, source)


def _items(pytester, source):
    return pytester.genitems([pytester.getmodulecol(source, configargs=INNER)])


def _limits(pytester, marks):
    (item,) = _marked(pytester, marks)
    return parse_limits(item)


def _marker_error(pytester, marks):
    (item,) = _marked(pytester, marks)
    with pytest.raises(MarkerError) as info:
        parse_limits(item)
    prefix = f"{item.nodeid}: @pytest.mark."
    message = str(info.value)
    assert message.startswith(prefix), message
    return message[len(prefix):]


def _no_underscores(value):
    """Test ids without "hbm_bytes", which the mutation run's ``-k`` leaves out (pyproject.toml)."""
    return str(value).replace("_", "-")


def test_no_marker_gives_no_limits_and_nothing_to_profile(pytester):
    """Catches a limit or the profiled flag set without a marker."""
    limits = _limits(pytester, [])
    assert limits == Limits() and not limits.profiled and limits.kernel_limit("cpu") is None


@pytest.mark.parametrize(
    "mark, field, value",
    [
        ("max_kernels(0)", "max_kernels", 0),
        ("max_hbm_bytes('1 KiB')", "max_hbm_bytes", 1024),
        ("max_hbm_bytes(0)", "max_hbm_bytes", 0),
        ("bandwidth_bound(1)", "bandwidth_fraction", 1.0),
        ("fusion_headroom(0)", "headroom_fraction", 0.0),
        ("fusion_headroom(1)", "headroom_fraction", 1.0),
        ("max_launch_overhead(0.25)", "launch_fraction", 0.25),
    ],
    ids=_no_underscores,
)
def test_each_limit_marker_sets_its_limit_and_makes_the_test_profiled(pytester, mark, field, value):
    """Catches a marker's value stored in another field, the boundaries (0, 1) refused, or a
    limit that does not make the test profiled."""
    limits = _limits(pytester, [mark])
    assert getattr(limits, field) == value and type(getattr(limits, field)) is type(value)
    assert limits.profiled


def test_no_graph_breaks_alone_checks_breaks_without_profiling(pytester):
    """Catches no_graph_breaks ignored or making the test profiled."""
    limits = _limits(pytester, ["no_graph_breaks"])
    assert limits.no_graph_breaks and not limits.profiled


def test_a_per_device_kernel_count_wins_over_the_plain_one_on_its_device_only(pytester):
    """Catches the per-device count ignored, applied to the other device, or lost."""
    limits, only_cpu = map(parse_limits, _marked(pytester, ["max_kernels(5, cuda=2)"], ["max_kernels(cpu=3, cuda=None)"]))
    assert (limits.kernel_limit("cuda"), limits.kernel_limit("cpu")) == (2, 5)
    assert (only_cpu.kernel_limit("cpu"), only_cpu.kernel_limit("cuda"), only_cpu.max_kernels_by_device) == (3, None, {"cpu": 3})
    assert only_cpu.has_max_kernels and only_cpu.profiled


@pytest.mark.parametrize(
    "mark, problem",
    [
        ("max_kernels(1, gpu=2, tpu=1)", "max_kernels: unknown keyword(s) gpu, tpu; accepted: cpu=, cuda="),
        ("max_kernels(1, 2)", "max_kernels: takes one positional count, got 2: (1, 2)"),
        ("max_kernels(True)", "max_kernels: n must be a non-negative int, got True"),
        ("max_kernels(cuda=-1)", "max_kernels: cuda= must be a non-negative int, got -1"),
        ("max_kernels(cpu=1.0)", "max_kernels: cpu= must be a non-negative int, got 1.0"),
        ("max_kernels(cpu=None)", "max_kernels: needs a count: max_kernels(n) or max_kernels(cpu=..., cuda=...)"),
        ("max_hbm_bytes()", "max_hbm_bytes: takes exactly one byte count, got args=() kwargs={}"),
        ("max_hbm_bytes(1, n=2)", "max_hbm_bytes: takes exactly one byte count, got args=(1,) kwargs={'n': 2}"),
        ("max_hbm_bytes(-1)", "max_hbm_bytes: a byte count cannot be negative, got -1"),
        ("bandwidth_bound(0.5, 0.6)", "bandwidth_bound: takes exactly one fraction, got args=(0.5, 0.6) kwargs={}"),
        ("bandwidth_bound(fraction=0.5)", "bandwidth_bound: takes exactly one fraction, got args=() kwargs={'fraction': 0.5}"),
        ("bandwidth_bound(0)", "bandwidth_bound: fraction must be a number in (0, 1] (a share of peak bandwidth), got 0"),
        ("bandwidth_bound(1.01)", "bandwidth_bound: fraction must be a number in (0, 1] (a share of peak bandwidth), got 1.01"),
        ("bandwidth_bound(True)", "bandwidth_bound: fraction must be a number in (0, 1] (a share of peak bandwidth), got True"),
        ("bandwidth_bound('0.5')", "bandwidth_bound: fraction must be a number in (0, 1] (a share of peak bandwidth), got '0.5'"),
        ("fusion_headroom(-0.1)", "fusion_headroom: fraction must be a number in [0, 1], got -0.1"),
        ("fusion_headroom(False)", "fusion_headroom: fraction must be a number in [0, 1], got False"),
        ("max_launch_overhead(0)", "max_launch_overhead: fraction must be a number in (0, 1], got 0"),
        ("max_launch_overhead()", "max_launch_overhead: takes exactly one fraction, got args=() kwargs={}"),
        ("no_graph_breaks(strict=True)", "no_graph_breaks: takes no arguments, got args=() kwargs={'strict': True}"),
    ],
    ids=_no_underscores,
)
def test_a_bad_marker_is_refused_naming_the_test_the_marker_and_the_problem(pytester, mark, problem):
    """Catches a bad marker argument accepted, or an error that names the wrong marker or problem."""
    assert _marker_error(pytester, [mark]) == problem


def test_a_marker_error_does_not_chain_the_inner_error(pytester):
    """Catches the error raised with its cause attached (the user would read two tracebacks)."""
    with pytest.raises(MarkerError) as info:
        _limits(pytester, ["max_kernels(-1)"])
    assert info.value.__cause__ is None and info.value.__suppress_context__
