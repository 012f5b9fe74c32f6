"""Committed baselines: each test's kernel count, modelled bytes, kernel names and graph
breaks, with the torch / Triton / CUDA versions they were recorded with.

Kernel and byte counts are deterministic, so a baseline needs no tolerance: a test that
launches more kernels or moves more bytes than the committed file says has regressed,
one that launches fewer has improved. The file is JSON keyed by test id and device kind
(``"cuda:NVIDIA H200"``, ``"cpu"``), written with sorted keys and a fixed indent so that
a change reviews as a small diff.

Writes follow syrupy's snapshot model: records are queued during the run (on every
xdist worker), merged by the controller, and written once at session end, atomically
(temp file in the same directory, fsync, ``os.replace``). Entries of tests not run are
kept and reported as stale. A file that cannot be read is never overwritten.

Pure logic on plain JSON-able dicts: no torch, no pytest.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .budget import format_bytes
from .report import device_kind  # noqa: F401  (the baseline key: a report's device, named)

__all__ = [
    "DEFAULT_PATH",
    "FORMAT",
    "VERSION",
    "Baseline",
    "BaselineError",
    "BaselineWriter",
    "Comparison",
    "WriteResult",
    "compare",
    "device_kind",
    "load_baseline",
    "make_record",
    "merge_records",
    "normalize_kernel_name",
    "write_baseline_file",
]

FORMAT = "pytest-fusioncheck-baseline"
VERSION = 1
DEFAULT_PATH = ".fusioncheck-baseline.json"

# Inductor numbers its kernels per graph (triton_poi_fused_add_0, cpp_fused_gelu_1): the
# suffix moves when an unrelated kernel is added, so it is not part of a kernel's identity.
_INDUCTOR_SUFFIX = re.compile(r"^((?:triton|cpp|halide|mps)_\w+?)_\d+$")


class BaselineError(Exception):
    """A baseline file that cannot be used: unreadable, not JSON, or not a baseline.

    ``path`` is the file and ``problem`` what is wrong with it. The file is left as it
    is; in update mode nothing is written over it.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(
            f"fusioncheck baseline {self.path}: {problem}. The file was left untouched; "
            "fix it (or move it away to start a new baseline) and run again."
        )


def normalize_kernel_name(name: str) -> str:
    """``triton_poi_fused_add_gelu_0`` -> ``triton_poi_fused_add_gelu``; other names as they are."""
    match = _INDUCTOR_SUFFIX.match(name)
    return match.group(1) if match else name


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_stored(record: Any, where: str) -> str | None:
    """What is wrong with a stored record (``None`` when it is fine)."""
    if not isinstance(record, dict):
        return f"{where} should be an object, found {type(record).__name__}"
    if not _is_count(record.get("kernel_count")):
        return f"{where}: 'kernel_count' should be a non-negative integer, found {record.get('kernel_count')!r}"
    if record.get("bytes") is not None and not _is_count(record["bytes"]):
        return f"{where}: 'bytes' should be a non-negative integer or null, found {record['bytes']!r}"
    kernels = record.get("kernels", [])
    if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
        return f"{where}: 'kernels' should be a list of kernel names"
    modules = record.get("modules", {})
    if not isinstance(modules, dict) or not all(isinstance(m, str) and _is_count(n) for m, n in modules.items()):
        return f"{where}: 'modules' should map module paths to kernel counts"
    for key in ("graph_breaks", "recompiles"):
        if record.get(key) is not None and not _is_count(record[key]):
            return f"{where}: {key!r} should be a non-negative integer or absent, found {record[key]!r}"
    versions = record.get("versions", {})
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()):
        return f"{where}: 'versions' should map package names to version strings"
    return None


def _check_record(record: Any) -> dict[str, Any]:
    if not isinstance(record, Mapping):
        raise ValueError(f"a baseline record is a dict, got {type(record).__name__}: {record!r}")
    for key in ("test_id", "device_kind"):
        if not isinstance(record.get(key), str) or not record.get(key):
            raise ValueError(f"a baseline record needs a non-empty string {key!r}, got {record!r}")
    problem = _check_stored(dict(record), f"record for {record['test_id']} on {record['device_kind']}")
    if problem:
        raise ValueError(problem)
    return copy.deepcopy(dict(record))


def make_record(
    test_id: str,
    device_kind: str,
    kernels: Iterable[str],
    bytes: int | None = None,
    kernel_count: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A record: a plain JSON-able dict, safe to ship from an xdist worker.

    ``kernels`` are the launched kernel names in launch order (repeats included);
    ``kernel_count`` defaults to their number. ``extra`` JSON-able fields are stored too.
    """
    kernels = [str(k) for k in kernels]
    record = {
        "test_id": test_id,
        "device_kind": device_kind,
        "kernel_count": len(kernels) if kernel_count is None else kernel_count,
        "bytes": bytes,
        "kernels": kernels,
        **extra,
    }
    return _check_record(record)


def _stored(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("test_id", "device_kind")}


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def merge_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One record per (test id, device kind); where several share a key the last wins.

    Records are validated (``ValueError`` naming the bad record). The result is sorted
    by key, so it depends only on the input order of conflicting records; callers
    merging xdist workers pass them in worker-id order (``BaselineWriter`` does).
    """
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        checked = _check_record(record)
        merged[(checked["test_id"], checked["device_kind"])] = checked
    return [merged[key] for key in sorted(merged)]


# --- reading ------------------------------------------------------------------------


@dataclass
class Baseline:
    """A loaded baseline file: ``entries[test_id][device_kind]`` -> stored record."""

    path: Path | None = None
    entries: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    exists: bool = False
    document: dict[str, Any] = field(default_factory=dict)

    def get(self, test_id: str, device_kind: str) -> dict[str, Any] | None:
        """The record of ``test_id`` on ``device_kind`` (with both keys in it), or ``None``."""
        stored = self.entries.get(test_id, {}).get(device_kind)
        if stored is None:
            return None
        return {"test_id": test_id, "device_kind": device_kind, **copy.deepcopy(stored)}

    def test_ids(self) -> list[str]:
        return sorted(self.entries)

    def __len__(self) -> int:
        return sum(len(by_device) for by_device in self.entries.values())


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Read a baseline file; a missing file is an empty baseline.

    Raises ``BaselineError`` naming the file and the problem when it cannot be read,
    is not JSON (merge-conflict markers get their own hint), or is not a
    pytest-fusioncheck baseline of a version this code understands.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Baseline(path=path)
    except OSError as exc:
        raise BaselineError(path, f"cannot be read ({exc.strerror or exc})") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    if re.search(r"^(<<<<<<<|>>>>>>>) ", text, re.MULTILINE):
        raise BaselineError(path, "contains git merge-conflict markers; resolve the conflict "
                                  "(or regenerate the file with --fusion-update-baseline)")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        where = "is empty" if not text.strip() else f"is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        raise BaselineError(path, where) from exc

    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else None
        what = f"its 'format' is {found!r}" if found is not None else (
            "it has no 'format' key" if isinstance(document, dict) else f"it holds a JSON {type(document).__name__}"
        )
        raise BaselineError(path, f"is not a pytest-fusioncheck baseline ({what}; expected \"format\": \"{FORMAT}\")")
    version = document.get("version")
    if not _is_count(version):
        raise BaselineError(path, f"has an invalid 'version' {version!r} (expected an integer)")
    if version > VERSION:
        raise BaselineError(path, f"is baseline version {version}, written by a newer pytest-fusioncheck "
                                  f"(this one reads up to version {VERSION}); upgrade the plugin")
    entries = document.get("entries", {})
    if not isinstance(entries, dict):
        raise BaselineError(path, f"'entries' should be an object keyed by test id, found {type(entries).__name__}")
    for test_id, by_device in entries.items():
        if not isinstance(by_device, dict):
            raise BaselineError(path, f"entry {test_id!r} should be an object keyed by device kind, "
                                      f"found {type(by_device).__name__}")
        for kind, stored in by_device.items():
            problem = _check_stored(stored, f"entry {test_id!r} on {kind!r}")
            if problem:
                raise BaselineError(path, problem)
    return Baseline(path=path, entries=entries, exists=True, document=document)


# --- comparing ----------------------------------------------------------------------


def _signed(n: int) -> str:
    return f"+{n}" if n > 0 else str(n)


def _signed_bytes(n: int) -> str:
    return f"+{format_bytes(n)}" if n > 0 else f"-{format_bytes(-n)}"


def _counted(names: Iterable[str]) -> list[str]:
    counts = Counter(names)
    return [f"{name} (x{n})" if n > 1 else name for name, n in sorted(counts.items())]


@dataclass(frozen=True)
class Comparison:
    """A test's record against its baseline entry. Kernel names are normalised
    (``normalize_kernel_name``) and diffed as multisets."""

    test_id: str
    device_kind: str
    kernel_count_before: int | None
    kernel_count_after: int
    bytes_before: int | None
    bytes_after: int | None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    # (module pattern, kernels before, kernels after) where a model's module launched more kernels;
    # repeated layers folded (``layers.*.mlp``); from the records' per-module counts
    modules_grown: tuple[tuple[str, int, int], ...] = ()
    # Dynamo graph breaks during the test (None: the entry predates the count, not compared)
    breaks_before: int | None = None
    breaks_after: int | None = None
    # package -> version where the entry's differs from the run's ({"torch": ("2.11.0", "2.13.0")})
    versions_changed: tuple[tuple[str, str, str], ...] = ()

    @property
    def new(self) -> bool:
        """No baseline entry for this test on this device kind."""
        return self.kernel_count_before is None

    @property
    def kernel_delta(self) -> int:
        return 0 if self.new else self.kernel_count_after - self.kernel_count_before

    @property
    def bytes_delta(self) -> int | None:
        if self.bytes_before is None or self.bytes_after is None:
            return None
        return self.bytes_after - self.bytes_before

    @property
    def breaks_delta(self) -> int:
        if self.breaks_before is None or self.breaks_after is None:
            return 0
        return self.breaks_after - self.breaks_before

    @property
    def regressed(self) -> bool:
        """More kernels, bytes or graph breaks than the baseline: the test fails (a new
        break that adds no kernel still splits a compiled graph)."""
        return self.kernel_delta > 0 or (self.bytes_delta or 0) > 0 or self.breaks_delta > 0

    @property
    def improved(self) -> bool:
        """Fewer kernels or bytes, and neither figure grew: reported, not failed."""
        return not self.regressed and (self.kernel_delta < 0 or (self.bytes_delta or 0) < 0 or self.breaks_delta < 0)

    @property
    def changed(self) -> bool:
        """Anything differs, including the same count of different kernels."""
        return self.new or self.regressed or self.improved or bool(self.added or self.removed)

    def describe(self) -> str:
        where = f"{self.test_id} on {self.device_kind}"
        if self.new:
            return (f"fusion baseline: no entry for {where} "
                    "(run with --fusion-update-baseline to record it)")
        if self.regressed:
            head = f"fusion baseline regression for {where} (run with --fusion-update-baseline to accept it)"
        elif self.improved:
            head = (f"fusion baseline improvement for {where} "
                    "(run with --fusion-update-baseline to record it)")
        elif self.changed:
            head = f"fusion baseline: different kernels, same count and bytes, for {where}"
        else:
            head = f"fusion baseline: {where} matches"
        lines = [head]
        if self.versions_changed:
            lines.append("  recorded with " + ", ".join(f"{pkg} {before}, running {after}" for pkg, before, after in self.versions_changed)
                         + ": the change may be the upgrade's")
        if self.breaks_delta:
            lines.append(f"  graph breaks: {self.breaks_before} -> {self.breaks_after} ({_signed(self.breaks_delta)})")
        kernels = f"  kernels: {self.kernel_count_before} -> {self.kernel_count_after}"
        if self.kernel_delta:
            kernels += f" ({_signed(self.kernel_delta)})"
        lines.append(kernels)
        if self.bytes_delta is not None:
            line = (f"  bytes:   {format_bytes(self.bytes_before)} -> {format_bytes(self.bytes_after)}"
                    f" ({self.bytes_before} -> {self.bytes_after}")
            if self.bytes_delta:
                line += f", {_signed_bytes(self.bytes_delta)}"
                if self.bytes_before:
                    line += f", {100.0 * self.bytes_delta / self.bytes_before:+.1f}%"
            lines.append(line + ")")
        elif self.bytes_after != self.bytes_before:
            lines.append(f"  bytes:   {format_bytes(self.bytes_before)} -> {format_bytes(self.bytes_after)} (not compared)")
        if self.modules_grown:
            lines.append("  modules with more kernels:")
            lines += [f"    {pattern}: {before} -> {after}" for pattern, before, after in self.modules_grown]
        for sign, label, names in (("+", "added", self.added), ("-", "removed", self.removed)):
            if names:
                lines.append(f"  kernels {label}:")
                lines += [f"    {sign} {name}" for name in _counted(names)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def compare(expected_record: Mapping[str, Any] | None, actual_record: Mapping[str, Any]) -> Comparison:
    """Compare a test's record with its baseline entry (``None``: no entry yet)."""
    actual = _check_record(actual_record)
    after = Counter(normalize_kernel_name(k) for k in actual.get("kernels", []))
    if expected_record is None:
        return Comparison(
            test_id=actual["test_id"],
            device_kind=actual["device_kind"],
            kernel_count_before=None,
            kernel_count_after=actual["kernel_count"],
            bytes_before=None,
            bytes_after=actual.get("bytes"),
        )
    problem = _check_stored(dict(expected_record), "baseline entry")
    if problem:
        raise ValueError(problem)
    before = Counter(normalize_kernel_name(k) for k in expected_record.get("kernels", []))
    return Comparison(
        test_id=actual["test_id"],
        device_kind=actual["device_kind"],
        kernel_count_before=expected_record["kernel_count"],
        kernel_count_after=actual["kernel_count"],
        bytes_before=expected_record.get("bytes"),
        bytes_after=actual.get("bytes"),
        added=tuple(sorted((after - before).elements())),
        removed=tuple(sorted((before - after).elements())),
        modules_grown=modules_grown(expected_record.get("modules") or {}, actual.get("modules") or {}),
        breaks_before=expected_record.get("graph_breaks"),
        breaks_after=actual.get("graph_breaks"),
        versions_changed=versions_changed(expected_record.get("versions") or {}, actual.get("versions") or {}),
    )


def versions_changed(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[tuple[str, str, str], ...]:
    """(package, recorded, running) for each package both records name at different versions."""
    return tuple((pkg, before[pkg], after[pkg]) for pkg in sorted(before) if pkg in after and before[pkg] != after[pkg])


def module_pattern(path: str) -> str:
    """A module path with its repeated-structure indices as ``*`` (``layers.3.mlp``: ``layers.*.mlp``)."""
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


def module_counts(modules: Iterable[str | None]) -> dict[str, int]:
    """Kernels per module path (kernels without a module are not counted), for a record's ``modules``."""
    return dict(Counter(m for m in modules if m))


def modules_grown(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[tuple[str, int, int], ...]:
    """(pattern, before, after) for each module pattern whose kernels grew, most grown first."""
    folded: dict[str, list[int]] = {}
    for side, counts in ((0, before), (1, after)):
        for path, n in counts.items():
            folded.setdefault(module_pattern(path), [0, 0])[side] += n
    grown = [(p, b, a) for p, (b, a) in folded.items() if a > b]
    return tuple(sorted(grown, key=lambda t: (t[1] - t[2], t[0])))


# --- writing ------------------------------------------------------------------------


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_baseline_file(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    """Write ``document`` to ``path`` atomically: the old file or the new one, never half.

    The JSON goes to a temp file in the same directory, is flushed and fsynced, then
    ``os.replace``s the target (a symlink's target, if ``path`` is one). On any error
    the temp file is removed and the old file is untouched.
    """
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = _new_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            json.dump(document, fh, sort_keys=True, indent=2, ensure_ascii=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@dataclass(frozen=True)
class WriteResult:
    """What ``BaselineWriter.flush`` did; ``describe()`` is a terminal-summary line."""

    path: Path
    written: bool
    added: tuple[tuple[str, str], ...] = ()
    updated: tuple[tuple[str, str], ...] = ()
    unchanged: tuple[tuple[str, str], ...] = ()
    stale: tuple[str, ...] = ()
    pruned: bool = False
    not_run: int = 0  # entries of tests this session did not select (-k, other files): kept, not stale

    def describe(self) -> str:
        action = "wrote" if self.written else "left unchanged"
        line = (f"fusioncheck baseline {action} {self.path}: {len(self.added)} added, "
                f"{len(self.updated)} updated, {len(self.unchanged)} unchanged")
        if self.stale:
            what = "removed" if self.pruned else "kept"
            line += f"; {len(self.stale)} stale (no longer collected from their files, {what}):"
            line += "".join(f"\n  {test_id}" for test_id in self.stale)
        if self.not_run:
            line += f"; {self.not_run} entr{'y' if self.not_run == 1 else 'ies'} of tests not selected this session kept"
        return line


class BaselineWriter:
    """Queues records during a session and writes the baseline file once, at the end.

    On an xdist worker, ship ``worker_payload()`` (plain JSON-able) to the controller,
    which calls ``add_worker_payload(worker_id, payload)`` for each worker and then
    ``flush()``. Workers are merged in natural worker-id order (gw0, gw1, ..., gw10),
    each worker's records in the order they were added, and the last record of a key
    wins: the result does not depend on the order workers finish in.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._records: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._collected: set[str] = set()
        self._workers: dict[str, dict[str, Any]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        """Queue a record (see ``make_record``); ``ValueError`` if it is malformed."""
        checked = _check_record(record)
        self._records.append(checked)
        self._seen.add(checked["test_id"])

    def mark_seen(self, test_id: str) -> None:
        """A test ran this session without a record: its entries are not stale."""
        self._seen.add(test_id)

    def mark_collected(self, test_ids: Iterable[str]) -> None:
        """Tests this session collected (selected or deselected): an entry is stale only
        when its file was collected and its test was not (deleted or renamed)."""
        self._collected.update(test_ids)

    def worker_payload(self) -> dict[str, Any]:
        return {"records": copy.deepcopy(self._records), "seen": sorted(self._seen), "collected": sorted(self._collected)}

    def add_worker_payload(self, worker_id: str, payload: Mapping[str, Any]) -> None:
        records = [_check_record(r) for r in payload.get("records", [])]
        self._workers[worker_id] = {
            "records": records, "seen": list(payload.get("seen", [])), "collected": list(payload.get("collected", [])),
        }

    def collected(self) -> set[str]:
        collected = set(self._collected)
        for payload in self._workers.values():
            collected.update(payload.get("collected", []))
        return collected

    def records(self) -> list[dict[str, Any]]:
        """Every queued record, merged (one per key), this process's first, then workers'."""
        ordered = list(self._records)
        for worker_id in sorted(self._workers, key=_natural_key):
            ordered += self._workers[worker_id]["records"]
        return merge_records(ordered)

    def seen(self) -> set[str]:
        seen = set(self._seen)
        for payload in self._workers.values():
            seen.update(payload["seen"])
            seen.update(r["test_id"] for r in payload["records"])
        return seen

    def flush(self, prune_stale: bool = False) -> WriteResult:
        """Merge the queued records into the file and write it once, atomically.

        Entries of tests not seen this session are kept (listed as ``stale``) unless
        ``prune_stale``. The file is not rewritten when nothing changes. Raises
        ``BaselineError``, writing nothing, when the existing file cannot be read.
        """
        baseline = load_baseline(self.path)
        entries = copy.deepcopy(baseline.entries)
        added, updated, unchanged = [], [], []
        for record in self.records():
            key = (record["test_id"], record["device_kind"])
            stored = _stored(record)
            old = entries.get(key[0], {}).get(key[1])
            (added if old is None else unchanged if old == stored else updated).append(key)
            entries.setdefault(key[0], {})[key[1]] = stored
        seen = self.seen()
        collected = self.collected()
        files = {_test_file(t) for t in collected | seen}
        unseen = [t for t in entries if t not in seen]
        # stale: its file was collected, the test was not; else it was not selected this session
        stale = tuple(sorted(t for t in unseen if not collected or (_test_file(t) in files and t not in collected)))
        if prune_stale:
            for test_id in stale:
                del entries[test_id]
        document = {**baseline.document, "format": FORMAT, "version": VERSION, "entries": entries}
        write = document != baseline.document if baseline.exists else bool(entries)
        if write:
            write_baseline_file(self.path, document)
        return WriteResult(
            path=self.path,
            written=write,
            added=tuple(added),
            updated=tuple(updated),
            unchanged=tuple(unchanged),
            stale=stale,
            pruned=prune_stale and bool(stale),
            not_run=len(unseen) - len(stale),
        )


def _test_file(test_id: str) -> str:
    return test_id.split("::", 1)[0]
