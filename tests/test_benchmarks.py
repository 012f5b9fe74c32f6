"""The benchmark scripts' own logic, on CPU: what they print must not hide a failure."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/

from benchmarks.sweep import _summarise  # noqa: E402


def _record(width, ours, torch_pct, error=None):
    rec = {"subject": "layer_norm_fwd", "dtype": "bfloat16", "width": width, "rows": 8, "target": 90,
           "pct": {"ours": ours, "torch": torch_pct}}
    if error:
        rec["errors"] = {"ours": error}
    return rec


def test_a_width_where_ours_failed_is_listed_and_counted_not_left_out(capsys):
    # A kernel that raised used to drop out of the figures silently: the summary then showed
    # the other widths' median and no miss, as if the failed widths had met their target.
    records = [_record(1024, 95.0, 60.0), _record(4097, None, 20.0, "CompilationError: loop-carried type"),
               _record(8191, 50.0, 22.0)]
    assert _summarise(records) == 1
    out = capsys.readouterr().out
    assert "2 of 3" in out  # widths timed
    assert "Ours failed" in out and "| 4097 | CompilationError: loop-carried type |" in out
    assert "| 8191 | 50.0% | 90% |" in out  # the miss is still listed, to a tenth of a point


def test_a_sweep_where_every_width_ran_reports_no_failure(capsys):
    assert _summarise([_record(1024, 95.0, 60.0), _record(2048, 92.0, 61.0)]) == 0
    out = capsys.readouterr().out
    assert "Ours failed" not in out and "2 of 2" in out and "Below target" not in out


def test_the_sweep_prints_a_recorded_runs_summary_and_bands_without_its_misses(tmp_path, capsys):
    from benchmarks import sweep

    records = [_record(1024, 95.0, 60.0), _record(8191, 50.0, 22.0)]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"header": "GPU X, 2026-01-01", "settings": [], "copy_gbps": 4000.0, "records": records}))
    assert sweep.main(["--tables", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# width sweep: GPU X, 2026-01-01")
    assert "2 of 2" in out and "By band" in out
    assert "Below target" not in out  # a recorded run's tables: the misses are the run's own output, not BENCHMARKS.md's


def test_the_sweep_groups_its_widths_into_bands_with_aligned_and_ragged_spreads(capsys):
    from benchmarks.sweep import band_rows

    def rec(width, ours, torch_pct, target):
        return {"subject": "softmax", "dtype": "bfloat16", "width": width, "rows": 8, "target": target,
                "pct": {"ours": ours, "torch": torch_pct}}

    records = [rec(16384, 95.0, 50.0, 90), rec(17000, 81.0, 45.0, 90), rec(28672, 85.0, 43.0, 90),
               rec(32000, 91.0, 41.0, 90), rec(30522, 79.0, 41.0, 90), rec(128256, 82.0, 42.0, 80),
               rec(50257, 78.0, 78.0, 80), rec(4097, None, 20.0, 90)]  # 4097: ours failed, in no band
    rows = {row[2]: row for row in band_rows(records)}
    assert set(rows) == {"2048-16384", "16385-32768", "32769+"}
    # 28672 and 32000 aligned, 17000 and 30522 ragged; one of four at 90%; lowest ratio 81 / 45 at 17000
    assert rows["16385-32768"] == ["softmax", "bfloat16", "16385-32768", 4, "1 of 4", "85 / 88", "79 / 80", "1.80x at 17000"]
    assert rows["32769+"][3:] == [2, "1 of 2", "82 / 82", "78 / 78", "1.00x at 50257"]
    assert rows["2048-16384"][5:7] == ["95 / 95", "-"]
    _summarise(records)
    assert "By band" in capsys.readouterr().out


def test_the_misses_are_listed_as_runs_of_neighbouring_widths_below_target(capsys):
    from benchmarks.sweep import miss_runs

    def rec(width, ours, dtype="bfloat16", target=90):
        return {"subject": "layer_norm_fwd", "dtype": dtype, "width": width, "rows": 8, "target": target,
                "pct": {"ours": ours, "torch": 50.0}}

    # 4160 passes between two runs, 8192 before 16383's run of one; 4256 failed (no figure) and 4260 has no target:
    # neither joins nor breaks a run; fp16 keeps its own runs
    records = [rec(4096, 95.0), rec(4224, 63.2), rec(4288, 72.0), rec(4160, 91.0), rec(4097, 85.0), rec(16383, 78.4),
               rec(8192, 93.0),
               rec(4256, None), rec(4260, 99.0, target=None), rec(4224, 64.0, "float16"), rec(8192, 96.0, "float16")]
    assert miss_runs(records) == [
        ["layer_norm_fwd", "bfloat16", "4097", 1, "85.0%", "90%"],
        ["layer_norm_fwd", "bfloat16", "4224-4288", 2, "63.2-72.0%", "90%"],
        ["layer_norm_fwd", "bfloat16", "16383", 1, "78.4%", "90%"],
        ["layer_norm_fwd", "float16", "4224", 1, "64.0%", "90%"],
    ]
    _summarise(records)
    out = capsys.readouterr().out
    assert "Below target, in runs" in out and "| 4224-4288 | 2 | 63.2-72.0% | 90% |" in out
    assert miss_runs([rec(4096, 95.0)]) == []


def test_widths_under_the_best_anchors_target_share_are_listed_with_that_anchor(capsys):
    def rec(subject, width, ours, liger):
        return {"subject": subject, "dtype": "float32", "width": width, "rows": 8, "target": 90,
                "pct": {"ours": ours, "torch": 60.0, "liger": liger}}

    # softmax: ours at least 0.98x the best anchor (issue 12); 92.9 / 95.7 = 0.971 is under it, 95 / 96 = 0.990 is not
    records = [rec("softmax", 9728, 92.9, 95.7), rec("softmax", 1024, 95.0, 96.0), rec("layer_norm_fwd", 4096, 90.0, 96.0)]
    _summarise(records)
    out = capsys.readouterr().out
    assert "Under the best anchor's target share" in out
    assert "| softmax | float32 | 9728 | 92.9% | liger 95.7% | 0.971x | 0.98x |" in out
    assert "| 1024 |" not in out.split("Under the best anchor")[1]  # 0.990x: at target
    assert "layer_norm_fwd | float32 | 4096 | 90.0% | liger" not in out  # no anchor target for the layer norm
    _summarise([rec("softmax", 1024, 95.0, 96.0)])
    assert "Under the best anchor" not in capsys.readouterr().out


def test_the_sweep_times_only_the_implementations_asked_for_and_summarises_ours_alone(capsys):
    from benchmarks import sweep

    fns = {"ours": 1, "torch": 2, "liger": 3}
    assert sweep.select_impls(fns, []) == fns
    assert list(sweep.select_impls(fns, ["torch", "ours"])) == ["ours", "torch"]  # their order, not the request's
    assert sweep.select_impls(fns, ["compile"]) == {}  # asked for, not there (no --compile): nothing timed of it
    assert sweep.parse_impls(" ours, liger") == ["ours", "liger"] and sweep.parse_impls("") == []
    with pytest.raises(SystemExit, match="unknown eager; choose from ours, torch, compile, liger"):
        sweep.parse_impls("ours,eager")
    alone = [{"subject": "softmax", "dtype": "bfloat16", "width": w, "rows": 8, "target": 90, "pct": {"ours": p}}
             for w, p in ((17000, 81.0), (32000, 91.0))]
    assert _summarise(alone) == 0  # no anchor: no ratio, no crash
    out = capsys.readouterr().out
    assert "| 81% at 17000 | - | 1 |" in out and "| 1 of 2 |" in out


def test_a_subject_with_no_width_timed_is_still_reported(capsys):
    assert _summarise([_record(4097, None, 20.0, "RuntimeError: x")]) == 1
    assert "| 4097 | RuntimeError: x |" in capsys.readouterr().out


def test_liger_is_an_anchor_of_the_sweep_when_installed_and_absent_otherwise(monkeypatch):
    import types

    import torch

    from benchmarks import sweep

    x = torch.randn(4, 8)
    monkeypatch.setitem(sys.modules, "liger_kernel.ops.softmax", None)  # not installed: import fails
    assert "liger" not in sweep.subject("softmax", x, compile_=False)[1]
    fake = types.ModuleType("liger_kernel.ops.softmax")
    fake._softmax_forward = lambda t: (t * 2, "cache")
    monkeypatch.setitem(sys.modules, "liger_kernel.ops.softmax", fake)
    nbytes, fns = sweep.subject("softmax", x, compile_=False)
    assert set(fns) == {"ours", "torch", "liger"} and nbytes == 2 * x.numel() * 4
    assert torch.equal(fns["liger"](), x * 2)


def test_sweep_set_changes_a_launch_plan_constant_or_a_tuned_choice_and_refuses_what_it_cannot_set(monkeypatch):
    import dataclasses

    from benchmarks import sweep
    from reference_kernels import _device, layer_norm, softmax

    h200 = _device.DESCRIPTIONS["H200"]
    tuned = _device.tuned("softmax", 90, softmax.DEFAULT_TUNING)
    monkeypatch.setattr(softmax, "STAGED_STAGES", softmax.STAGED_STAGES)  # restored after the test
    monkeypatch.setattr(_device, "tuning", _device.tuning)
    monkeypatch.setattr(sweep, "TUNED_CHOICES", {})
    done = sweep.apply_settings(["softmax.STAGED_STAGES=2", "softmax.tuning.staged_cols=(16385, 20000)",
                                 "layer_norm.tuning.phased_bwd_aligned_16bit = (768, 3072)",
                                 "layer_norm.tuning.held_fwd_min_cols={2: 600}"])
    assert done == ["softmax.STAGED_STAGES=2", "softmax.tuning.staged_cols=(16385, 20000)",
                    "layer_norm.tuning.phased_bwd_aligned_16bit=(768, 3072)", "layer_norm.tuning.held_fwd_min_cols=((2, 600),)"]
    assert softmax._staged_plan(32768, 2, h200, tuned).stages == 2  # the plan reads the new value
    planned = _device.tuning("softmax", h200, softmax.DEFAULT_TUNING)
    assert planned.staged_cols == (16385, 20000) and dataclasses.replace(planned, staged_cols=None).shift_16bit == (
        tuned.shift_16bit if _device.tuned_here(h200) else ())  # the other choices as the device's
    ln = _device.tuning("layer_norm", h200, layer_norm.DEFAULT_TUNING)
    assert ln.phased_bwd_aligned_16bit == (768, 3072) and layer_norm._held_default(601, 2, t=ln)
    for bad, words in [("softmax.STAGED_STAGES", "expected MODULE.CONSTANT=VALUE"),
                       ("nosuch._X=1", "no module reference_kernels.nosuch"),
                       ("softmax._NO_SUCH=1", "has no _NO_SUCH"),
                       ("softmax.STAGED_STAGES=2**2", "not a Python literal"),
                       ("softmax.STAGED_STAGES='3'", "STAGED_STAGES holds int, not str"),
                       ("softmax.STAGED_STAGES=None", "STAGED_STAGES holds int, not NoneType"),
                       ("softmax.tuning.no_such=1", "softmax's tuning has no no_such"),
                       ("gemm_epilogue.tuning.x=1", "has no tuned choices")]:
        with pytest.raises(SystemExit, match=re.escape(words)):
            sweep.apply_settings([bad])


def test_plan_launches_lists_the_widths_whose_launches_a_setting_changes_and_only_those(capsys):
    import subprocess

    from benchmarks import plan_launches

    # in-process: the H100 with its tuned file; the rows plan's loads of weight and bias first (fp32 aligned rows from
    # 2048 filling their block) reach fp32 forward launches alone, and each call plans the same twice
    widths = [1000, 2048, 3000, 4096, 4100]
    before = plan_launches.plan_all("H100", widths, ["float32", "bfloat16"])
    assert before == plan_launches.plan_all("H100", widths, ["float32", "bfloat16"])
    assert all(v and v[0][0] != "error" for v in before.values())  # every call launches
    assert {v[0][0] for k, v in before.items() if k[1] == "backward"} >= {"_layer_norm_bwd_flat_kernel"}  # bf16 4096
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "plan_launches.py"
    run = subprocess.run([sys.executable, str(script), "--widths", ",".join(map(str, widths)), "--dtypes",
                          "float32,bfloat16", "--set", "layer_norm.tuning.fwd_params_first=None"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()[1:]
    assert lines == ["float32   forward  aligned    2 widths: 2048, 4096",
                     "float32   forward  packed     2 widths: 2048, 4096"], run.stdout
    assert plan_launches.runs([768, 1008, 1040, 3000]) == "768, 1008-1040, 3000"
    with pytest.raises(SystemExit, match="choose one of"):
        plan_launches.main(["--device", "V100"])


def test_plan_launches_compares_a_saved_planning_with_the_codes_now_for_softmax_too(tmp_path, capsys, monkeypatch):
    # --save before a code change, --against after: the widths whose launches the change moved (here a constant the
    # softmax plan reads: no pieces below it, so 4097 loses its two pieces)
    from benchmarks import plan_launches
    from reference_kernels import softmax

    saved = tmp_path / "before.json"
    args = ["--subject", "softmax", "--widths", "2048,4097", "--dtypes", "bfloat16"]
    plan_launches.main(args + ["--save", str(saved)])
    capsys.readouterr()
    plan_launches.main(args + ["--against", str(saved)])
    assert capsys.readouterr().out.splitlines()[1:] == ["none: no planned launch changed"]
    monkeypatch.setattr(softmax, "PIECES_MIN_COLS", 1 << 20)
    plan_launches.main(args + ["--against", str(saved)])
    assert capsys.readouterr().out.splitlines()[1:] == ["bfloat16  softmax  aligned    1 widths: 4097",
                                                        "bfloat16  softmax  packed     1 widths: 4097"]
    with pytest.raises(SystemExit, match="planned for H100 softmax, not H100 layer_norm"):
        plan_launches.main(["--widths", "2048", "--against", str(saved)])
    with pytest.raises(SystemExit, match="one at a time"):
        plan_launches.main(args + ["--against", str(saved), "--set", "softmax.PIECES_MIN_COLS=1"])


def test_the_gemm_bench_parses_forced_configs_and_refuses_bad_ones():
    from benchmarks.bench_gemm_epilogue import _parse_configs

    assert _parse_configs("") == []
    assert _parse_configs("(64,128,64,8,1,4,4,1,2); (128, 128, 64, 8, 1, 4, 8, 2, 1)") == [
        (64, 128, 64, 8, 1, 4, 4, 1, 2), (128, 128, 64, 8, 1, 4, 8, 2, 1)]
    # the warp-specialised kernel's configs: ws(...) of six or seven ints, a WsConfig (its launch dispatches on it)
    ws = _parse_configs("ws(64, 64, 64, 8, 8, 1); ws(128,128,64,8,6,1,2)")
    assert ws == [(64, 64, 64, 8, 8, 1, 2), (128, 128, 64, 8, 6, 1, 2)]
    assert all(type(c).__name__ == "WsConfig" for c in ws)
    for bad, words in [("(64, 128)", "expected nine ints"), ("64x128", "not a tuple literal"),
                       ("(64, 128, 64, 8, 1, 4, 4, 1, 2.5)", "expected nine ints"), ("ws(64, 64)", "expected ws("),
                       ("ws(64, 64, 64, 8, 8, 1, 2, 1, 1)", "expected ws("), ("ws[64]", "not a tuple literal")]:
        with pytest.raises(SystemExit, match=re.escape(words)):
            _parse_configs(bad)


def test_the_gemm_bench_times_each_forced_config_and_records_one_that_fails(monkeypatch, capsys):
    from benchmarks import bench_gemm_epilogue as bench

    calls = []

    def fake_run(a, b, out, bias, residual, code, config=None):
        calls.append(config)
        if config[0] == 256:
            raise RuntimeError("out of resources: shared memory")

    def fake_time(make, run):  # a 2 ms call for 128-wide tiles, 1 ms for the rest
        run(*make())
        return 2.0 if calls[-1][0] == 128 else 1.0

    monkeypatch.setattr(bench.ge, "_run", fake_run)
    monkeypatch.setattr(bench, "rotated_device_ms", fake_time)
    make = lambda: (bench.torch.zeros(4, 8), bench.torch.zeros(8, 2), bench.torch.zeros(2))  # noqa: E731
    configs = [(128, 128, 64, 8, 1, 4, 8, 1, 1), (64, 64, 64, 8, 1, 6, 4, 2, 1), (256, 256, 64, 8, 1, 4, 8, 1, 1)]
    timed = bench._time_configs(make, configs, 1000, 1000, 1000)
    assert [c[0] for c, *_ in timed] == [128, 64, 256] and timed[0][1] == 1.0 and timed[1][1] == 2.0
    assert timed[2][1] is None and "out of resources" in timed[2][2]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("    (64, 64") and "None TFLOPS (RuntimeError" in printed[-1]


def test_the_gemm_bench_summary_names_the_warp_specialised_kernels_configs_beside_the_others(capsys):
    from benchmarks import bench_gemm_epilogue as bench

    assert bench._config_cell([128, 256, 64, 8, 1, 3, 8, 1, 2]) == "128x256x64 s2"
    assert bench._config_cell(list(bench.ge._gemm_ws.WsConfig(64, 128, 64, 8, 6, 1))) == "64x128x64 ws"
    records = [{"dtype": "bfloat16", "M": m, "K": 768, "N": 3072, "config": config,
                "tflops": {"ours": 500.0, "addmm_act": 520.0, "eager": 240.0}}
               for m, config in ((2048, list(bench.ge._WS_CONFIGS[0])), (512, [128, 128, 64, 8, 1, 4, 8, 1, 1]))]
    bench._summarise(records, ["ours", "addmm_act", "eager"])
    printed = capsys.readouterr().out
    assert "128x128x64 ws" in printed and "128x128x64 s1" in printed and "0 of 2" in printed


def test_the_bandwidth_scripts_time_device_time_and_say_when_they_could_not(monkeypatch):
    # Host-timed events read the layer-norm backward at 46-69% of copy where a CUDA graph read 89-92%
    # (docs/kernels.md, "How the figures were measured"): the scripts time from a graph, and a
    # fallback to host events is recorded per implementation, not silent.
    from benchmarks import _common

    calls = []

    def graph_ms(launch, sets, replays=5):
        calls.append((len(sets), replays))
        if sets and sets[0] is None and len(calls) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.5

    monkeypatch.setattr("reference_kernels._common.graph_device_ms", graph_ms)
    monkeypatch.setattr(_common, "bench_ms", lambda fn, *a, **k: 2.0)
    monkeypatch.setattr(_common.torch.cuda, "synchronize", lambda: None)
    rec = {"gbps": {}}
    _common.time_impls(rec, {"ours": lambda: None, "torch": lambda: None}, ["ours", "torch", "liger"], 10**9,
                       dict(calls=5, reps=3), "test")
    assert calls == [(5, 3), (5, 3)]  # the --quick timing: 5 calls a graph, 3 replays
    assert rec["timer"]["ours"] == "graph" and rec["gbps"]["ours"] == pytest.approx(2000.0)
    assert rec["timer"]["torch"].startswith("events (RuntimeError") and rec["gbps"]["torch"] == pytest.approx(500.0)
    assert rec["gbps"]["liger"] is None  # absent: n/a in the table


def test_the_copy_roofline_is_the_faster_of_the_graph_and_the_events_timer(monkeypatch):
    # a CUDA graph replays a copy as a memcpy node, which read 2750 GB/s at 512 MiB on the H200 where
    # events read ~4150: a graph-only roofline put fp32 kernels at 150% of copy
    from benchmarks import _common

    monkeypatch.setattr(_common.torch, "empty", lambda n, **k: _common.torch.zeros(n, dtype=_common.torch.uint8))
    for graph, events in ((0.5, 0.25), (0.25, 0.5)):  # 2 MB read + written in 0.25 ms: 8 GB/s
        monkeypatch.setattr(_common, "device_ms", lambda fn, g=graph: (g, "graph"))
        monkeypatch.setattr(_common, "bench_ms", lambda fn, *a, e=events: e)
        assert _common.copy_gbps(2 * 10**6, device="cpu") == pytest.approx(8.0)


def test_the_sweep_times_the_layer_norm_outside_its_target_band_unless_told_not_to():
    from benchmarks import sweep

    assert sweep.timed("layer_norm_fwd", 17000) and sweep.timed("layer_norm_bwd", 65536)
    assert not sweep.timed("layer_norm_fwd", 17000, band_only=True) and sweep.timed("layer_norm_fwd", 16384, band_only=True)
    assert not sweep.timed("layer_norm_bwd", 512, band_only=True) and sweep.timed("layer_norm_bwd", 768, band_only=True)
    assert sweep.timed("softmax", 262144, band_only=True)  # a target at every width


def test_the_held_ladder_parses_its_variants_and_refuses_unknown_ones():
    from benchmarks import held_ladder

    assert held_ladder.parse_variants(None) == held_ladder.DEFAULT_VARIANTS
    assert held_ladder.parse_variants("copy_row, shipped") == ("copy_row", "shipped")
    assert set(held_ladder.DEFAULT_VARIANTS) <= set(held_ladder.VARIANTS)
    with pytest.raises(SystemExit, match="unknown variant.*softmax_everywhere"):
        held_ladder.parse_variants("copy_row,softmax_everywhere")


@pytest.mark.parametrize("name", ["triton_copy", "triton_copy_walk"])
def test_the_held_ladders_plain_copies_copy_every_element_of_a_row_count_no_block_divides(name):
    # the full blocks unmasked, the last one masked (a mask against an n of no multiple of 16 would cost the loads
    # their vectors: 30% of copy at 30522 columns before)
    from benchmarks import held_ladder

    x = torch.randn(7, 1001)
    y = torch.full_like(x, float("nan"))
    held_ladder.launcher(name, 2, torch.zeros(2, dtype=torch.int32))((x, y))
    assert torch.equal(y, x)


def test_the_held_ladder_says_why_it_cannot_run_without_an_sm90_gpu(monkeypatch):
    from benchmarks import held_ladder

    if held_ladder._softmax_held.available():
        pytest.skip("this machine runs the held kernels")
    monkeypatch.setattr(sys, "argv", ["held_ladder.py", "--widths", "30522"])
    with pytest.raises(SystemExit, match="compute capability 9.x"):
        held_ladder.main()


def test_the_held_ladder_compiles_for_sm90_and_a_program_a_row_copies_each_row_once():
    # each schedule's kernel compiles with this Triton (Gluon's names move between releases); the walk and the ticket
    # copy the next row behind the output pass (one more copy site), a program a row does not
    import json
    import os
    import subprocess

    from reference_kernels import _held

    if _held.gluon is None:
        pytest.skip("this Triton has no Gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "held_ladder.py"
    run = subprocess.run([sys.executable, str(script), "--compile-only", "--widths", "30522", "--variants",
                          "copy_walk,copy_row,softmax_ticket,softmax_row"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = {r["variant"]: r for r in (json.loads(line) for line in run.stdout.splitlines()
                                     if line.startswith("{"))}
    assert set(out) == {"copy_walk", "copy_row", "softmax_ticket", "softmax_row"}
    assert all(r["segments"] == 15 and r["shared"] <= _held.SMEM_PER_BLOCK for r in out.values()), out
    assert out["copy_row"]["copy_sites"] == out["softmax_row"]["copy_sites"] == 15, out
    assert out["copy_walk"]["copy_sites"] == out["softmax_ticket"]["copy_sites"] == 16, out


def test_the_kernel_set_option_sets_a_reference_kernel_constant_for_the_test_run(pytester):
    # the project's own conftest (--kernel-set) in a run of one test that reads the constant: what a device call uses
    # to run a plan rule's GPU tests under the setting it times
    root = Path(__file__).resolve().parents[1]
    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(root)!r}); "
                          f"exec(open({str(root / 'tests' / 'conftest.py')!r}).read())")
    pytester.makepyfile("""
        from reference_kernels import softmax

        def test_set():
            assert softmax.STAGED_STAGES == 7
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernel-set", "softmax.STAGED_STAGES=7")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["reference_kernels set: softmax.STAGED_STAGES=7"])
    refused = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernel-set", "softmax._NO_SUCH=1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--set 'softmax._NO_SUCH=1': reference_kernels.softmax has no _NO_SUCH*"])


def test_the_host_bench_times_each_call_on_the_hosts_clock_in_bursts_after_its_warm_up():
    from benchmarks.bench_host import host_us

    calls, synced = [], []
    # 2 ms a call on the host: the figure is that, not the warm-up's calls or the synchronisations
    us = host_us(lambda: calls.append(1) or __import__("time").sleep(0.002), calls=5, warmup=3,
                 sync=lambda: synced.append(len(calls)))
    assert 2000 <= us < 20000
    assert len(calls) == 8 and synced == [3, 8]  # warm-up, a sync, the timed calls (one burst), a sync
    # bursts: a synchronisation before each, outside the timer (a 50 ms one here), and after the last
    calls.clear(), synced.clear()
    slow_sync = lambda: synced.append(len(calls)) or __import__("time").sleep(0.05)  # noqa: E731
    us = host_us(lambda: calls.append(1) or __import__("time").sleep(0.002), calls=7, warmup=1, sync=slow_sync,
                 burst=3)
    assert synced == [1, 4, 7, 8] and len(calls) == 8
    assert 2000 <= us < 10000  # the syncs' 200 ms are not in it: they would add ~28600 us a call
    for bad in (dict(calls=0), dict(burst=0)):
        with pytest.raises(ValueError, match="calls and burst must be >= 1"):
            host_us(lambda: None, sync=lambda: None, **bad)


def test_the_host_bench_times_the_call_that_records_a_key_its_second():
    from benchmarks.bench_host import recorded_us
    from reference_kernels import _launch, softmax

    x, seen = torch.randn(3, 40), []

    def call():
        softmax.fused(x)
        seen.append(softmax.CALLS.last)

    assert recorded_us(call, calls=3, sync=lambda: None) > 0
    assert seen == ["planned: first call", "recorded"] * 3  # the records dropped before each first call
    _launch.forget()


_ROOT = Path(__file__).resolve().parents[1]


def _run_script(monkeypatch, name, *argv):
    """Run benchmarks/NAME.py as ``python NAME.py ARGV`` in this process; returns its SystemExit code."""
    import runpy

    script = _ROOT / "benchmarks" / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    return exited.value.code


@pytest.mark.parametrize("name, argv", [("sweep", ["--widths", "1024"]), ("bench_softmax", ["--quick"]),
                                        ("bench_layer_norm", ["--quick"]), ("bench_bias_gelu_dropout", ["--quick"]),
                                        ("bench_gemm_epilogue", ["--quick"]), ("ncu_kernels", ["ln_fwd_fp32_333"]),
                                        ("bench_attention", ["--quick"]), ("bench_host", []), ("bench_eager", ["--quick"]),
                                        ("bench_peak", []), ("model_counts", []), ("bench_tuning", [])])
def test_a_gpu_benchmark_on_a_machine_without_a_gpu_says_so_and_nothing_else(monkeypatch, name, argv):
    # without the check torch failed in its first CUDA call with a message about its own build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = _run_script(monkeypatch, name, *argv)
    assert code == f"{name}.py times kernels on a CUDA GPU: torch {torch.__version__} sees none here"


def test_a_gpu_benchmark_refuses_bad_options_before_it_asks_for_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "has no _NO_SUCH" in str(_run_script(monkeypatch, "sweep", "--set", "softmax._NO_SUCH=1"))
    assert "unknown case" in str(_run_script(monkeypatch, "ncu_kernels", "no_such_case"))


def test_every_option_the_gpu_check_script_passes_a_benchmark_is_one_it_takes(monkeypatch, capsys):
    # scripts/gpu_check.sh's gemm stage passed --quick, which bench_gemm_epilogue.py did not take: the stage failed
    text = (_ROOT / "scripts" / "gpu_check.sh").read_text()
    calls = re.findall(r"benchmarks/(\w+)\.py ([^\n;]*)", text)
    assert len(calls) >= 9
    for name, rest in calls:
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest))
        assert _run_script(monkeypatch, name, "--help") in (0, None)
        usage = capsys.readouterr().out
        missing = [flag for flag in flags if not re.search(re.escape(flag) + r"\b", usage)]
        assert not missing, f"benchmarks/{name}.py does not take {missing}"


def _eager_record(subject, unit, eager, graph=None, host=None):
    """A bench_eager record with these eager milliseconds per implementation (None: the implementation failed)."""
    impls = {k: None if ms is None else {"eager_ms": ms, "graph_ms": (graph or {}).get(k, ms), "graph_timer": "graph",
                                         "host_us": (host or {}).get(k, 10.0)} for k, ms in eager.items()}
    rec = {"subject": subject, "shape": [4, 1024], "dtype": "bfloat16", "work": 4e9 if unit == "B" else 2e12,
           "unit": unit, "impls": impls}
    if unit == "B":
        rec["copy_gbps"] = 4000.0
    return rec


def test_the_eager_bench_compares_ours_with_the_best_other_eager_figure_and_shows_graph_and_host_beside():
    import benchmarks.bench_eager as be

    rec = _eager_record("softmax", "B", {"ours": 2.0, "torch": 1.0, "compile": 4.0, "liger": None},
                        graph={"ours": 1.0}, host={"ours": 12.0, "torch": 6.0})
    text = be.table([rec], "softmax")
    row = text.splitlines()[-1]
    # 4e9 bytes in 2 ms = 2000 GB/s = 50% of a 4000 GB/s copy; torch's 1 ms is the best other: ours at 0.50x of it
    assert row.split("|")[3:11] == [" 50% ", " 100% ", " 25% ", " n/a ", " 0.50x torch ", " 100% ", " 12 ", " 6 "]
    gemm = _eager_record("gemm", "FLOP", {"ours": 1.0, "torch": 2.0, "compile": None})
    assert "| 2000 | 1000 | n/a | n/a | 2.00x torch |" in be.table([gemm], "gemm")  # TFLOPS; liger has no GEMM


def test_the_eager_bench_prints_its_tables_from_a_recorded_file_and_refuses_unknown_subjects(tmp_path, capsys):
    import json

    import benchmarks.bench_eager as be

    path = tmp_path / "bench_eager.json"
    path.write_text(json.dumps({"header": "H200, torch 2.11", "records": [
        _eager_record("softmax", "B", {"ours": 1.0, "torch": 1.0})]}))
    assert be.main(["--tables", str(path), "--subjects", "softmax"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("H200, torch 2.11") and "### softmax" in out and "1.00x torch" in out
    assert be.main(["--tables", str(path)]) == 0  # every subject: those the file lacks are named, not printed empty
    out = capsys.readouterr().out
    assert "not in this file (run on a GPU): layer_norm_fwd, gemm," in out and "### gemm" not in out
    with pytest.raises(SystemExit):
        be.main(["--subjects", "nope"])
    assert "unknown subject(s) nope" in capsys.readouterr().err


SMALL = {"softmax": (4, 40), "layer_norm_fwd": (4, 40), "layer_norm_bwd": (4, 40), "gemm": (16, 32, 32),
         "attention": (1, 1, 16, 64), "attention_full": (1, 1, 16, 64), "bias_gelu_dropout": (4, 40)}


@pytest.mark.parametrize("subject", sorted(SMALL))
def test_each_eager_bench_subject_times_ours_and_torch_on_the_same_problem(subject, monkeypatch):
    # the calls the GPU run times, made on CPU at a small shape: ours and torch's compute the same thing (but the
    # dropout's mask, drawn apart), and the work counted is positive (torch.compile not built: inductor is slow on CPU)
    import benchmarks.bench_eager as be

    monkeypatch.setattr(be, "_compiled", lambda fn: fn)
    fns, work, unit = be.cases(subject, SMALL[subject], torch.float32, dev="cpu")
    known = {*be.IMPLS, *be.EXTRA_IMPLS.get(subject, ()), be.OURS_COMPILED}
    assert {"ours", "torch", be.OURS_COMPILED} <= set(fns) <= known
    assert work > 0 and unit in ("B", "FLOP")
    ours, theirs = fns["ours"](), fns["torch"]()
    first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731 - the forward's (y, mean, rstd)
    assert first(ours).shape == first(theirs).shape
    assert first(fns[be.OURS_COMPILED]()).shape == first(ours).shape  # the same call, as a compiled model makes it
    if subject != "bias_gelu_dropout":
        torch.testing.assert_close(first(ours), first(theirs), atol=1e-3, rtol=1e-3)


def test_the_eager_table_of_attention_has_a_cudnn_column_and_compares_ours_with_it():
    import benchmarks.bench_eager as be

    figures = {"ours": 1.0, "torch": 1.25, "cudnn": 0.8}
    rec = {"subject": "attention", "shape": [1, 16, 8192, 128], "dtype": "bfloat16", "work": 2e12, "unit": "FLOP",
           "impls": {k: {"eager_ms": ms, "graph_ms": ms, "graph_timer": "graph", "host_us": 15.0}
                     for k, ms in figures.items()}}
    text = be.table([rec], "attention")
    assert "| cudnn eager |" in text and "| ours / best other |" in text
    assert "| 1x16x8192x128 | bfloat16 | 2000 | 1600 | n/a | n/a | 2500 | 0.80x cudnn |" in text
    del rec["impls"]["cudnn"]  # a file recorded before the column: the table it had
    assert "cudnn" not in be.table([rec], "attention")


def test_the_eager_table_shows_ours_inside_a_compiled_function_beside_and_never_as_the_best_other():
    import benchmarks.bench_eager as be

    host = {"ours": 9.0, be.OURS_COMPILED: 44.0, "torch": 6.0, "compile": 33.0}
    rec = _eager_record("softmax", "B", {"ours": 2.0, "torch": 1.0, "compile": 1.5, be.OURS_COMPILED: 0.5}, host=host)
    text = be.table([rec], "softmax")
    assert f"| {be.OURS_COMPILED} eager |" in text and "0.50x torch" in text  # 0.5 ms is ours too: not the best other
    # host a call: ours, ours compiled, torch, torch.compile's own
    assert f"| ours host us | {be.OURS_COMPILED} host us | torch host us | compile host us |" in text
    assert text.rstrip().endswith("| 9 | 44 | 6 | 33 |")
    plain = be.table([_eager_record("softmax", "B", {"ours": 2.0, "torch": 1.0})], "softmax")
    assert be.OURS_COMPILED not in plain and plain.splitlines()[2].endswith("| ours host us | torch host us |")


def test_every_eager_bench_subject_has_shapes_and_cases_for_each():
    import benchmarks.bench_eager as be

    assert set(be.SUBJECTS) == set(SMALL)
    for subject, shapes in be.SHAPES.items():
        assert shapes and all(len(s) == 3 and hasattr(torch, s[1]) for s in shapes), subject


def test_the_host_bench_prints_its_table_from_a_recorded_file(capsys):
    import benchmarks.bench_host as bh

    bh.main(["--tables", str(_ROOT / "benchmarks" / "data" / "bench_host_h200.json")])
    out = capsys.readouterr().out
    assert out.startswith("NVIDIA H200") and "| softmax 8x4096 bfloat16 |" in out
    assert all(row.endswith("| replayed |") for row in out.splitlines() if row.startswith("| softmax"))


def test_the_tuning_bench_prints_default_over_tuned_from_a_recorded_file_and_checks_its_widths(tmp_path, capsys):
    import json

    import benchmarks.bench_tuning as bt

    rec = {"n_cols": 4096, "n_rows": 8192, "dtype": "bfloat16", "tuned": dict.fromkeys(bt.SUBJECTS, 80.0),
           "default": {**dict.fromkeys(bt.SUBJECTS, 80.0), "layer norm backward": 40.0}}
    path = tmp_path / "bench_tuning.json"
    path.write_text(json.dumps({"header": "GPU X", "rows": [rec]}))
    assert bt.main(["--tables", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPU X") and "| 4096 | bfloat16 | 8192 | 80% | 1.00x | 80% | 0.50x | 80% | 1.00x |" in out
    with pytest.raises(SystemExit):
        bt.main(["--widths", "0"])
    assert "must be >= 1" in capsys.readouterr().err


def test_the_committed_eager_figures_name_known_subjects_and_implementations_and_ours_ran_at_each_shape():
    import json

    import benchmarks.bench_eager as be

    records = json.loads((_ROOT / "benchmarks" / "data" / "bench_eager_h200.json").read_text())["records"]
    recorded = {r["subject"] for r in records}
    assert recorded <= set(be.SUBJECTS) and {"softmax", "layer_norm_fwd", "layer_norm_bwd", "gemm"} <= recorded
    for rec in records:
        assert rec["impls"].get("ours"), rec  # ours ran at every shape
        assert set(rec["impls"]) <= {*be.IMPLS, *be.EXTRA_IMPLS.get(rec["subject"], ()), be.OURS_COMPILED}


def test_every_table_benchmarks_md_prints_from_committed_json_is_what_its_script_prints_now(capsys):
    # BENCHMARKS.md names the command that prints each such table: the table pasted there is that command's output
    import importlib
    import re

    text = (_ROOT / "BENCHMARKS.md").read_text()
    commands = re.findall(r"python3 benchmarks/(\w+)\.py --tables (benchmarks/data/\S+\.json)((?: --subjects \S+)?)", text)
    assert commands
    for script, data, subjects in commands:
        importlib.import_module(f"benchmarks.{script}").main(["--tables", str(_ROOT / data), *subjects.split()])
        printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
        assert printed, script
        missing = [line for line in printed if line not in text]
        assert not missing, f"{script} --tables {data}: BENCHMARKS.md lacks {missing[:3]}"


def test_bench_attention_times_every_tile_through_pointers_and_through_tma_and_takes_cudnn():
    from benchmarks import bench_attention
    from reference_kernels import attention

    default = attention._Plan(64, 64, 4, 3)
    labels, plans = zip(*bench_attention.plan_variants(default))
    assert labels[0] == "default" and plans[0] == default and len(set(plans)) == len(plans)
    pointers = {p._replace(tma=False) for p in plans if not p.tma}
    assert {p._replace(tma=False) for p in plans if p.tma} == pointers  # every tile both ways
    assert all(label.endswith(" tma") == plan.tma for label, plan in zip(labels[1:], plans[1:]))
    args = bench_attention.parse_args(["--impls", "ours,cudnn"])
    assert args.impls == "ours,cudnn" and bench_attention.parse_args([]).impls == "ours,flash,unfused"
    rec = {"dtype": "bfloat16", "shape": "1x16x4096x128", "causal": False, "tflops": {"ours": 500.0, "cudnn": 625.0},
           "fused_bytes": 2**20, "unfused_bytes": 2**22}
    headers, row = bench_attention.table_headers(["ours", "cudnn"]), bench_attention.table_row(rec, ["ours", "cudnn"])
    assert dict(zip(headers, row))["ours / cudnn"] == "0.80x" and len(headers) == len(row)


def test_bench_host_python_times_each_public_calls_own_python_and_puts_the_replays_back(tmp_path, capsys):
    import json

    import benchmarks.bench_host as bh
    from reference_kernels import softmax

    bh.main(["--python", "--calls", "30", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "bench_host_python.json").read_text())["rows"]
    assert [r["case"] for r in rows] == [name for name, _, _ in bh.python_cases("cpu")]
    assert all(r["ours_call"] == "replayed" and r["python_us"] > 0 and r["torch_us"] > 0 for r in rows), rows
    assert "| softmax.fused |" in capsys.readouterr().out
    x = torch.randn(4, 64)  # a recorded key (python_cases' shape): its replay runs again, on these values
    torch.testing.assert_close(softmax.fused(x, out=torch.empty_like(x)), torch.softmax(x, -1))


def test_bench_host_runs_under_a_set_constant_and_names_it_in_its_header(tmp_path, capsys, monkeypatch):
    import json

    import benchmarks.bench_host as bh
    from reference_kernels import layer_norm

    monkeypatch.setattr(layer_norm, "_SUM_HERE_BYTES", layer_norm._SUM_HERE_BYTES)  # put back after the run's setting
    bh.main(["--python", "--calls", "3", "--set", "layer_norm._SUM_HERE_BYTES=0", "--out", str(tmp_path)])
    assert layer_norm._SUM_HERE_BYTES == 0
    head = json.loads((tmp_path / "bench_host_python.json").read_text())["header"]
    assert head.endswith("; set layer_norm._SUM_HERE_BYTES=0") and head in capsys.readouterr().out
    with pytest.raises(SystemExit, match="has no NOPE"):
        bh.main(["--python", "--set", "layer_norm.NOPE=1"])


def test_bench_host_cases_time_the_autograd_layer_norm_on_its_own_tensors(monkeypatch):
    """Each case's callables hold their own tensors: the training-step layer norm's gradients are those of its (x, w,
    b), ours against torch's (the cases are built for CUDA: here on CPU, the interpreter's)."""
    import benchmarks.bench_host as bh

    if not torch.cuda.is_available():
        randn = torch.randn
        monkeypatch.setattr(torch, "randn", lambda *shape, device=None, **kw: randn(*shape, **kw))
    (name, ours, theirs), = [case for case in bh.cases(rows=2) if "autograd" in case[0]]
    assert name == "layer norm forward + backward, autograd 2x4096 bfloat16"
    got, want = ours(), theirs()
    assert [g.shape for g in got] == [(2, 4096), (4096,), (4096,)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=0.1, rtol=0.05)


def test_bench_attention_ws_variants_refuses_where_the_kernel_does_not_run(monkeypatch):
    from benchmarks import bench_attention
    from reference_kernels import _attention_ws

    args = bench_attention.parse_args(["--ws-variants", "--width", "768", "--tokens", "8192"])
    assert args.ws_variants and (args.width, args.tokens) == (768, 8192)
    assert (bench_attention.parse_args([]).width, bench_attention.parse_args([]).tokens) == (2048, 16384)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_attention_ws, "available", lambda index=None: False)
    with pytest.raises(SystemExit, match="does not run here"):
        bench_attention.ws_variants(args, torch.bfloat16, (False,), "")


@pytest.mark.gpu
def test_bench_attention_ws_variants_times_each_fitting_plan_and_cudnn_and_marks_the_pick(tmp_path, capsys):
    import json

    from benchmarks import bench_attention
    from reference_kernels import _attention_ws

    if not _attention_ws.available(torch.cuda.current_device()):
        pytest.skip("the warp-specialised kernel runs on sm_90 with Gluon")
    out = tmp_path / "ws.json"
    bench_attention.main(["--ws-variants", "--seqs", "256", "--head-dims", "64", "--width", "128", "--tokens", "512",
                          "--causal", "no", "--json", str(out)])
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["shape"] == "2x2x256x64" and set(rec["tflops"]) >= {"c2", "cudnn"}
    assert all(err < 2e-2 for err in rec["max_abs_err"].values()), rec
    assert "*" in capsys.readouterr().out  # the plan's pick, one of those timed


def test_bench_ops_times_a_stand_in_op_called_and_compiled_for_each_definition(capsys, tmp_path):
    import json

    import benchmarks.bench_ops as bo

    assert bo.main(["--calls", "20", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| definition | called, us | in a compiled function, us |" in out
    rows = json.loads((tmp_path / "bench_ops.json").read_text())["rows"]
    assert [r["definition"] for r in rows] == ["a Python function", "define_op (torch.library.Library)",
                                               "torch.library.custom_op"]
    assert all(r["called"] > 0 and r["compiled"] > 0 for r in rows)
    # the stand-in ops are ops: a compiled function calls each through one graph, no break
    from torch._dynamo.utils import counters

    counters.clear()
    for name, fn in bo._stand_ins(bo.device()).items():  # main's device: the ops are defined once a process
        if name != "a Python function":
            torch._dynamo.reset()
            torch.compile(lambda t, fn=fn: fn(t))(torch.zeros(8, 64, device=bo.device()))
    assert not counters["graph_break"]
    other = "meta" if bo.device() == "cpu" else "cpu"
    with pytest.raises(ValueError, match="once a process"):
        bo._stand_ins(other)
    with pytest.raises(SystemExit):
        bo.main(["--calls", "0"])
