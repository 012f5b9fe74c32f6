"""Test-suite setup: run Triton under its interpreter when there is no GPU, skip `gpu` tests."""

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytester's in-process runs restore sys.modules afterwards, so everything a run imported
# is imported again by the next run. Torch's and Triton's extensions cannot be loaded twice
# in one process (duplicate operator libraries, nanobind crashes): keep every module except
# the user test files that pytester writes.
from _pytest import pytester as _pytester  # noqa: E402

_snapshot_init = _pytester.SysModulesSnapshot.__init__


def _keep_library_modules(self, preserve=None):
    import sys as _sys

    def keep(name):
        if preserve is not None and preserve(name):
            return True
        module = _sys.modules.get(name)
        path = getattr(module, "__file__", None) or ""
        return not (name.startswith(("test_", "conftest")) or "pytest-of-" in path)

    _snapshot_init(self, preserve=keep)


_pytester.SysModulesSnapshot.__init__ = _keep_library_modules

pytest_plugins = ["pytester"]


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == "fusioncheck" for ep in entry_points(group="pytest11"))


# Inner pytester runs need the plugin: through its entry point when the package is
# installed, else (running from a source tree, e.g. on the GPU box) by name.
PLUGIN_ARGS = [] if _plugin_installed() else ["-p", "pytest_fusioncheck.plugin"]


@pytest.fixture
def run_pytest(pytester):
    """Run pytest in-process on the pytester directory with the plugin loaded."""

    def run(*args):
        return pytester.runpytest_inprocess("-p", "no:cacheprovider", *PLUGIN_ARGS, *args)

    return run


class _ForgettingMonkeyPatch(pytest.MonkeyPatch):
    """pytest's ``monkeypatch``, and each change forgets the reference kernels' recorded calls (a record replays the
    plan made under the constants of its first call: reference_kernels/_launch.py)."""

    def _forget(self):
        import sys as _sys

        launch = _sys.modules.get("reference_kernels._launch")
        if launch is not None:
            launch.forget()

    def setattr(self, *args, **kwargs):
        super().setattr(*args, **kwargs)
        self._forget()

    def delattr(self, *args, **kwargs):
        super().delattr(*args, **kwargs)
        self._forget()

    def setitem(self, *args, **kwargs):
        super().setitem(*args, **kwargs)
        self._forget()

    def delitem(self, *args, **kwargs):
        super().delitem(*args, **kwargs)
        self._forget()

    def undo(self):
        super().undo()
        self._forget()


@pytest.fixture
def monkeypatch():
    """``monkeypatch`` for this suite: ``_ForgettingMonkeyPatch``."""
    patch = _ForgettingMonkeyPatch()
    yield patch
    patch.undo()


@pytest.fixture
def unwritten_reads_nan(monkeypatch):
    """During the test, ``torch.empty`` and ``torch.empty_like`` hand out NaN-filled float tensors.

    The reference kernels allocate their outputs with ``torch.empty``, whose memory may
    already hold zeros or the previous call's answer: filled with NaN, an element that a
    kernel never writes shows up in its result.
    """
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(t):
        if t.is_floating_point():
            with torch.no_grad():
                t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: poisoned(empty(*args, **kwargs)))
    monkeypatch.setattr(torch, "empty_like", lambda *args, **kwargs: poisoned(empty_like(*args, **kwargs)))


@pytest.fixture
def tuned_sm90(monkeypatch):
    """The reference kernels plan this test's tensors as for an sm_90 GPU with its tuned choices
    (``reference_kernels/tuned/90.json``), whatever this Triton is. Without a GPU the device is the H200's description
    with the interpreter's few SMs (persistent programs still walk several rows) and its programs one after another.
    Returns the ``Device``."""
    from reference_kernels import _device

    if torch.cuda.is_available() and not _device.interpreting():
        dev = _device.of(torch.device("cuda"))
    else:
        dev = dataclasses.replace(_device.DESCRIPTIONS["H200"], sms=_device.INTERPRETER.sms, concurrent=False)
    monkeypatch.setattr(_device, "of", lambda device: dev)
    monkeypatch.setattr(_device, "tuned_here", lambda device: device.arch == 90)
    return dev


class _RecordedKernel:
    """A stand-in for a Triton or Gluon kernel: records each launch's grid and keyword arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, kwargs))


@pytest.fixture
def recorded_kernel():
    """A kernel stand-in whose ``launches`` list each launch's (grid, keyword arguments): for launcher tests that
    patch a kernel out (the Gluon ones are absent without Gluon and never run on CPU)."""
    return _RecordedKernel()


def pytest_addoption(parser):
    parser.addoption(
        "--kernel-set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
        help="set a reference_kernels constant for this run, as benchmarks/sweep.py's --set does (repeatable): the "
             "GPU tests of a launch-plan rule under A/B, run in the same device call as its timing")


def pytest_configure(config):
    """``--kernel-set``: applied before collection, in every xdist worker too (each configures itself)."""
    items = config.getoption("--kernel-set")
    if not items:
        return
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/
    from benchmarks.sweep import apply_settings

    try:
        config.stash[KERNEL_SETTINGS] = apply_settings(items)
    except SystemExit as exc:  # its refusals name the item and why
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config):
    """A run under ``--kernel-set`` says so at its top, as the sweep's header line does."""
    settings = config.stash.get(KERNEL_SETTINGS, None)
    return f"reference_kernels set: {', '.join(settings)}" if settings else None


KERNEL_SETTINGS = pytest.StashKey[list]()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def current():
    """A fresh log (test id "t", default settings) made current for the test, as the plugin
    does for a fusion test."""
    from pytest_fusioncheck.state import ReportLog, activate, deactivate

    log = ReportLog(test_id="t")
    token = activate(log)
    yield log
    deactivate(token)
