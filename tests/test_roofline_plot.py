"""FLOPs per kernel and the roofline they feed (``--fusion-roofline``, docs/roofline.md):
exact FLOPs for matmul-class ops, flagged estimates for the rest, none for Inductor's
kernels, FLOPs in the JSON, and a plot with its ceilings, points and footnote."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from pytest_fusioncheck import profile
from pytest_fusioncheck.ops import OpRecord
from pytest_fusioncheck.report import Kernel

M, N, K = 48, 40, 24


def _by_op(report):
    out = {}
    for k in report.kernels:
        out.setdefault(k.op, []).append(k)
    return out


def test_eager_matmul_class_ops_have_exact_flops():
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    w = torch.randn(N, K)  # linear's weight is (out, in)
    batch = torch.randn(3, M, K), torch.randn(3, K, N)

    def gemms():
        return torch.mm(a, b), torch.addmm(bias, a, b), torch.nn.functional.linear(a, w, bias), torch.bmm(*batch), torch.mv(a, b[:, 0])

    ops = _by_op(profile(gemms, warmup=0, device="cpu"))
    assert [k.flops for k in ops["aten::mm"]] == [2 * M * N * K]
    assert [k.flops for k in ops["aten::addmm"]] == [2 * M * N * K, 2 * M * N * K]  # addmm and linear (-> addmm)
    assert [k.flops for k in ops["aten::bmm"]] == [3 * 2 * M * N * K]
    assert [k.flops for k in ops["aten::mv"]] == [2 * M * K]
    for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::mv"):
        assert all(not k.flops_estimated and k.dtype == "float32" for k in ops[op]), op


def test_sdpa_on_cpu_gets_torchs_attention_formula():
    q = torch.randn(1, 2, 16, 8)  # batch, heads, sequence, head dim
    (k,) = profile(torch.nn.functional.scaled_dot_product_attention, q, q, q, warmup=0, device="cpu").kernels
    assert (k.flops, k.flops_estimated) == (1 * 2 * (2 * 16 * 16 * 8) * 2, False), k  # QK^T and PV


def test_other_ops_get_a_flagged_estimate_data_movement_zero_and_integer_work_none():
    x = torch.randn(32, 64, dtype=torch.bfloat16)

    def chain():
        return x.exp(), x.sum(-1), torch.cat([x, x]), torch.arange(16) * 2

    ops = _by_op(profile(chain, warmup=0, device="cpu"))
    (exp,) = ops["aten::exp"]
    assert (exp.flops, exp.flops_estimated, exp.dtype) == (32 * 64, True, "bfloat16")  # one per output element
    (total,) = ops["aten::sum"]
    assert (total.flops, total.flops_estimated) == (32 * 64, True)  # a reduction: one per input element
    (cat,) = ops["aten::cat"]
    assert (cat.flops, cat.flops_estimated) == (0, False)  # data movement: a known 0
    assert [k.flops for k in ops["aten::mul"]] == [None]  # integer work: unknown, not 0


def test_an_inductor_kernel_estimates_one_flop_per_element_of_each_nodes_iteration_space():
    a, b = torch.randn(M, K), torch.randn(K, N)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: (a @ b).relu() * 2)
    report = profile(compiled, a, b, device="cpu")
    generated = [k for k in report.kernels if k.op.startswith(("fused", "generated"))]
    assert len(generated) == 1, str(report)
    assert (generated[0].flops, generated[0].flops_estimated) == (M * N, True), str(report)  # one node over M x N
    assert [k.flops for k in report.kernels if k.op == "aten::mm"] == [2 * M * N * K], str(report)  # extern: exact

    x = torch.randn(M, N)
    torch._dynamo.reset()
    (kernel,) = profile(torch.compile(lambda t: t.sum(-1) + 1.0), x, device="cpu").kernels
    assert (kernel.flops, kernel.flops_estimated) == (M * N + M, True)  # the sum over its input, the add over its output
    torch._dynamo.reset()
    (kernel,) = profile(torch.compile(lambda t: t.long() + 1), x, device="cpu").kernels
    assert (kernel.flops, kernel.flops_estimated) == (None, False)  # integer work: unknown, not 0


def test_cuda_attribution_gives_the_ops_flops_to_the_kernel_its_bytes_go_to():
    from pytest_fusioncheck.sources.kernels_cuda import attribute_op_bytes, attribute_op_flops

    gemm, reduce, memset = Kernel("gemm", time_s=3e-6), Kernel("splitk_reduce", time_s=1e-6), Kernel("memset", kind="copy")
    op = OpRecord(0, "aten::mm", "kernel", 100, 50, None, flops=2 * M * N * K, dtype="bfloat16")
    group = [memset, gemm, reduce]
    attribute_op_flops(group, attribute_op_bytes(group, op.bytes), op)
    assert (gemm.bytes, gemm.flops, gemm.dtype) == (150, 2 * M * N * K, "bfloat16")
    assert (reduce.bytes, reduce.flops) == (0, 0)
    assert memset.flops is None  # copies carry no FLOP figure
    unknown = OpRecord(1, "aten::foo", "kernel", None, None, None)
    k1, k2 = Kernel("a", time_s=2e-6), Kernel("b", time_s=1e-6)
    attribute_op_flops([k1, k2], attribute_op_bytes([k1, k2], None), unknown)
    assert (k1.flops, k2.flops) == (None, None)


def test_a_triton_launch_has_only_the_flops_its_metadata_declares():
    from pytest_fusioncheck.sources.bytes_model import triton_launch_flops

    assert triton_launch_flops({"bytes": 10, "flops": 2 * M * N * K}) == 2 * M * N * K
    assert triton_launch_flops({"flops16": 3, "flops32": 4}) == 7
    assert triton_launch_flops({"bytes": 10}) is None
    assert triton_launch_flops(None) is None


def test_ceilings_come_from_the_override_else_a_documented_table():
    from pytest_fusioncheck.roofline import known_peak_bandwidth, peak_flops
    from pytest_fusioncheck.state import Settings

    assert known_peak_bandwidth("cuda:NVIDIA H200", Settings(peak_bandwidth=4e12)) == (4e12, "--fusion-peak-bandwidth")
    assert known_peak_bandwidth("cuda:NVIDIA H200", Settings(), reported=4.5e12) == (4.5e12, "measured")
    assert known_peak_bandwidth("cuda:NVIDIA H200", Settings())[0] == 4.8e12
    assert known_peak_bandwidth("cuda:Some Future GPU", Settings()) is None
    assert peak_flops("cuda:NVIDIA H100 80GB HBM3", "bfloat16")[0] == 989e12
    assert peak_flops("cuda:NVIDIA H200", "float32")[0] == 67e12
    assert peak_flops("cuda:NVIDIA H200", "tf32")[0] == 495e12
    assert peak_flops("cuda:Some Future GPU", "bfloat16") is None
    assert peak_flops("cpu", "float32")[0] > 0


def test_the_slope_is_the_peak_the_reports_verdicts_used_and_its_label_says_which():
    from pytest_fusioncheck.sinks.plot import bandwidth_slope, slope_label
    from pytest_fusioncheck.state import Settings

    h200 = {"device_kind": "cuda:NVIDIA H200", "peak_bandwidth": 4.25e12}
    other = {"device_kind": "cuda:NVIDIA H100", "peak_bandwidth": 3.1e12}
    collected = [("t.py::a", "", [h200, other]), ("t.py::b", "", [dict(h200, peak_bandwidth=4.2e12)])]
    slope = bandwidth_slope(collected, "cuda:NVIDIA H200", Settings())
    assert slope == (4.25e12, "measured")  # not the datasheet's 4.8 TB/s, not the H100's figure
    assert slope_label(slope) == "measured peak 4.25 TB/s"
    unmeasured = bandwidth_slope([("t.py::a", "", [{"device_kind": "cuda:NVIDIA H200"}])], "cuda:NVIDIA H200", Settings())
    assert unmeasured == (4.8e12, "datasheet default, not measured")
    assert slope_label(unmeasured) == "datasheet 4.8 TB/s (no measured peak)"
    assert slope_label((4e12, "--fusion-peak-bandwidth")) == "peak 4 TB/s (--fusion-peak-bandwidth)"


ROOFLINE = """
import torch

def test_gemm(fusion):
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    fusion.profile(torch.mm, a, b)

def test_mixed(fusion):
    x = torch.randn(32, 64)
    fusion.profile(lambda x: (x.exp(), torch.cat([x, x]), torch.arange(8) * 2), x)
"""


def _svg_ids(path):
    return {el.get("id") for el in ET.parse(path).iter() if el.get("id")}


def test_json_and_the_svg_roofline_carry_the_kernels_flops_ceilings_and_what_is_left_out(run_pytest, pytester):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(test_roof=ROOFLINE)
    result = run_pytest("--fusion-json=r.json", "--fusion-roofline=roof.svg", "--fusion-peak-bandwidth=2e10", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    data = json.loads((pytester.path / "r.json").read_text())
    (gemm,) = data["test_roof.py::test_gemm"][0]["kernels"]
    assert (gemm["op"], gemm["flops"], gemm["flops_estimated"], gemm["dtype"]) == ("aten::mm", 2 * 64 * 32 * 48, False, "float32")
    mixed = {k["op"]: k for k in data["test_roof.py::test_mixed"][0]["kernels"]}
    assert (mixed["aten::exp"]["flops"], mixed["aten::exp"]["flops_estimated"]) == (32 * 64, True)
    assert mixed["aten::cat"]["flops"] == 0 and mixed["aten::mul"]["flops"] is None and mixed["aten::arange"]["flops"] is None
    # Shown: mm, exp. Left out: cat (0 FLOP), arange and the integer mul (no FLOP count).
    result.stdout.fnmatch_lines(["*roofline of 2 kernel(s) written to roof.svg; 3 without FLOPs, bytes or time not shown*"])
    svg = (pytester.path / "roof.svg").read_text()
    ids = _svg_ids(pytester.path / "roof.svg")
    assert {"ceiling-bandwidth0", "ceiling-compute-float320", "ridge-float320", "label-compute-float320", "kernel-0", "kernel-1"} <= ids
    assert "kernel-2" not in ids
    assert "2 kernels without FLOP counts not shown" in svg
    assert "1 kernel with 0 FLOP not shown" in svg
    assert "20 GB/s (--fusion-peak-bandwidth)" in svg and "float32 peak" in svg
    assert "2 kernels of 2 tests" in svg


def test_the_png_roofline_and_the_not_shown_count(tmp_path):
    pytest.importorskip("matplotlib")
    from pytest_fusioncheck.sinks.plot import kernel_points, roofline_plot

    def kernel(**kw):
        return {"name": "k", "op": "aten::x", "time_s": 1e-3, "bytes": 4096, "flops": 8192, **kw}

    reports = [
        {
            "device_kind": "cuda:NVIDIA H200",
            "kernels": [
                kernel(dtype="bfloat16"),
                kernel(flops=1 << 20, dtype="bfloat16", time_s=2e-3),
                kernel(flops=None),  # an Inductor kernel
                kernel(flops=0),  # data movement
                kernel(bytes=None),  # unmodelled
                kernel(time_s=0.0),
            ],
            "copies": [kernel(flops=None)],  # copies are not kernels: not counted
        }
    ]
    collected = [("t.py::test_a", "", reports)]
    points, left = kernel_points(collected)
    assert len(points) == 2 and (left.no_flops, left.zero_flops, left.no_bytes_or_time) == (1, 1, 2)
    shown, left = roofline_plot(collected, str(tmp_path / "roof.png"))
    assert shown == 2 and left.total == 4
    assert (tmp_path / "roof.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    roofline_plot(collected, str(tmp_path / "roof.svg"))
    svg = (tmp_path / "roof.svg").read_text()
    assert "bfloat16 peak 989 TFLOP/s" in svg and "4.8 TB/s (datasheet default, not measured)" in svg
    assert "1 kernel without FLOP counts not shown" in svg and "2 kernels with FLOPs but no modelled bytes or time not shown" in svg
