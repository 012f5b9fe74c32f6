"""Baselines: the file format, compare, atomic merged writes, corrupt and foreign files."""

import json
import os
import stat

import pytest

from pytest_fusioncheck import baseline as baseline_module
from pytest_fusioncheck.baseline import (
    FORMAT,
    BaselineError,
    BaselineWriter,
    WriteResult,
    compare,
    device_kind,
    load_baseline,
    make_record,
    merge_records,
    normalize_kernel_name,
    write_baseline_file,
)


H200 = "cuda:NVIDIA H200"
FUSED = ["triton_poi_fused_add_gelu_0"]
SPLIT = ["triton_poi_fused_add_0", "triton_poi_fused_gelu_1"]


def _write(path, records, **flush):
    writer = BaselineWriter(path)
    for record in records:
        writer.add(record)
    return writer.flush(**flush)


def _file(tmp_path, entries):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "entries": entries}))
    return path


def test_a_written_baseline_compares_equal_with_the_same_run(tmp_path):
    path = tmp_path / ".fusioncheck-baseline.json"
    record = make_record("tests/test_x.py::test_y", H200, FUSED, bytes=1024)
    result = _write(path, [record])

    assert result.written and result.added == (("tests/test_x.py::test_y", H200),)
    comparison = compare(load_baseline(path).get("tests/test_x.py::test_y", H200), record)
    assert not comparison.regressed and not comparison.improved and not comparison.changed
    assert "matches" in comparison.describe()
    document = json.loads(path.read_text())
    assert document == {
        "format": FORMAT,
        "version": 1,
        "entries": {"tests/test_x.py::test_y": {H200: {"kernel_count": 1, "bytes": 1024, "kernels": FUSED}}},
    }
    assert path.read_text() == json.dumps(document, sort_keys=True, indent=2) + "\n"


def test_more_kernels_regress_and_the_message_lists_the_added_kernels():
    before = make_record("t::a", "cpu", FUSED, bytes=256)
    after = make_record("t::a", "cpu", SPLIT, bytes=256)
    comparison = compare(before, after)

    assert comparison.regressed and not comparison.improved
    assert comparison.added == ("triton_poi_fused_add", "triton_poi_fused_gelu")
    assert comparison.removed == ("triton_poi_fused_add_gelu",)
    message = comparison.describe()
    assert message.splitlines()[0] == "fusion baseline regression for t::a on cpu (run with --fusion-update-baseline to accept it)"
    assert "  kernels: 1 -> 2 (+1)" in message
    assert "    + triton_poi_fused_add\n    + triton_poi_fused_gelu" in message
    assert "    - triton_poi_fused_add_gelu" in message


def test_a_repeated_kernel_counts_as_added_each_time_it_appears():
    comparison = compare(make_record("t::a", "cpu", ["k"]), make_record("t::a", "cpu", ["k", "k", "k"]))
    assert comparison.added == ("k", "k") and comparison.regressed
    assert "+ k (x2)" in comparison.describe()


def test_renumbered_inductor_kernels_are_not_a_change():
    before = make_record("t::a", "cpu", ["triton_poi_fused_add_0", "cpp_fused_gelu_1"], bytes=8)
    after = make_record("t::a", "cpu", ["triton_poi_fused_add_3", "cpp_fused_gelu_0"], bytes=8)
    assert not compare(before, after).changed


def test_fewer_kernels_is_reported_as_an_improvement_not_a_regression():
    comparison = compare(make_record("t::a", H200, SPLIT, bytes=512), make_record("t::a", H200, FUSED, bytes=256))
    assert comparison.improved and not comparison.regressed
    message = comparison.describe()
    assert message.startswith(f"fusion baseline improvement for t::a on {H200}")
    assert "--fusion-update-baseline" in message
    assert "  kernels: 2 -> 1 (-1)" in message
    assert "bytes:   512 B -> 256 B (512 -> 256, -256 B, -50.0%)" in message


def test_more_bytes_with_the_same_kernels_is_a_regression():
    comparison = compare(make_record("t::a", "cpu", FUSED, bytes=2**27), make_record("t::a", "cpu", FUSED, bytes=2**28))
    assert comparison.regressed and comparison.kernel_delta == 0
    assert "bytes:   128.0 MiB -> 256.0 MiB (134217728 -> 268435456, +128.0 MiB, +100.0%)" in comparison.describe()


def test_fewer_kernels_but_more_bytes_is_still_a_regression():
    comparison = compare(make_record("t::a", "cpu", SPLIT, bytes=100), make_record("t::a", "cpu", FUSED, bytes=101))
    assert comparison.regressed and not comparison.improved


def test_a_test_without_an_entry_is_new_and_not_a_regression(tmp_path):
    baseline = load_baseline(tmp_path / "missing.json")
    assert len(baseline) == 0 and not baseline.exists
    comparison = compare(baseline.get("t::a", "cpu"), make_record("t::a", "cpu", FUSED))
    assert comparison.new and not comparison.regressed and not comparison.improved
    assert "no entry for t::a on cpu" in comparison.describe()


def test_a_corrupt_file_gives_an_error_naming_the_file_and_is_left_untouched(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text('{"format": "pytest-fusioncheck-baseline", "entries": {')
    before = path.read_bytes()

    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert str(path) in str(info.value) and "is not valid JSON (line 1 column" in str(info.value)
    with pytest.raises(BaselineError):
        _write(path, [make_record("t::a", "cpu", FUSED)])
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["baseline.json"]


def test_a_file_with_merge_conflict_markers_says_so(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text('{\n<<<<<<< HEAD\n  "a": 1\n=======\n  "a": 2\n>>>>>>> branch\n}\n')
    with pytest.raises(BaselineError, match="merge-conflict markers"):
        load_baseline(path)


@pytest.mark.parametrize(
    "content, problem",
    [
        ({"format": "syrupy", "entries": {}}, "its 'format' is 'syrupy'"),
        ({"entries": {}}, "it has no 'format' key"),
        ([1, 2], "it holds a JSON list"),
    ],
)
def test_foreign_json_is_refused_and_left_untouched(tmp_path, content, problem):
    path = tmp_path / "other.json"
    path.write_text(json.dumps(content))
    before = path.read_bytes()
    with pytest.raises(BaselineError) as info:
        _write(path, [make_record("t::a", "cpu", FUSED)])
    assert str(info.value).startswith(f"fusioncheck baseline {path}: is not a pytest-fusioncheck baseline")
    assert problem in str(info.value)
    assert path.read_bytes() == before


def test_a_baseline_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 2, "entries": {}}))
    with pytest.raises(BaselineError, match="version 2, written by a newer pytest-fusioncheck"):
        load_baseline(path)


def test_a_bad_entry_in_the_file_is_named_by_test_id_and_device(tmp_path):
    path = _file(tmp_path, {"t::a": {"cpu": {"kernel_count": "three", "kernels": []}}})
    with pytest.raises(BaselineError, match=r"entry 't::a' on 'cpu': 'kernel_count' should be a non-negative integer"):
        load_baseline(path)


def test_a_crash_mid_write_leaves_the_old_file_intact_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "baseline.json"
    _write(path, [make_record("t::a", "cpu", FUSED, bytes=1)])
    before = path.read_bytes()

    def dump_then_crash(obj, fh, **kwargs):
        fh.write('{"format": "pytest-fusioncheck-baseline", "entr')
        raise KeyboardInterrupt

    monkeypatch.setattr(baseline_module.json, "dump", dump_then_crash)
    with pytest.raises(KeyboardInterrupt):
        _write(path, [make_record("t::a", "cpu", SPLIT, bytes=2)])
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["baseline.json"]


def test_an_update_keeps_the_file_mode_and_other_device_kinds(tmp_path):
    path = _file(tmp_path, {"t::a": {H200: {"kernel_count": 1, "bytes": 8, "kernels": FUSED}}})
    path.chmod(0o640)
    result = _write(path, [make_record("t::a", "cpu", SPLIT, bytes=16)])
    assert result.added == (("t::a", "cpu"),) and result.stale == ()
    baseline = load_baseline(path)
    assert baseline.get("t::a", H200)["kernels"] == FUSED
    assert baseline.get("t::a", "cpu")["kernel_count"] == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_an_unchanged_baseline_is_not_rewritten_and_an_empty_session_creates_no_file(tmp_path):
    path = tmp_path / "baseline.json"
    record = make_record("t::a", "cpu", FUSED)
    _write(path, [record])
    os.utime(path, ns=(0, 0))
    result = _write(path, [record])
    assert not result.written and result.unchanged == (("t::a", "cpu"),)
    assert path.stat().st_mtime_ns == 0

    assert not _write(tmp_path / "never.json", []).written
    assert not (tmp_path / "never.json").exists()


def _worker(records, seen=()):
    writer = BaselineWriter("unused")
    for record in records:
        writer.add(record)
    for test_id in seen:
        writer.mark_seen(test_id)
    return json.loads(json.dumps(writer.worker_payload()))  # what crosses the xdist wire


def test_two_workers_records_merge_into_one_file_whatever_order_they_finish_in(tmp_path):
    gw0 = _worker([make_record("t::a", "cpu", FUSED), make_record("t::b", "cpu", ["old_b"])])
    gw1 = _worker([make_record("t::c", "cpu", SPLIT), make_record("t::b", "cpu", ["new_b"])])
    contents = []
    for order in (("gw0", "gw1"), ("gw1", "gw0")):
        path = tmp_path / f"{'_'.join(order)}.json"
        controller = BaselineWriter(path)
        for worker_id in order:
            controller.add_worker_payload(worker_id, {"gw0": gw0, "gw1": gw1}[worker_id])
        result = controller.flush()
        assert result.added == (("t::a", "cpu"), ("t::b", "cpu"), ("t::c", "cpu"))
        contents.append(path.read_text())
    assert contents[0] == contents[1]
    assert load_baseline(tmp_path / "gw0_gw1.json").get("t::b", "cpu")["kernels"] == ["new_b"]


def test_workers_are_merged_in_natural_id_order():
    controller = BaselineWriter("unused")
    controller.add_worker_payload("gw10", _worker([make_record("t::a", "cpu", ["from_gw10"])]))
    controller.add_worker_payload("gw2", _worker([make_record("t::a", "cpu", ["from_gw2"])]))
    assert controller.records()[0]["kernels"] == ["from_gw10"]


def test_merge_records_keeps_the_last_record_of_a_key_and_sorts_the_rest():
    merged = merge_records([
        make_record("t::b", "cpu", ["first"]),
        make_record("t::a", "cpu", ["a"]),
        make_record("t::b", "cpu", ["second"]),
        make_record("t::b", H200, ["gpu"]),
    ])
    assert [(r["test_id"], r["device_kind"], r["kernels"]) for r in merged] == [
        ("t::a", "cpu", ["a"]),
        ("t::b", "cpu", ["second"]),
        ("t::b", H200, ["gpu"]),
    ]


def test_stale_entries_are_reported_and_kept_unless_pruning_is_asked_for(tmp_path):
    path = _file(tmp_path, {
        "t::gone": {"cpu": {"kernel_count": 1, "bytes": 1, "kernels": ["k"]}},
        "t::skipped": {"cpu": {"kernel_count": 1, "bytes": 1, "kernels": ["k"]}},
    })
    writer = BaselineWriter(path)
    writer.add(make_record("t::new", "cpu", FUSED))
    writer.mark_seen("t::skipped")
    result = writer.flush()
    assert result.stale == ("t::gone",)
    assert "1 stale (no longer collected from their files, kept):\n  t::gone" in result.describe()
    assert load_baseline(path).test_ids() == ["t::gone", "t::new", "t::skipped"]

    result = _write(path, [make_record("t::new", "cpu", FUSED)], prune_stale=True)
    assert result.stale == ("t::gone", "t::skipped") and result.pruned
    assert load_baseline(path).test_ids() == ["t::new"]


def test_a_malformed_record_is_rejected_naming_the_test():
    with pytest.raises(ValueError, match=r"record for t::a on cpu: 'bytes' should be a non-negative integer"):
        make_record("t::a", "cpu", FUSED, bytes=-1)
    with pytest.raises(ValueError, match="needs a non-empty string 'device_kind'"):
        BaselineWriter("unused").add({"test_id": "t::a", "kernel_count": 1})


def test_device_kinds_name_the_gpu_model_but_not_the_cpu():
    assert device_kind("cuda", "NVIDIA H200") == H200
    assert device_kind("cuda:1", "NVIDIA H200") == H200
    assert device_kind("cpu", "AMD EPYC") == "cpu"


@pytest.mark.parametrize(
    "name, normalized",
    [
        ("triton_poi_fused_add_gelu_0", "triton_poi_fused_add_gelu"),
        ("triton_red_fused__softmax_12", "triton_red_fused__softmax"),
        ("cpp_fused_add_gelu_3", "cpp_fused_add_gelu"),
        ("_softmax_fwd_kernel", "_softmax_fwd_kernel"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_1", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_1"),
        ("void at::native::vectorized_elementwise_kernel<4>(int)", "void at::native::vectorized_elementwise_kernel<4>(int)"),
    ],
)
def test_only_inductor_kernel_names_lose_their_numeric_suffix(name, normalized):
    assert normalize_kernel_name(name) == normalized


def test_graph_breaks_compare_only_where_the_entry_recorded_them():
    before = make_record("t::a", "cpu", FUSED, bytes=256, graph_breaks=0)
    after = make_record("t::a", "cpu", FUSED, bytes=256, graph_breaks=1)
    assert compare(before, after).regressed and compare(after, before).improved
    old_entry = make_record("t::a", "cpu", FUSED, bytes=256)  # written before the count existed
    assert not compare(old_entry, after).changed


def test_versions_that_differ_are_named_and_others_are_not():
    before = make_record("t::a", "cpu", FUSED, bytes=256, versions={"torch": "2.11.0", "triton": "3.6.0"})
    after = make_record("t::a", "cpu", SPLIT, bytes=512, versions={"torch": "2.13.0", "triton": "3.6.0"})
    comparison = compare(before, after)
    assert comparison.versions_changed == (("torch", "2.11.0", "2.13.0"),)
    assert "recorded with torch 2.11.0, running 2.13.0" in comparison.describe()


def test_a_record_with_a_bad_graph_break_count_or_versions_is_refused():
    with pytest.raises(ValueError, match="graph_breaks"):
        make_record("t::a", "cpu", FUSED, graph_breaks=-1)
    with pytest.raises(ValueError, match="versions"):
        make_record("t::a", "cpu", FUSED, versions={"torch": 2})


# --- behaviour that mutation testing found no test pinning (docs/mutation.md) ------------


FUSED_ENTRY = ["triton_poi_fused_add_gelu_0"]
SPLIT_ENTRY = ["triton_poi_fused_add_0", "triton_poi_fused_gelu_1"]
GOOD_ENTRY = {"kernel_count": 1, "bytes": 8, "kernels": ["k"]}


def _doc(**overrides):
    return json.dumps({"format": FORMAT, "version": 1, "entries": {}, **overrides})


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\xff\xfe{}", "is not UTF-8 text (invalid start byte at byte 0)"),
        (b"<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> main\n",
         "contains git merge-conflict markers; resolve the conflict (or regenerate the file with --fusion-update-baseline)"),
        (b"  \n", "is empty"),
        (b'{"entries": {}}',
         'is not a pytest-fusioncheck baseline (it has no \'format\' key; expected "format": "pytest-fusioncheck-baseline")'),
        (_doc(version="1").encode(), "has an invalid 'version' '1' (expected an integer)"),
        (_doc(version=2).encode(),
         "is baseline version 2, written by a newer pytest-fusioncheck (this one reads up to version 1); upgrade the plugin"),
        (_doc(entries=[]).encode(), "'entries' should be an object keyed by test id, found list"),
        (_doc(entries={"t::a": []}).encode(), "entry 't::a' should be an object keyed by device kind, found list"),
        (_doc(entries={"t::a": {"cpu": "three kernels"}}).encode(), "entry 't::a' on 'cpu' should be an object, found str"),
        (_doc(entries={"t::a": {"cpu": {"kernel_count": "three"}}}).encode(),
         "entry 't::a' on 'cpu': 'kernel_count' should be a non-negative integer, found 'three'"),
    ],
    ids=["not utf-8", "conflict markers", "empty", "no format", "string version", "newer version",
         "entries a list", "entry a list", "record a string", "count a string"],
)
def test_an_unusable_baseline_file_is_named_with_its_exact_problem_and_the_way_out(tmp_path, content, problem):
    path = tmp_path / "baseline.json"
    path.write_bytes(content)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert info.value.path == str(path)
    assert info.value.problem == problem
    assert str(info.value) == (
        f"fusioncheck baseline {path}: {problem}. The file was left untouched; "
        "fix it (or move it away to start a new baseline) and run again."
    )


def test_a_baseline_path_that_is_a_directory_cannot_be_read_and_says_why(tmp_path):
    with pytest.raises(BaselineError) as info:
        load_baseline(tmp_path)
    assert info.value.path == str(tmp_path)
    assert info.value.problem == "cannot be read (Is a directory)"


def test_a_loaded_or_missing_baseline_remembers_its_path(tmp_path):
    missing = tmp_path / "missing.json"
    assert load_baseline(missing).path == missing
    present = tmp_path / "present.json"
    present.write_text(_doc())
    assert load_baseline(present).path == present


def test_a_baseline_file_without_entries_is_an_empty_baseline(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 1}))
    baseline = load_baseline(path)
    assert baseline.exists and len(baseline) == 0


def test_a_stored_entry_without_kernel_names_loads_and_compares_by_count(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(_doc(entries={"t::a": {"cpu": {"kernel_count": 2, "bytes": 8}}}))
    entry = load_baseline(path).get("t::a", "cpu")
    comparison = compare(entry, {"test_id": "t::a", "device_kind": "cpu", "kernel_count": 3, "bytes": 8})
    assert comparison.regressed and comparison.kernel_delta == 1
    assert comparison.added == () and comparison.removed == ()


@pytest.mark.parametrize("kernels", ["triton_poi_fused_add_0", [1, 2]], ids=["a string", "numbers"])
def test_stored_kernel_names_must_be_a_list_of_strings(tmp_path, kernels):
    path = tmp_path / "baseline.json"
    path.write_text(_doc(entries={"t::a": {"cpu": {"kernel_count": 1, "kernels": kernels}}}))
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert info.value.problem == "entry 't::a' on 'cpu': 'kernels' should be a list of kernel names"


def test_a_test_that_launches_no_kernel_and_moves_no_byte_can_be_recorded():
    record = make_record("t::cached", "cpu", [], bytes=0)
    assert record["kernel_count"] == 0 and record["bytes"] == 0
    assert not compare(record, record).changed


def test_an_explicit_kernel_count_wins_over_the_number_of_names():
    assert make_record("t::a", "cpu", ["k"], kernel_count=3)["kernel_count"] == 3


@pytest.mark.parametrize(
    "record, message",
    [
        ([1], "a baseline record is a dict, got list: [1]"),
        ({"test_id": "", "device_kind": "cpu", "kernel_count": 1},
         "a baseline record needs a non-empty string 'test_id', got {'test_id': '', 'device_kind': 'cpu', 'kernel_count': 1}"),
        ({"test_id": 7, "device_kind": "cpu", "kernel_count": 1},
         "a baseline record needs a non-empty string 'test_id', got {'test_id': 7, 'device_kind': 'cpu', 'kernel_count': 1}"),
    ],
    ids=["not a dict", "empty test id", "numeric test id"],
)
def test_a_malformed_record_is_refused_with_what_was_given(record, message):
    with pytest.raises(ValueError) as info:
        BaselineWriter("unused").add(record)
    assert str(info.value) == message


def test_a_queued_record_does_not_change_when_the_caller_edits_its_kernel_list(tmp_path):
    record = make_record("t::a", "cpu", FUSED_ENTRY)
    writer = BaselineWriter(tmp_path / "baseline.json")
    writer.add(record)
    record["kernels"].append("late_kernel")
    assert writer.records()[0]["kernels"] == FUSED_ENTRY


def test_a_baseline_record_is_a_copy_that_callers_may_edit(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(_doc(entries={"t::a": {"cpu": dict(GOOD_ENTRY)}}))
    baseline = load_baseline(path)
    got = baseline.get("t::a", "cpu")
    assert got["test_id"] == "t::a" and got["device_kind"] == "cpu"
    got["kernels"].append("edited")
    assert baseline.get("t::a", "cpu")["kernels"] == ["k"]


# --- comparing and describing ---------------------------------------------------------


def test_a_new_test_is_described_with_the_command_that_records_it():
    comparison = compare(None, make_record("t::a", "cpu", SPLIT_ENTRY, bytes=256))
    assert comparison.kernel_count_after == 2 and comparison.bytes_after == 256
    assert comparison.describe() == (
        "fusion baseline: no entry for t::a on cpu (run with --fusion-update-baseline to record it)"
    )


def test_an_improvement_is_headed_with_the_command_that_records_it():
    comparison = compare(make_record("t::a", "cpu", SPLIT_ENTRY), make_record("t::a", "cpu", FUSED_ENTRY))
    assert comparison.describe().splitlines()[0] == (
        "fusion baseline improvement for t::a on cpu (run with --fusion-update-baseline to record it)"
    )


def test_other_kernels_with_the_same_count_and_bytes_are_described_line_by_line():
    before = make_record("t::a", "cpu", ["triton_poi_fused_add_0"], bytes=64)
    after = make_record("t::a", "cpu", ["triton_poi_fused_mul_0"], bytes=64)
    assert compare(before, after).describe() == "\n".join([
        "fusion baseline: different kernels, same count and bytes, for t::a on cpu",
        "  kernels: 1 -> 1",
        "  bytes:   64 B -> 64 B (64 -> 64)",
        "  kernels added:",
        "    + triton_poi_fused_mul",
        "  kernels removed:",
        "    - triton_poi_fused_add",
    ])


def test_bytes_that_were_not_modelled_on_one_side_are_shown_as_not_compared():
    before = make_record("t::a", "cpu", FUSED_ENTRY, bytes=None)
    after = make_record("t::a", "cpu", FUSED_ENTRY, bytes=256)
    assert compare(before, after).describe().splitlines()[1:] == [
        "  kernels: 1 -> 1",
        "  bytes:   - -> 256 B (not compared)",
    ]
    assert compare(after, before).describe().splitlines()[2] == "  bytes:   256 B -> - (not compared)"
    assert compare(before, before).describe().splitlines()[1:] == ["  kernels: 1 -> 1"]


def test_a_one_byte_growth_is_shown_with_a_plus_sign():
    comparison = compare(make_record("t::a", "cpu", FUSED_ENTRY, bytes=100), make_record("t::a", "cpu", FUSED_ENTRY, bytes=101))
    assert "  bytes:   100 B -> 101 B (100 -> 101, +1 B, +1.0%)" in comparison.describe()


def test_a_record_without_kernel_names_compares_by_count():
    plain = {"test_id": "t::a", "device_kind": "cpu", "kernel_count": 2, "bytes": 8}
    assert compare(None, plain).kernel_count_after == 2
    assert not compare(plain, plain).changed


def test_a_malformed_baseline_entry_is_refused_when_compared():
    with pytest.raises(ValueError) as info:
        compare({"kernel_count": -1}, make_record("t::a", "cpu", FUSED_ENTRY))
    assert str(info.value) == "baseline entry: 'kernel_count' should be a non-negative integer, found -1"


# --- writing ----------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_a_new_baseline_file_gets_the_mode_the_umask_allows(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_baseline_file(tmp_path / "baseline.json", {"format": FORMAT})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "baseline.json").stat().st_mode) == mode


def test_the_baselines_missing_directories_are_created(tmp_path):
    path = tmp_path / "perf" / "baselines" / "cpu.json"
    write_baseline_file(path, {"format": FORMAT})
    assert json.loads(path.read_text()) == {"format": FORMAT}


def test_the_temp_file_is_hidden_beside_the_baseline_and_named_after_it(tmp_path, monkeypatch):
    seen = []
    replace = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        assert os.path.dirname(src) == os.path.dirname(dst)  # a rename within one filesystem
        replace(src, dst)

    monkeypatch.setattr(baseline_module.os, "replace", spy)
    write_baseline_file(tmp_path / "baseline.json", {"format": FORMAT})
    (name,) = seen
    assert name.startswith(".baseline.json.") and name.endswith(".tmp")


def test_non_ascii_test_ids_are_written_as_readable_utf8(tmp_path):
    path = tmp_path / "baseline.json"
    write_baseline_file(path, {"entries": {"tests/test_é.py::test_ü": {}}})
    assert "tests/test_é.py::test_ü".encode() in path.read_bytes()


def test_a_temp_file_that_cannot_be_removed_does_not_hide_the_write_error(tmp_path, monkeypatch):
    def no_replace(src, dst):
        raise PermissionError("read-only target")

    def no_unlink(path):
        raise OSError("cannot unlink")

    monkeypatch.setattr(baseline_module.os, "replace", no_replace)
    monkeypatch.setattr(baseline_module.os, "unlink", no_unlink)
    with pytest.raises(PermissionError, match="read-only target"):
        write_baseline_file(tmp_path / "baseline.json", {"format": FORMAT})


def test_a_filesystem_that_cannot_fsync_a_directory_still_gets_the_baseline(tmp_path, monkeypatch):
    fsync = os.fsync

    def fsync_files_only(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError("fsync on a directory is not supported here")
        fsync(fd)

    monkeypatch.setattr(baseline_module.os, "fsync", fsync_files_only)
    write_baseline_file(tmp_path / "baseline.json", {"format": FORMAT})
    assert json.loads((tmp_path / "baseline.json").read_text()) == {"format": FORMAT}


def test_a_changed_record_is_reported_as_updated_and_the_result_names_the_file(tmp_path):
    path = tmp_path / "baseline.json"
    writer = BaselineWriter(path)
    writer.add(make_record("t::a", "cpu", FUSED_ENTRY))
    writer.flush()
    writer = BaselineWriter(path)
    writer.add(make_record("t::a", "cpu", SPLIT_ENTRY))
    result = writer.flush()
    assert result.path == path
    assert result.updated == (("t::a", "cpu"),) and result.unchanged == () and result.added == ()
    assert result.describe() == f"fusioncheck baseline wrote {path}: 0 added, 1 updated, 0 unchanged"


def test_the_summary_line_says_when_the_file_was_left_unchanged_and_lists_each_stale_test(tmp_path):
    result = WriteResult(path=tmp_path / "b.json", written=False, unchanged=(("t::a", "cpu"),),
                         stale=("t::gone", "t::old"))
    assert result.describe() == (
        f"fusioncheck baseline left unchanged {tmp_path / 'b.json'}: 0 added, 0 updated, 1 unchanged; "
        "2 stale (no longer collected from their files, kept):\n  t::gone\n  t::old"
    )
    pruned = WriteResult(path=tmp_path / "b.json", written=True, stale=("t::gone",), pruned=True)
    assert pruned.describe().endswith("; 1 stale (no longer collected from their files, removed):\n  t::gone")


def test_a_worker_payload_is_a_snapshot_of_the_workers_records():
    writer = BaselineWriter("unused")
    writer.add(make_record("t::a", "cpu", FUSED_ENTRY))
    payload = writer.worker_payload()
    payload["records"][0]["kernels"].append("edited in transit")
    assert writer.records()[0]["kernels"] == FUSED_ENTRY


def test_a_test_seen_only_on_a_worker_is_not_stale(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(_doc(entries={"t::skipped": {"cpu": dict(GOOD_ENTRY)}}))
    worker = BaselineWriter("unused")
    worker.mark_seen("t::skipped")
    controller = BaselineWriter(path)
    controller.add_worker_payload("gw0", json.loads(json.dumps(worker.worker_payload())))
    controller.add_worker_payload("gw1", {"seen": []})  # payloads without records ...
    controller.add_worker_payload("gw2", {"records": []})  # ... or without seen tests
    assert controller.flush().stale == ()
