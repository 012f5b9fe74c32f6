"""reference_kernels._device and the planners' properties on every GPU they may meet (docs/kernels.md, "Planning").

A plan is a function of the problem and a ``Device``; these tests plan for the A100, H100, H200 and B200 descriptions
(datasheet figures) with the default choices and with the sm_90 tuned file, and check what must hold on each: the plan
fits the device's registers, shared memory and warps, covers every element of the row, and keeps the tiles a walk
reads twice within the L2. Small shapes then run under the interpreter against torch.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from reference_kernels import _device, _layer_norm_held, _softmax_held, layer_norm, softmax
from reference_kernels._common import THREAD_MAX_REGS
from reference_kernels._split_walk import split_group

# The interpreter computes masked-off lanes with numpy, which warns about their nan.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEVICES = list(_device.DESCRIPTIONS.values())
TUNINGS = {"default": softmax.DEFAULT_TUNING, "sm_90 tuned": _device.tuned("softmax", 90, softmax.DEFAULT_TUNING)}
# widths that cross every boundary a plan has: narrow, powers of two and their neighbours, ragged model widths, rows
# too wide for shared memory
WIDTHS = sorted({1, 3, 8, 60, 64, 100, 128, 255, 256, 600, 768, 1000, 1025, 1039, 2047, 2048, 2049, 4095, 4096, 4097,
                 8191, 8192, 8193, 8704, 12345, 16383, 16384, 16385, 17000, 20000, 28000, 30522, 32768, 32769, 50257,
                 65536, 100000, 128256, 151936, 262144, 590000, 1 << 20})


# --------------------------------------------------------------------------- devices


def test_every_description_is_a_valid_device_and_the_interpreter_is_used_off_cuda():
    for dev in DEVICES:
        assert dev.sms > 0 and dev.smem_per_block <= dev.smem_per_sm and dev.warps_per_sm == 64
    assert _device.of(torch.device("cpu")) is _device.INTERPRETER


@pytest.mark.parametrize("field, value, words", [("sms", 0, "sms must be positive"),
                                                 ("smem_per_block", 1 << 20, "more shared memory than its SM")])
def test_a_device_with_impossible_figures_is_refused_with_a_clear_error(field, value, words):
    with pytest.raises(ValueError, match=words):
        dataclasses.replace(_device.DESCRIPTIONS["H100"], **{field: value})


@pytest.mark.gpu
def test_the_queried_device_has_this_gpus_figures():
    dev = _device.of(torch.device("cuda"))
    props = torch.cuda.get_device_properties(0)
    assert (dev.sms, dev.arch) == (props.multi_processor_count, props.major * 10 + props.minor)
    assert dev.smem_per_block <= dev.smem_per_sm and dev.l2_bytes == props.L2_cache_size
    # peaks from the driver's clocks: within a factor of two of a datasheet GPU of its arch (a PCIe board clocks lower)
    same = [d for d in DEVICES if d.arch == dev.arch]
    for d in same:
        assert 0.5 < dev.mma_flops_per_sm / d.mma_flops_per_sm < 2 and 0.3 < dev.dram_bytes_per_s / d.dram_bytes_per_s < 3


def test_a_queried_devices_peak_rates_come_from_its_clocks_and_arch(monkeypatch):
    props = SimpleNamespace(name="GPU", major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    clocks = {"sm_clock_rate": 1_980_000, "mem_clock_rate": 2_619_000, "mem_bus_width": 5120}  # an H100 SXM (kHz)
    monkeypatch.setattr(_device, "_clocks", lambda index: clocks)
    _device._query.cache_clear()
    try:
        dev = _device._query(0)
        assert dev.mma_flops_per_sm == 1.98e9 * 4096 and dev.dram_bytes_per_s == 2.619e9 * 2 * 5120 / 8  # 3.35 TB/s
        props.minor = 9  # an arch between two known ones takes the lower's rate a clock
        _device._query.cache_clear()
        assert _device._query(0).mma_flops_per_sm == 1.98e9 * 4096
        clocks.clear()  # a driver that does not say: the defaults
        _device._query.cache_clear()
        dev = _device._query(0)
        assert (dev.mma_flops_per_sm, dev.dram_bytes_per_s) == (_device.Device.mma_flops_per_sm,
                                                                _device.Device.dram_bytes_per_s)
    finally:
        _device._query.cache_clear()


# --------------------------------------------------------------------------- tuned files


def test_every_tuned_file_names_its_gpu_and_triton_and_only_choices_the_subjects_have():
    files = _device._files()
    assert 90 in files
    for arch, data in files.items():
        assert data["triton"] and data["measured_on"]
        assert _device.tuned("softmax", arch, softmax.DEFAULT_TUNING) != softmax.DEFAULT_TUNING or "softmax" not in data
        defaults = {"softmax": softmax.DEFAULT_TUNING, "layer_norm": layer_norm.DEFAULT_TUNING,
                    "layer_norm_held": _layer_norm_held.Shapes()}
        base = {subject: _device.tuned(subject, arch, d) for subject, d in defaults.items()}
        for model, subjects in data.get("models", {}).items():  # a GPU's own choices: known names that change a value
            assert subjects and set(subjects) <= set(defaults), (arch, model)
            for subject, d in defaults.items():
                assert (_device.tuned(subject, arch, d, model) != base[subject]) == (subject in subjects), (arch, model)


def test_a_tuned_file_applies_only_on_its_compute_capability_with_its_triton(monkeypatch):
    h100, a100 = _device.DESCRIPTIONS["H100"], _device.DESCRIPTIONS["A100"]
    wanted = _device._files()[90]["triton"]
    monkeypatch.setattr(_device.triton, "__version__", wanted + "0")
    assert _device.tuning("softmax", h100, softmax.DEFAULT_TUNING) == TUNINGS["sm_90 tuned"]
    assert _device.tuning("softmax", a100, softmax.DEFAULT_TUNING) is softmax.DEFAULT_TUNING
    monkeypatch.setattr(_device.triton, "__version__", "0.0.1")  # another release allocates registers its own way
    assert _device.tuning("softmax", h100, softmax.DEFAULT_TUNING) is softmax.DEFAULT_TUNING


def test_a_tuned_file_naming_a_choice_the_subject_lacks_is_an_error_not_a_silent_skip(monkeypatch, tmp_path):
    (tmp_path / "90.json").write_text(json.dumps({"arch": 90, "triton": "3.6.", "measured_on": "a test",
                                                  "softmax": {"no_such_choice": 1}}))
    (tmp_path / "80.json").write_text(json.dumps({"arch": 80, "softmax": {}}))
    monkeypatch.setattr(_device, "TUNED_DIR", tmp_path)
    _device._files.cache_clear()
    _device.tuned.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"80.json: missing \['measured_on', 'triton'\]"):
            _device._files()
        (tmp_path / "80.json").unlink()
        with pytest.raises(ValueError, match=r"tuned/90.json, softmax: no such choice \['no_such_choice'\]"):
            _device.tuned("softmax", 90, softmax.DEFAULT_TUNING)
        with pytest.raises(ValueError, match="no tuned file for compute capability 100"):
            _device.tuned("softmax", 100, softmax.DEFAULT_TUNING)
    finally:
        monkeypatch.undo()
        _device._files.cache_clear()
        _device.tuned.cache_clear()


def test_a_tuned_files_model_section_applies_over_it_on_the_gpu_whose_name_holds_its_key(monkeypatch, tmp_path):
    # GPUs of one compute capability differ (the H200: the H100's SMs, 1.4x its bandwidth): a model's own choices
    (tmp_path / "90.json").write_text(json.dumps({
        "arch": 90, "triton": "3.6.", "measured_on": "a test", "softmax": {"rows_tile_fp32": 1024, "shift_16bit": []},
        "models": {"H200": {"softmax": {"rows_tile_fp32": 512}}, "H20": {"softmax": {"no_such_choice": 1}}}}))
    monkeypatch.setattr(_device, "TUNED_DIR", tmp_path)
    monkeypatch.setattr(_device.triton, "__version__", "3.6.0")
    _device._files.cache_clear()
    _device.tuned.cache_clear()
    try:
        h100, h200 = _device.DESCRIPTIONS["H100"], dataclasses.replace(_device.DESCRIPTIONS["H200"], name="NVIDIA H200")
        assert (_device.model_of(h100), _device.model_of(h200)) == ("", "H200")  # the longest key the name holds
        assert _device.tuning("softmax", h100, softmax.DEFAULT_TUNING).rows_tile_fp32 == 1024
        assert _device.tuning("softmax", h200, softmax.DEFAULT_TUNING).rows_tile_fp32 == 512
        assert _device.tuning("softmax", h200, softmax.DEFAULT_TUNING).shift_16bit == ()  # the file's, kept
        with pytest.raises(ValueError, match=r"tuned/90.json, models.H20.softmax: no such choice"):
            _device.tuned("softmax", 90, softmax.DEFAULT_TUNING, "H20")
        with pytest.raises(ValueError, match="has no model 'B200'"):
            _device.tuned("softmax", 90, softmax.DEFAULT_TUNING, "B200")
    finally:
        monkeypatch.undo()
        _device._files.cache_clear()
        _device.tuned.cache_clear()


# --------------------------------------------------------------------------- softmax plans


def softmax_plans(dev: _device.Device, t: softmax.Tuning):
    """Every plan the softmax planner makes on ``dev`` for WIDTHS, both element sizes, with and without the held
    kernels, many rows and few."""
    for n in WIDTHS:
        for es in (2, 4):
            for held in (False, True):
                for rows in (3, 8192):
                    yield n, es, softmax.plan(rows, n, es, dev, tuning=t, held=held)


def _fits_registers(p: softmax.Plan, dev: _device.Device) -> bool:
    return p.max_regs == 0 or p.max_regs * 32 * p.num_warps * max(1, p.per_sm) <= dev.regs_per_sm


@pytest.mark.parametrize("tuning", TUNINGS, ids=str)
@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_every_softmax_plan_fits_the_device_and_covers_the_row(dev, tuning):
    t = TUNINGS[tuning]
    for n, es, p in softmax_plans(dev, t):
        where = f"{dev.name} {tuning}: {n} x {es} bytes -> {p}"
        assert p.num_warps in (1, 2, 4, 8, 16, 32) and p.num_warps <= dev.warps_per_sm, where
        assert _fits_registers(p, dev) and p.max_regs <= THREAD_MAX_REGS, where
        assert p.device == dev and p.tuning == t, where
        if p.mode == "rows":  # the row whole in one program's registers
            assert p.block_n >= n and p.block_m * p.block_n <= max(softmax.MAX_ROW, softmax.ROWS_TILE * 2), where
        elif p.mode == "held":  # a row, or each of its slices, in one program's shared memory
            group, slice_cols = _softmax_held.split_shape(n, es, p.group)
            assert group * slice_cols >= n and group <= softmax.MAX_SPLIT_GROUP, where
            assert p.per_sm == _softmax_held.per_sm(slice_cols, es, device=dev) >= 1, where
        elif p.mode == "staged":  # one row a step in registers, the next rows' loads in shared memory
            assert sum(p.pieces) >= n and p.pieces[0] == p.block_n, where
            in_flight = max(0, p.stages - 1) * sum(p.pieces) * es
            assert in_flight <= dev.smem_per_block and in_flight * p.per_sm <= dev.smem_per_sm, where
        else:  # the walk: each row's slices covered, what is read twice held in L2
            assert p.mode in ("persistent", "split"), where
            group, slice_cols = split_group(n, p.block_n, p.group)
            assert group * slice_cols >= n and group <= softmax.MAX_SPLIT_GROUP, where
            # what pass two reads again fits in L2 (rows up to MAX_SPLIT_GROUP slices of SPLIT_SLICE_BYTES; wider
            # rows' slices do not: docs/kernels.md, "Where the targets are missed")
            if n * es <= softmax.MAX_SPLIT_GROUP * softmax.SPLIT_SLICE_BYTES:
                assert min(n, slice_cols) * es * max(1, p.per_sm) * dev.sms <= dev.l2_bytes, where


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_the_held_plans_are_taken_only_on_compute_capability_9(dev, monkeypatch):
    monkeypatch.setattr(_softmax_held, "available", lambda *args, **kwargs: True)
    modes = {softmax.plan(8192, n, es, dev, tuning=t).mode for n in WIDTHS for es in (2, 4) for t in TUNINGS.values()}
    assert ("held" in modes) == (dev.arch // 10 == 9)


def test_the_default_choices_take_no_measured_band():
    t = softmax.DEFAULT_TUNING
    h200 = _device.DESCRIPTIONS["H200"]
    modes = {softmax.plan(8192, n, es, h200, tuning=t, held=False).mode for n in WIDTHS for es in (2, 4)}
    assert modes == {"rows", "split"}  # no staged or persistent plan without a measurement saying so
    assert not any(softmax._shift(n, 2, t) for n in WIDTHS)


@pytest.mark.parametrize("tuning", TUNINGS, ids=str)
@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_plans_for_every_device_match_torch(dev, tuning, dtype):
    """Each description's plans run and match torch, at this machine's SM count and concurrency (a launch's grid is
    its device's); small rows here, the GPU tests take the wide ones."""
    here = _device.of(torch.device(DEVICE))
    dev = dataclasses.replace(dev, sms=here.sms, concurrent=here.concurrent)
    for n in (5, 300, 1000, 2049, 4097):
        x = torch.randn(6, n, device=DEVICE, dtype=dtype) * 3
        for max_row in (None, 256):
            p = softmax.plan(6, n, x.element_size(), dev, tuning=TUNINGS[tuning], max_row=max_row, held=False)
            y = torch.full_like(x, float("nan"))
            softmax._launch(x, y, p)
            torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), atol=4e-3, rtol=1.6e-2)


# --------------------------------------------------------------------------- layer norm plans

LN_TUNINGS = {"default": layer_norm.DEFAULT_TUNING,
              "sm_90 tuned": _device.tuned("layer_norm", 90, layer_norm.DEFAULT_TUNING),
              "H200 tuned": _device.tuned("layer_norm", 90, layer_norm.DEFAULT_TUNING, "H200")}


@pytest.mark.parametrize("tuning", LN_TUNINGS, ids=str)
@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_every_layer_norm_plan_fits_the_device(dev, tuning):
    """Warps a program can have; a register cap that lets the programs an SM the plan launches fit the register file
    (persistent grids: ``n_groups`` programs over the SMs); the rows a pipelined plan keeps in flight (x and dy,
    ``stages - 1`` rows each) within an SM's shared memory; no more programs than the rows need."""
    t = LN_TUNINGS[tuning]
    for n in [w for w in WIDTHS if w <= 262144]:
        for es in (2, 4):
            for backward in (False, True):
                for packed in (False, True):
                    p = layer_norm._layer_norm_settings(8192, n, es, backward=backward, device=dev, tuning=t,
                                                        packed=packed)
                    where = f"{dev.name} {tuning}: {'backward' if backward else 'forward'} {n} x {es} bytes -> {p}"
                    assert p.num_warps in (1, 2, 4, 8, 16, 32), where
                    assert 1 <= p.n_groups <= max(8192, dev.sms * dev.warps_per_sm), where
                    resident = -(-p.n_groups // dev.sms) if p.n_groups > 1 else 1
                    if p.max_regs:
                        assert p.max_regs * 32 * p.num_warps * resident <= dev.regs_per_sm, where
                    if p.variant == "phased":
                        in_flight = (p.stages - 1) * (p.block_n + p.block_t + p.block_u) * es * 2
                        assert in_flight * resident <= dev.smem_per_sm, where


def test_the_default_layer_norm_choices_take_no_measured_band():
    h200, t = _device.DESCRIPTIONS["H200"], layer_norm.DEFAULT_TUNING
    plans = {(n, es, b): layer_norm._layer_norm_settings(8192, n, es, backward=b, device=h200, tuning=t)
             for n in WIDTHS if n <= 262144 for es in (2, 4) for b in (False, True)}
    assert {p.mode for p in plans.values()} <= {"rows", "split", "looped", "one_pass", "two_pass"}
    # no flat backward without a band; the phased one exactly where a row outgrows the rows plan and it holds it whole
    assert {p.variant for p in plans.values()} <= {"measured", "lean", "phased"}
    for (n, es, b), p in plans.items():
        whole = layer_norm._phased_bwd_pieces(n, es, t) is not None
        assert (p.variant == "phased") == (b and n > layer_norm._BWD_ROWS_TILE and whole), (n, es, b, p)
    assert not any(p.prefetch for p in plans.values())


@pytest.mark.parametrize("dev", DEVICES + [dataclasses.replace(DEVICES[0], name="8 SMs", sms=8)], ids=lambda d: d.name)
def test_a_one_pass_backward_keeps_every_chunk_of_its_rows_resident_at_once(dev, monkeypatch):
    """A one-pass program waits on its row's other chunks: all the programs launched must fit the GPU at once (by warps,
    and by registers where capped), else the chunks exchange through two passes."""
    monkeypatch.setattr(layer_norm, "interpreting", lambda: False)
    modes = set()
    for n in (16385, 65536, 262144, 1 << 20, 1 << 22):
        for es in (2, 4):
            for variant in ("lean", "measured"):
                p = layer_norm._layer_norm_settings(64, n, es, backward=True, device=dev, variant=variant)
                modes.add(p.mode)
                if p.mode != "one_pass":
                    continue
                threads = 32 * p.num_warps
                fit = dev.threads_per_sm // threads
                if p.max_regs:
                    fit = min(fit, dev.regs_per_sm // (p.max_regs * threads))
                assert p.n_groups * -(-n // p.block_n) <= dev.sms * fit, (dev.name, n, es, variant, p)
    assert modes == {"one_pass", "two_pass"} if dev.sms == 8 else "one_pass" in modes


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layer_norm_plans_with_the_default_choices_match_torch(dev, dtype, monkeypatch):
    """Forward and backward planned for each description with the defaults (this machine's SM count and concurrency)
    against torch; small rows here, the GPU tests take the wide ones."""
    here = _device.of(torch.device(DEVICE))
    monkeypatch.setattr(_device, "of", lambda device: dataclasses.replace(dev, sms=here.sms, concurrent=here.concurrent))
    monkeypatch.setattr(_device, "tuned_here", lambda device: False)
    for n in (5, 300, 1000, 1025, 4097):
        x = (torch.randn(6, n, device=DEVICE) * 3 + 1).to(dtype).requires_grad_()
        w = torch.randn(n, device=DEVICE).to(dtype).requires_grad_()
        b = torch.randn(n, device=DEVICE).to(dtype).requires_grad_()
        y = layer_norm.fused(x, w, b)
        ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float())
        dy = torch.randn_like(ref)
        grads = torch.autograd.grad(y.float(), (x, w, b), dy)
        expected = torch.autograd.grad(ref, (x, w, b), dy)
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(y.float(), ref, **tol)
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got.float(), want.float(), atol=tol["atol"] * 10, rtol=tol["rtol"] * 10)
