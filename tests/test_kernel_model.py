"""The CPU kernel model and kernel records, on plain data and small CPU tensors."""

import pytest
import torch

from pytest_fusioncheck import profile
from pytest_fusioncheck.report import shorten_kernel_name
from pytest_fusioncheck.sources.bytes_model import generated_origin, inductor_cpu_kernel


@pytest.mark.parametrize(
    "name, short",
    [
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4, 4>>(T3)", "reduce_kernel<…>"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 2)]>(int, T2, T3)", "vectorized_elementwise_kernel<…>"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64…"),
        ("triton_per_fused__softmax_0", "triton_per_fused__softmax_0"),
        ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ],
)
def test_kernel_names_are_shortened_for_the_table(name, short):
    assert shorten_kernel_name(name) == short


def test_inductor_cpu_kernel_events_are_recognised_with_or_without_the_graph_prefix():
    assert inductor_cpu_kernel("graph_0_cpp_fused_add_gelu_0") == "cpp_fused_add_gelu_0"
    assert inductor_cpu_kernel("cpp_fused__softmax_3") == "cpp_fused__softmax_3"
    assert inductor_cpu_kernel("aten::addmm") is None
    assert generated_origin("triton_poi_fused_add_gelu_0").startswith("fused:")


def test_addmm_counts_once_although_it_calls_copy_and_resolve_conj_inside():
    lin = torch.nn.Linear(16, 16)
    report = profile(lin, torch.randn(4, 16))
    assert [k.op for k in report.kernels] == ["aten::addmm"]


def test_views_metadata_ops_and_allocations_launch_nothing():
    def shuffle(x):
        y = x.view(4, 8).reshape(8, 4).t()[::2].unsqueeze(0)  # views only
        _ = torch.empty(10)  # allocation
        return y.detach()

    assert profile(shuffle, torch.randn(32)).kernel_count == 0


def test_a_contiguous_copy_is_a_copy_and_a_transposing_one_is_a_kernel():
    import inspect

    x = torch.randn(64, 64)
    line = inspect.currentframe().f_lineno + 1
    report = profile(lambda t: (t.clone(), t.t().contiguous()), x)
    assert [k.op for k in report.kernels] == ["aten::clone"]
    assert [k.op for k in report.copies] == ["aten::clone"]
    assert report.kernels[0].source.endswith(f"test_kernel_model.py:{line}")


def test_item_is_a_host_read_copy_not_a_kernel():
    report = profile(lambda t: t.sum().item(), torch.randn(8))
    assert [k.op for k in report.kernels] == ["aten::sum"]
    assert [k.op for k in report.copies] == ["aten::_local_scalar_dense"]


def test_a_triton_kernel_under_the_interpreter_counts_as_one_kernel_with_its_declared_bytes():
    import triton
    import triton.language as tl

    def meta(grid, kernel, args):
        return {"name": "double", "bytes": 1234}

    @triton.jit(launch_metadata=meta)
    def _double_kernel(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 2)

    def double(x):
        y = torch.empty_like(x)
        _double_kernel[(1,)](x, y, 16)
        return y

    x = torch.randn(16)
    report = profile(double, x)
    assert [(k.name, k.op, k.bytes) for k in report.kernels] == [("_double_kernel", "triton", 1234)]
    assert torch.equal(report.output, 2 * x)


def test_profiling_a_device_the_arguments_are_not_on_is_noted_on_the_report():
    from pytest_fusioncheck.capture import profile_call

    x = torch.empty(4, device="meta")  # an argument on a device other than the profiled one
    report = profile_call(lambda t: torch.ones(2).neg(), (x,), {}, warmup=0, device="cpu")
    assert any("the tensor arguments are on meta" in w for w in report.warnings)
