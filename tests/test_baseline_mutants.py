"""Baselines: behaviour that mutation testing (docs/mutation.md) found no test pinning.

Each test states what a user of --fusion-baseline would see go wrong: the exact
messages they read, the fields they get back, the file left on disk.
"""

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
    load_baseline,
    make_record,
    write_baseline_file,
)

FUSED = ["triton_poi_fused_add_gelu_0"]
SPLIT = ["triton_poi_fused_add_0", "triton_poi_fused_gelu_1"]
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
    record = make_record("t::a", "cpu", FUSED)
    writer = BaselineWriter(tmp_path / "baseline.json")
    writer.add(record)
    record["kernels"].append("late_kernel")
    assert writer.records()[0]["kernels"] == FUSED


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
    comparison = compare(None, make_record("t::a", "cpu", SPLIT, bytes=256))
    assert comparison.kernel_count_after == 2 and comparison.bytes_after == 256
    assert comparison.describe() == (
        "fusion baseline: no entry for t::a on cpu (run with --fusion-update-baseline to record it)"
    )


def test_an_improvement_is_headed_with_the_command_that_records_it():
    comparison = compare(make_record("t::a", "cpu", SPLIT), make_record("t::a", "cpu", FUSED))
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
    before = make_record("t::a", "cpu", FUSED, bytes=None)
    after = make_record("t::a", "cpu", FUSED, bytes=256)
    assert compare(before, after).describe().splitlines()[1:] == [
        "  kernels: 1 -> 1",
        "  bytes:   - -> 256 B (not compared)",
    ]
    assert compare(after, before).describe().splitlines()[2] == "  bytes:   256 B -> - (not compared)"
    assert compare(before, before).describe().splitlines()[1:] == ["  kernels: 1 -> 1"]


def test_a_one_byte_growth_is_shown_with_a_plus_sign():
    comparison = compare(make_record("t::a", "cpu", FUSED, bytes=100), make_record("t::a", "cpu", FUSED, bytes=101))
    assert "  bytes:   100 B -> 101 B (100 -> 101, +1 B, +1.0%)" in comparison.describe()


def test_a_record_without_kernel_names_compares_by_count():
    plain = {"test_id": "t::a", "device_kind": "cpu", "kernel_count": 2, "bytes": 8}
    assert compare(None, plain).kernel_count_after == 2
    assert not compare(plain, plain).changed


def test_a_malformed_baseline_entry_is_refused_when_compared():
    with pytest.raises(ValueError) as info:
        compare({"kernel_count": -1}, make_record("t::a", "cpu", FUSED))
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
    writer.add(make_record("t::a", "cpu", FUSED))
    writer.flush()
    writer = BaselineWriter(path)
    writer.add(make_record("t::a", "cpu", SPLIT))
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
    writer.add(make_record("t::a", "cpu", FUSED))
    payload = writer.worker_payload()
    payload["records"][0]["kernels"].append("edited in transit")
    assert writer.records()[0]["kernels"] == FUSED


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
