"""Fusion headroom: chains of memory-bound kernels that exchange tensors through HBM, and
what fusing each would save; its assertion and marker. CPU, deterministic (bytes only)."""

from __future__ import annotations

import pytest
import torch

from fidelity_cases import five_op_softmax
from pytest_fusioncheck import FusionAssertionError, Kernel, assert_fusion_headroom_within, profile
from pytest_fusioncheck.headroom import find_chains

MiB = 2**20


def _k(op, reads, writes, nbytes=None):
    nbytes = nbytes if nbytes is not None else sum(reads.values()) + sum(writes.values())
    return Kernel(name=op, op=f"aten::{op}", bytes=nbytes, reads=reads, writes=writes)


def test_a_producer_consumer_pair_is_one_chain_whose_budget_is_its_inputs_and_returned_output():
    kernels = [_k("add", {"x": 100, "b": 1}, {"t": 100}), _k("gelu", {"t": 100}, {"y": 100})]
    (chain,) = find_chains(kernels, returned={"y"})
    assert chain.kernels == [0, 1] and chain.bytes == 401
    assert chain.fused_bytes == 201  # x, b read; y written; t never leaves the chip
    assert chain.excess == 200 and chain.ratio == pytest.approx(401 / 201)


def test_an_intermediate_read_outside_the_chain_or_returned_stays_in_the_budget():
    kernels = [
        _k("add", {"x": 100}, {"t": 100}),
        _k("gelu", {"t": 100}, {"y": 100}),
        _k("mm", {"t": 100, "w": 10}, {"z": 10}),  # a GEMM reads t: t must reach HBM
    ]
    (chain,) = find_chains(kernels, returned={"y"})
    assert chain.kernels == [0, 1] and chain.fused_bytes == 100 + 100 + 100
    (returned,) = find_chains(kernels[:2], returned={"y", "t"})
    assert returned.fused_bytes == 300


def test_gemms_copies_and_kernels_without_storages_are_never_chain_members():
    kernels = [
        _k("mm", {"a": 10, "w": 10}, {"h": 10}),
        _k("gelu", {"h": 10}, {"g": 10}),
        Kernel(name="triton_poi_fused_add_0", op="fused: add", bytes=20),  # generated: no storages
        _k("mm", {"g": 10, "w2": 10}, {"y": 10}),
    ]
    assert find_chains(kernels, returned={"y"}) == []


def test_unrelated_kernels_form_separate_chains_ordered_by_saving():
    kernels = [
        _k("add", {"x": 10}, {"t": 10}),
        _k("neg", {"t": 10}, {"u": 10}),
        _k("exp", {"p": 100}, {"q": 100}),
        _k("log", {"q": 100}, {"r": 100}),
    ]
    chains = find_chains(kernels, returned={"u", "r"})
    assert [c.kernels for c in chains] == [[2, 3], [0, 1]]


def test_in_a_region_outputs_nobody_reads_back_count_as_leaving_the_chain():
    kernels = [_k("add", {"x": 100}, {"t": 100}), _k("gelu", {"t": 100}, {"y": 100})]
    (chain,) = find_chains(kernels)  # returned tensors unknown
    assert chain.fused_bytes == 200


def test_with_device_time_the_saving_is_the_chains_time_less_one_fused_kernel_at_the_peak():
    kernels = [_k("add", {"x": 100, "b": 1}, {"t": 100}), _k("gelu", {"t": 100}, {"y": 100})]
    kernels[0].time_s, kernels[1].time_s = 3e-6, 2e-6
    (bytes_only,) = find_chains(kernels, returned={"y"})
    (timed,) = find_chains(kernels, returned={"y"}, device_time=True)
    assert bytes_only.time_s is None and bytes_only.saving_s(100e6) == pytest.approx(200 / 100e6)
    assert timed.time_s == pytest.approx(5e-6)
    assert timed.saving_s(100e6) == pytest.approx(5e-6 - 201 / 100e6)  # 5 us less 2.01 us
    assert timed.saving_s(10e6) == 0.0  # a chain faster than the fused kernel at the peak: nothing to save
    assert timed.saving_s(None) is None and bytes_only.saving_s(0) is None


def test_the_eager_five_op_softmax_is_one_chain_at_four_times_its_fused_budget():
    x = torch.randn(256, 1024)
    report = profile(five_op_softmax, x)
    (chain,) = report.headroom
    assert chain.kernels == [0, 1, 2, 3, 4]
    assert chain.fused_bytes == 2 * x.numel() * 4 == report.budget.total
    assert chain.bytes == report.bytes
    assert str(report).count("note: headroom: kernels 0-4 (max, sub, exp, sum, div;") == 1
    assert report.to_dict()["headroom"][0]["excess"] == chain.excess


def test_a_fused_kernel_and_a_compiled_chain_have_no_headroom():
    x = torch.randn(256, 1024)
    assert profile(torch.softmax, x, -1).headroom == []
    torch._dynamo.reset()
    assert profile(torch.compile(five_op_softmax), x).headroom == []


def test_assert_fusion_headroom_within_fails_the_unfused_chain_and_says_what_fusing_saves():
    x = torch.randn(256, 1024)
    report = profile(five_op_softmax, x)
    with pytest.raises(FusionAssertionError) as info:
        assert_fusion_headroom_within(0.5, report=report)
    message = str(info.value)
    assert "assert_fusion_headroom_within: fusing the region's memory-bound chains would save 75% of its modelled bytes > allowed 50%" in message
    assert "kernels 0-4 (max, sub, exp, sum, div;" in message and "move 4.0x their fused budget" in message
    assert_fusion_headroom_within(0.8, report=report)
    assert_fusion_headroom_within(0.0, report=profile(torch.softmax, x, -1))
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\]"):
        assert_fusion_headroom_within(1.5, report=report)


def test_the_fusion_headroom_marker_checks_every_report(run_pytest, pytester):
    pytester.makepyfile(
        """
import pytest, torch

def bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)

@pytest.mark.fusion_headroom(0.25)
def test_unfused(fusion):
    fusion.profile(bias_gelu, torch.randn(64, 64, device="cpu"), torch.randn(64, device="cpu"))

@pytest.mark.fusion_headroom(0.25)
def test_fused(fusion):
    fusion.profile(torch.nn.functional.gelu, torch.randn(64, 64, device="cpu"))

@pytest.mark.fusion_headroom(2)
def test_bad(fusion):
    pass
"""
    )
    result = run_pytest("--fusion-device=cpu")
    result.assert_outcomes(passed=1, failed=1, errors=1)  # the bad marker fails at setup
    result.stdout.fnmatch_lines(["*@pytest.mark.fusion_headroom(0.25): fusing the region's memory-bound chains would save 50% of its modelled bytes > allowed 25%*"])
    result.stdout.fnmatch_lines(["*@pytest.mark.fusion_headroom: fraction must be a number in [[]0, 1], got 2*"])


# --------------------------------------------------------------------------- launch overhead


def _timed(device, time_s, wall_s, kernels=50, each=2e-6):
    from pytest_fusioncheck import FusionReport

    ks = [Kernel(name=f"k{i}", time_s=each, bytes=0) for i in range(kernels)]
    return FusionReport(label="r", device=device, kernels=ks, time_s=time_s, wall_time_s=wall_s, peak_bandwidth=1e12)


def test_a_region_of_many_tiny_kernels_with_the_device_idle_is_launch_bound():
    report = _timed("cuda", time_s=100e-6, wall_s=1e-3)
    assert report.launch_overhead_share == pytest.approx(0.9)
    assert report.launch_bound and "launch-bound (90% of the wall time idle)" in report.summary()
    big = _timed("cuda", time_s=0.9e-3, wall_s=1e-3, kernels=2, each=450e-6)
    assert not big.launch_bound and big.launch_overhead_share == pytest.approx(0.1)
    assert _timed("cpu", time_s=1e-3, wall_s=1e-3).launch_overhead_share is None


def test_the_launch_overhead_verdict_fails_on_a_gpu_and_is_reported_on_cpu():
    from pytest_fusioncheck.verdict import check_launch_overhead

    with pytest.raises(FusionAssertionError, match=r"90% of the wall time is launch overhead > allowed 50%.*50 launches"):
        check_launch_overhead(_timed("cuda", 100e-6, 1e-3), 0.5, "@pytest.mark.max_launch_overhead(0.5)")
    check_launch_overhead(_timed("cuda", 100e-6, 1e-3), 0.95, "w")
    from pytest_fusioncheck.state import ReportLog

    cpu, log = _timed("cpu", 1e-3, 1e-3), ReportLog(test_id="t.py::x")
    check_launch_overhead(cpu, 0.01, "w", log=log)
    assert any("launch overhead is a GPU figure" in w for w in log.notes_for(cpu))


def test_the_launch_overhead_marker_validates_its_fraction(run_pytest, pytester):
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_launch_overhead(0)
def test_bad(fusion):
    pass

@pytest.mark.max_launch_overhead(0.5)
def test_cpu(fusion):
    fusion.profile(torch.neg, torch.ones(4, device="cpu"))
"""
    )
    result = run_pytest("--fusion-device=cpu")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.max_launch_overhead: fraction must be a number in (0, 1], got 0*"])


def test_a_chain_with_a_fused_budget_of_zero_says_so_instead_of_infinity():
    from pytest_fusioncheck.headroom import Chain

    text = Chain(kernels=[0, 1], ops=["aten::zero_", "aten::fill_"], source=None, bytes=2048, fused_bytes=0).describe()
    assert "infx" not in text and "2.0 KiB against a fused budget of 0 B" in text


# --- chains cut at module boundaries, named by module, copies counted ------------------------


def _m(op, module, reads, writes):
    k = _k(op, reads, writes)
    k.module = module
    return k


def _decoder_layer(i, x_in, x_out):
    """A pre-norm layer's norm chain, a GEMM, and the residual add in the layer's own forward."""
    n = f"model.layers.{i}.input_layernorm"
    return [
        _m("pow", n, {x_in: 100}, {f"p{i}": 100}),
        _m("mean", n, {f"p{i}": 100}, {f"v{i}": 1}),
        _m("mul", n, {x_in: 100, f"v{i}": 1}, {f"h{i}": 100}),
        _m("mm", f"model.layers.{i}.mlp.up_proj", {f"h{i}": 100, f"w{i}": 100}, {f"u{i}": 100}),
        _m("add", f"model.layers.{i}", {x_in: 100, f"u{i}": 100}, {x_out: 100}),
    ]


def test_the_residual_stream_does_not_glue_one_layers_norm_to_the_next_and_copies_are_counted():
    kernels = _decoder_layer(0, "x0", "x1") + _decoder_layer(1, "x1", "x2")
    chains = find_chains(kernels, returned={"x2"})
    assert [c.kernels for c in chains] == [[0, 1, 2], [5, 6, 7]]  # each layer's norm alone; the adds join nothing
    assert [c.module for c in chains] == ["model.layers.0.input_layernorm", "model.layers.1.input_layernorm"]
    assert chains[0].pattern == "model.layers.*.input_layernorm" and len(chains[0].copies) == 2
    text = chains[0].describe()
    assert text.startswith("model.layers.0.input_layernorm: 3 kernels (0-2: pow, mean, mul) move")
    assert f"; 2 copies (model.layers.*.input_layernorm) save {chains[0].excess * 2} B in all" in text
    assert chains[0].to_dict()["module"] == "model.layers.0.input_layernorm" and chains[0].to_dict()["copies"] == 2


def test_without_modules_layer_zeros_residual_add_joins_layer_ones_norm():
    kernels = _decoder_layer(0, "x0", "x1") + _decoder_layer(1, "x1", "x2")
    for k in kernels:
        k.module = None
    chains = find_chains(kernels, returned={"x2"})
    assert sorted(c.kernels for c in chains) == [[0, 1, 2], [4, 5, 6, 7]]
    assert all(c.module is None and c.copies == [] for c in chains)
    assert chains[0].describe().startswith("kernels ")


def test_a_module_and_its_direct_child_chain_together_and_the_name_says_so():
    kernels = [
        _m("mul", "model.layers.0.mlp", {"g": 10, "u": 10}, {"t": 10}),
        _m("gelu", "model.layers.0.mlp.act_fn", {"t": 10}, {"a": 10}),
        _m("add", "model.layers.0.mlp", {"a": 10, "b": 10}, {"y": 10}),
    ]
    (chain,) = find_chains(kernels, returned={"y"})
    assert chain.kernels == [0, 1, 2] and chain.module == "model.layers.0.mlp (with act_fn)"
    grandchild = [_m("mul", "model.layers.0", {"g": 10}, {"t": 10}), _m("gelu", "model.layers.0.mlp.act_fn", {"t": 10}, {"a": 10})]
    assert find_chains(grandchild, returned={"a"}) == []


def test_a_chain_never_holds_two_kernels_that_a_gemm_between_them_orders():
    kernels = [
        _k("add", {"x": 10}, {"t": 10}),
        _k("mm", {"t": 10, "w": 10}, {"z": 10}),  # waits for add
        _k("mul", {"t": 10, "z": 10}, {"y": 10}),  # waits for add and for the GEMM
    ]
    assert find_chains(kernels, returned={"y"}) == []  # one kernel cannot both feed the GEMM and wait for it
    independent = [kernels[0], _k("mm", {"w": 10, "v": 10}, {"z": 10}), _k("mul", {"t": 10, "z": 10}, {"y": 10})]
    (chain,) = find_chains(independent, returned={"y"})
    assert chain.kernels == [0, 2]
