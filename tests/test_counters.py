"""Nsight Compute counters: CSV parsing on recorded samples, range matching, errors."""

import os

import pytest

from pytest_fusioncheck.sources import bytes_ncu as counters
from pytest_fusioncheck.sources.bytes_ncu import CountersError, NcuKernel, match, parse_ncu_csv

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_the_recorded_h200_sample_parses_into_kernels_with_their_ranges_and_dram_bytes():
    with open(os.path.join(DATA, "ncu_raw_h200.csv")) as fh:
        kernels = parse_ncu_csv(fh.read())
    assert len(kernels) == 28
    first = kernels[0]
    assert first.range == "fusioncheck:five_op_softmax"
    assert first.name.startswith("void at::reduce_kernel<512, 1, at::ReduceOp<float, at::MaxOps<float>")
    assert (first.read_bytes, first.write_bytes) == (33625088, 405760)
    assert [k.range for k in kernels].count("fusioncheck:five_op_softmax") == 5
    assert [k.range for k in kernels].count("fusioncheck:compiled bias+gelu") == 1
    assert kernels[27].name == "triton_poi_fused_add_gelu_0"


SAMPLE = '''==PROF== Connected to process 7 (/usr/bin/python3)
"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"
"","","","","","","Mbyte","Kbyte"
"0","7","python3","h","7  ""<default domain>:fusioncheck:3:tests/t.py::test_a:none:none:none:none:none:none"" ","k0","1.5","2,048"
"1","7","python3","h","7  ""<default domain>:fusioncheck:3:tests/t.py::test_a:none:none:none:none:none:none"" ","k1","1","0"
"2","7","python3","h","7  ""<default domain>:fusioncheck:5:tests/t.py::test_b[x:y]:none:none:none:none:none:none"" ","k2","3","1"
==PROF== Disconnected from process 7
'''


def test_units_thousands_separators_and_colons_in_labels_are_handled():
    kernels = parse_ncu_csv(SAMPLE)
    assert [(k.seq, k.label, k.read_bytes, k.write_bytes) for k in kernels] == [
        (3, "tests/t.py::test_a", 1_500_000, 2_048_000),
        (3, "tests/t.py::test_a", 1_000_000, 0),
        (5, "tests/t.py::test_b[x:y]", 3_000_000, 1_000),
    ]


# As ncu 2025.3 writes a training step's kernels (H200): the forward's in both the calling
# thread's push/pop range and the start/end range, the backward's (autograd's thread) in the
# start/end range only.
START_END_SAMPLE = '''"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"
"","","","","","","","byte","byte"
"0","679","python3","h","679  ""<default domain>:fusioncheck:7:train_step:none:none:none:none:none:none"" "," ""0:<default domain>:fusioncheck:7:train_step:none:none:none:none:none:none"" ","gemm","10","20"
"1","679","python3","h",""," ""0:<default domain>:fusioncheck:7:train_step:none:none:none:none:none:none"" ","reduce_kernel","30","40"
'''


def test_kernels_launched_by_autograds_thread_are_read_from_the_start_end_range_column():
    kernels = parse_ncu_csv(START_END_SAMPLE)
    assert [(k.name, k.seq, k.label, k.bytes) for k in kernels] == [("gemm", 7, "train_step", 30), ("reduce_kernel", 7, "train_step", 70)]


# As ncu 2025.3 writes a range the nvtx package opened (H100, 2026-12-06): the range's name again as a registered
# message after a colour, in both columns.
NVTX_PACKAGE_SAMPLE = '''"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"
"","","","","","","","byte","byte"
"0","1176","python3.12","h",""," ""0:<default domain>:fusioncheck:1:lambda_over_a_compiled_gpt2_mlp:none:none:RGB:0xff:REGISTERED:fusioncheck:1:lambda_over_a_compiled_gpt2_mlp"" ","nvjet_gemm","10","20"
"1","1176","python3.12","h","1176  ""<default domain>:fusioncheck:4:tests/t.py::test_b[x:y]:none:none:RGB:0xff:REGISTERED:fusioncheck:4:tests/t.py::test_b[x:y]"" ","","k2","30","40"
'''


def test_ranges_the_nvtx_package_opened_read_their_label_past_the_registered_message():
    kernels = parse_ncu_csv(NVTX_PACKAGE_SAMPLE)
    assert [(k.seq, k.label, k.bytes) for k in kernels] == [(1, "lambda_over_a_compiled_gpt2_mlp", 30),
                                                            (4, "tests/t.py::test_b[x:y]", 70)]


def test_reports_get_the_kernels_of_their_own_range_and_orphans_are_reported():
    kernels = parse_ncu_csv(SAMPLE) + [NcuKernel(9, "stray", 1, 1, "fusioncheck:99:elsewhere")]
    child = {
        "tests/t.py::test_a": [{"seq": 3, "kernel_count": 0}],
        "tests/t.py::test_b[x:y]": [{"seq": 4, "kernel_count": 0}, {"seq": 5, "kernel_count": 0}],
    }
    measured = match(kernels, child)
    assert measured.kernel_bytes("tests/t.py::test_a", 0) == [3_548_000, 1_000_000]
    assert measured.kernel_bytes("tests/t.py::test_b[x:y]", 0) == []
    assert measured.kernel_bytes("tests/t.py::test_b[x:y]", 1) == [3_001_000]
    assert measured.kernel_bytes("tests/t.py::test_c", 0) is None
    assert measured.problems and "seq [99]" in measured.problems[0]


def test_a_csv_without_the_dram_metrics_is_a_clear_error():
    with pytest.raises(CountersError, match="lacks a needed column"):
        parse_ncu_csv('"ID","Kernel Name"\n"0","k"\n')


def test_the_ncu_command_filters_on_the_plugins_nvtx_ranges_and_leaves_clocks_alone():
    cmd = counters.ncu_command("/x/ncu", "/tmp/log.csv", ["python", "-m", "pytest"])
    assert cmd[:3] == ["/x/ncu", "--clock-control", "none"]
    # no trailing "/": start/end ranges, which hold what autograd's thread launches too
    assert "--nvtx" in cmd and cmd[cmd.index("--nvtx-include") + 1] == "regex:^fusioncheck:.*"
    assert "dram__bytes_read.sum,dram__bytes_write.sum" in cmd
    assert cmd[-3:] == ["python", "-m", "pytest"]


def test_counters_without_ncu_or_gpu_is_a_clear_usage_error(run_pytest, pytester, monkeypatch):
    monkeypatch.setenv("FUSIONCHECK_NCU", "/nonexistent/ncu")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    pytester.makepyfile("def test_x(fusion):\n    pass\n")
    result = run_pytest("--fusion-counters=ncu")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--fusion-counters=ncu: *"])


def test_an_unknown_counters_value_is_a_usage_error(run_pytest, pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run_pytest("--fusion-counters=perf")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--fusion-counters must be 'none' or 'ncu', got 'perf'*"])


def test_the_recorded_sample_with_sequence_numbers_groups_kernels_by_report():
    with open(os.path.join(DATA, "ncu_raw_h200_seq.csv")) as fh:
        groups = counters.group_by_seq(parse_ncu_csv(fh.read()))
    assert {seq: (ks[0].label, len(ks)) for seq, ks in groups.items()} == {
        1: ("five_op_softmax", 5), 2: ("torch.softmax", 1), 3: ("linear+gelu", 2), 4: ("layer_norm", 1),
        5: ("mlp_block", 5), 6: ("bias+gelu", 2), 7: ("compiled five_op_softmax", 1),
        8: ("compiled torch.softmax", 1), 9: ("compiled linear+gelu", 2), 10: ("compiled layer_norm", 1),
        11: ("compiled mlp_block", 5), 12: ("compiled bias+gelu", 1),
    }
