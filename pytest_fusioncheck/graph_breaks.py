"""TorchDynamo graph breaks and recompilations, each pinned to the user line that caused it.

A graph break splits one compiled graph into several, so a chain that Inductor would have
fused into one kernel becomes two or more kernels with a round trip through memory between
them. This module records the breaks (and recompilations) that happen while code runs, and
names the innermost *user* frame of each: the ``print(y)`` in the model's ``forward``, not a
frame inside ``torch/_dynamo``.

Where the records come from (the same in torch 2.11 to 2.13, and far older):

* ``torch._dynamo.utils.graph_break_reasons``: Dynamo appends a ``GraphCompileReason``
  (reason text + user stack) every time it cuts a graph at a break. This is the list
  ``torch._dynamo.explain`` was built on. The recorder reads it; it never writes to it.
* The ``graph_breaks`` logging artifact, for breaks that leave no ``GraphCompileReason``:
  a break inside a loop makes Dynamo skip the whole frame, which then runs eagerly.
  While a recorder is active its handler sits on those loggers (turned on to DEBUG with
  propagation off, unless the user already enabled them), and everything is put back when
  the last recorder exits.
* ``torch._dynamo.utils.guard_failures``: the guard failures behind each recompilation.

torch is imported inside functions only: the plugin imports this module lazily, and
``pytest --help`` must not pay for torch.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import types
from typing import Any, Callable, Iterable

from . import _compat
from .where import relpath, split_source, user_frame

__all__ = [
    "GraphBreak",
    "GraphBreakRecorder",
    "Recompile",
    "assert_no_graph_breaks",
    "find_graph_breaks",
    "format_graph_breaks",
]

_MAX_REASON = 240
_GUARD_WHERE = re.compile(r"\s+#\s+\S+:\d+ in \S+\s*$")  # "  # ...roj/m.py:14 in torch_dynamo_resume_in_f_at_13"
_BROKEN_VALUE = "___stack"  # a guard on a value that crossed a graph break (Dynamo's name for it)
_RESUME_FN = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+?)_at_\d+$")
_COMPILE_ID = re.compile(r"^\[?\d+/\d+\]?:\s*")
_FRAME_ID = re.compile(r"^\[?(\d+)/\d+")
_LOG_LOCATION = re.compile(
    r"in user code at (?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*)", re.S
)
_DATA_DEPENDENT_BRANCH = (
    "Data-dependent branching: Python control flow on a tensor value "
    "(e.g. `if t.sum() > 0:`) cannot be traced"
)
_GRAPH_BREAK_LOGGERS = (
    "torch._dynamo.symbolic_convert.__graph_breaks",
    "torch._dynamo.convert_frame.__graph_breaks",
)


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """One graph break: Dynamo's reason, and the innermost user frame that triggered it.

    ``frame_skipped`` is set when Dynamo could not resume after the break (a break inside
    a loop) and ran the whole function eagerly instead: no graph at all for that frame.
    ``detail`` is Dynamo's full message, hints included.
    """

    reason: str
    filename: str
    lineno: int
    code: str = ""
    function: str = ""
    frame_skipped: bool = False
    detail: str = dataclasses.field(default="", repr=False, compare=False)
    # Recorded when the code was first compiled, in this other test (``carried_over``):
    # Dynamo's cache keeps the broken graphs, so a later test that runs them records nothing.
    first_seen: str = dataclasses.field(default="", compare=False)

    @property
    def location(self) -> str:
        """``file:line``, the path relative to the working directory when it lies under it."""
        return f"{relpath(self.filename)}:{self.lineno}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "location": self.location,
            "filename": self.filename,
            "lineno": self.lineno,
            "code": self.code,
            "function": self.function,
            "frame_skipped": self.frame_skipped,
            **({"first_seen": self.first_seen} if self.first_seen else {}),
        }

    def __str__(self) -> str:
        return _format_one(self)


@dataclasses.dataclass(frozen=True)
class Recompile:
    """One recompilation of a function: the guard that failed, as Dynamo words it."""

    reason: str
    function: str
    location: str
    # Dynamo compiled the function before the recording began (an earlier test): entries
    # from then are in its cache, so this count depends on what ran before.
    earlier: bool = False
    # The code recompiled is the rest of ``function`` after a graph break (Dynamo's resume
    # function); ``location`` is then the break's line.
    resumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        what = f"the rest of {self.function} after its graph break" if self.resumed else self.function
        text = f"Recompiled {what} ({self.location}): {self.reason}"
        if _BROKEN_VALUE in self.reason:
            text += (" [a value computed before the graph break reached the rest of the function as a "
                     "Python constant: each new value recompiles]")
        if self.earlier:
            text += " [first compiled before this test: its cache holds entries from earlier calls]"
        return text


class GraphBreakRecorder:
    """Context manager recording every graph break and recompilation while it is active.

    Breaks are found while Dynamo *compiles*, so the block must contain the first call
    (the warm-up) of the compiled code; a call that hits Dynamo's cache compiles nothing
    and records nothing (use :func:`find_graph_breaks` for code compiled earlier).
    ``graph_breaks`` is deduplicated by (reason, location) and keeps first-seen order;
    ``recompiles`` has one entry per recompilation. Both are filled on exit, and
    :meth:`collect` refreshes them while the block is still running. Recorders nest;
    they are not thread-safe.
    """

    def __init__(self) -> None:
        self.graph_breaks: list[GraphBreak] = []
        self.recompiles: list[Recompile] = []
        self._reasons_before: list[Any] | None = None
        self._failures_before: dict[Any, int] = {}
        self._first_frame: int | None = None
        self._log_events: list[GraphBreak] = []

    def __enter__(self) -> GraphBreakRecorder:
        dynamo_utils = _compat.dynamo_utils()
        if dynamo_utils is None:  # warned by _compat: no reasons to read
            self._reasons_before = None
            return self
        # Holding the old entries keeps their ids unique while we compare against them.
        self._reasons_before = list(dynamo_utils.graph_break_reasons)
        self._failures_before = {
            code: len(reasons) for code, reasons in dynamo_utils.guard_failures.items()
        }
        self._first_frame = _compat.dynamo_frame_counter()
        self._log_events = []
        _log_tap.subscribe(self._on_log_record)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.collect()
        finally:
            if self._reasons_before is not None:
                _log_tap.unsubscribe(self._on_log_record)
            self._reasons_before = None

    @property
    def breaks(self) -> list[GraphBreak]:
        """Alias of ``graph_breaks``."""
        return self.graph_breaks

    def collect(self) -> GraphBreakRecorder:
        """Refresh ``graph_breaks`` and ``recompiles`` from what Dynamo recorded so far."""
        dynamo_utils = _compat.dynamo_utils()
        if self._reasons_before is None or dynamo_utils is None:
            return self
        seen = {id(r) for r in self._reasons_before}
        new_reasons = [r for r in dynamo_utils.graph_break_reasons if id(r) not in seen]
        logged = {(e.filename, e.lineno): e for e in self._log_events if not e.frame_skipped}
        breaks = []
        for compile_reason in new_reasons:
            graph_break = _from_compile_reason(compile_reason, logged)
            if graph_break is not None:
                breaks.append(graph_break)
        breaks.extend(e for e in self._log_events if e.frame_skipped)
        self.graph_breaks = _dedupe(breaks)
        self.recompiles = _recompiles_since(self._failures_before, dynamo_utils.guard_failures, self._first_frame)
        return self

    def _on_log_record(self, record: logging.LogRecord) -> None:
        event = _from_log_record(record)
        if event is not None:
            self._log_events.append(event)


@dataclasses.dataclass
class _Analysis:
    graph_breaks: list[GraphBreak]
    graph_count: int
    name: str


def find_graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[GraphBreak]:
    """Compile ``fn`` afresh, call it once with ``args``/``kwargs``, return its graph breaks.

    Works whether ``fn`` is plain, ``torch.compile``'d, or already compiled and cached:
    the original callable is traced again under a recording backend that compiles nothing
    (graphs run as traced, no Inductor), through a *copy* of its code object, so the
    caches of the user's compiled function are left as they were. Unlike
    ``torch._dynamo.explain`` it does not call ``torch._dynamo.reset()``. ``fn`` runs once,
    with its side effects.
    """
    return _analyse(fn, args, kwargs).graph_breaks


def assert_no_graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Fail, naming each break's reason, ``file:line`` and source line, if ``fn`` breaks."""
    __tracebackhide__ = True
    analysis = _analyse(fn, args, kwargs)
    if not analysis.graph_breaks:
        return
    breaks = analysis.graph_breaks
    count = len(breaks)
    plural = "s" if count != 1 else ""
    if analysis.graph_count:
        graphs = analysis.graph_count
        header = (
            f"{analysis.name} was split into {graphs} graph{'s' if graphs != 1 else ''} "
            f"by {count} graph break{plural}:"
        )
    else:
        header = f"{analysis.name} was not compiled at all (Dynamo ran it eagerly) after {count} graph break{plural}:"
    raise AssertionError(f"{header}\n{format_graph_breaks(breaks)}")


def format_graph_breaks(breaks: Iterable[GraphBreak]) -> str:
    """One paragraph per break: ``Graph break at file:line: reason `source line```."""
    return "\n".join(_format_one(b) for b in breaks)


def _format_one(graph_break: GraphBreak) -> str:
    line = f"Graph break at {graph_break.location}: {graph_break.reason}"
    if graph_break.code:
        line += f"  `{graph_break.code}`"
    if graph_break.frame_skipped:
        function = graph_break.function or "the function"
        line += f"\n    (Dynamo could not resume after it and ran all of {function} eagerly)"
    if graph_break.first_seen:
        line += f"\n    (recorded when this code was first compiled, in {graph_break.first_seen}; its broken graphs ran here)"
    return line


def carried_over(seen: Iterable[tuple[GraphBreak, str]], reports: Iterable[Any], test_id: str,
                 recorded: Iterable[GraphBreak] = (), recompiled: Iterable[Recompile] = ()) -> list[GraphBreak]:
    """The graph breaks that other tests recorded, earlier in the session, in functions whose
    compiled code ran in ``reports``: Dynamo compiles a function once a process, so only the
    first test that calls it records its breaks; a later test runs the same broken graphs from
    Dynamo's cache. ``seen`` holds ``(break, test id)`` in the order recorded. A break counts
    when a generated kernel of the reports has its source in the function that holds the
    break's line (found by parsing the file); eager kernels alone do not, so calling the
    function uncompiled carries nothing over. Breaks ``recorded`` by this test are left out,
    and so are breaks in a function this test ``recompiled``: its new graphs were traced
    here, and any break in them was recorded here."""
    mine = {(b.reason, b.location) for b in recorded}
    fresh = [w for r in recompiled if not r.resumed and (w := split_source(r.location))]  # the frame itself retraced
    lines: dict[str, set[int]] = {}
    for report in reports:
        for k in getattr(report, "kernels", ()):
            where = split_source(k.source) if k.generated else None
            if where is not None:
                lines.setdefault(where[0], set()).add(where[1])
    found: dict[tuple[str, str], GraphBreak] = {}
    for graph_break, first_test in seen:
        key = (graph_break.reason, graph_break.location)
        if first_test == test_id or key in mine or key in found:
            continue
        span = _function_span(graph_break.filename, graph_break.lineno)
        path = relpath(graph_break.filename)
        ran = lines.get(path, ())
        if span is None or any(f == path and span[0] <= n <= span[1] for f, n in fresh):
            continue
        if any(span[0] <= n <= span[1] for n in ran):
            found[key] = dataclasses.replace(graph_break, first_seen=first_test)
    return list(found.values())


@functools.lru_cache(maxsize=256)
def _function_span(filename: str, lineno: int) -> tuple[int, int] | None:
    """``(first, last)`` line of the innermost function or method defined in ``filename``
    that holds ``lineno``; None when the file cannot be parsed or no function holds it."""
    import ast

    try:
        with open(filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            last = getattr(node, "end_lineno", None) or node.lineno
            if first <= lineno <= last and (best is None or last - first < best[1] - best[0]):
                best = (first, last)
    return best


def _analyse(fn: Callable[..., Any], args: tuple, kwargs: dict) -> _Analysis:
    import torch

    original = _original_callable(fn)
    counter = _GraphCounter()
    compiled = torch.compile(_fresh_callable(original), backend=counter)
    with GraphBreakRecorder() as recorder:
        compiled(*args, **kwargs)
    return _Analysis(recorder.graph_breaks, counter.count, _callable_name(original))


class _GraphCounter:
    """A backend that compiles nothing: it counts the graphs Dynamo hands it."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Callable[..., Any]:
        self.count += 1
        return gm.forward


def _original_callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    for _ in range(8):
        inner = _compat.compiled_inner(fn)
        if inner is None or inner is fn:
            return fn
        fn = inner
    return fn


def _fresh_callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind a code object of its own, so Dynamo's per-code caches start empty."""
    if isinstance(fn, types.FunctionType):
        return _copy_function(fn)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return types.MethodType(_copy_function(fn.__func__), fn.__self__)

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return _copy_function(call)


def _copy_function(fn: types.FunctionType) -> types.FunctionType:
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__dict__.update(fn.__dict__)
    return copy


def _callable_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name or type(fn).__name__


def _from_compile_reason(compile_reason: Any, logged: dict) -> GraphBreak | None:
    frame = _innermost_user_frame(getattr(compile_reason, "user_stack", None) or [])
    if frame is None:
        return None
    text = str(getattr(compile_reason, "reason", ""))
    if text.startswith("generic_jump"):
        # Dynamo's structured record says only "generic_jump TensorVariable()"; its log
        # line for the same location has the readable message.
        event = logged.get((frame.filename, frame.lineno))
        reason = event.reason if event is not None else _DATA_DEPENDENT_BRANCH
        detail = event.detail if event is not None else text
    else:
        reason, detail = _short_reason(text), text
    return _graph_break(reason, frame, detail=detail)


def _from_log_record(record: logging.LogRecord) -> GraphBreak | None:
    """A graph break from a ``graph_breaks`` log record; never raises into Dynamo."""
    try:
        error = record.exc_info[1] if record.exc_info else None
        stack = getattr(error, "real_stack", None)
        if error is not None and stack:
            frame = _innermost_user_frame(stack)
            if frame is None:
                return None
            cause = error.__cause__ if error.__cause__ is not None else error
            text = str(getattr(cause, "msg", cause))
            return _graph_break(_short_reason(text), frame, frame_skipped=True, detail=text)
        match = _LOG_LOCATION.search(record.getMessage())
        if match is None:
            return None
        text = match["reason"]
        head, _, rest = text.partition("\n\n")
        skipped = "back to eager" in head
        if rest and head.rstrip().endswith(":"):
            text = rest  # drop Dynamo's "Encountered graph break when ...:" preamble
        frame = _Frame(match["file"], int(match["line"]), "", "")
        return _graph_break(_short_reason(text), frame, frame_skipped=skipped, detail=text)
    except Exception:
        return None


@dataclasses.dataclass
class _Frame:
    filename: str
    lineno: int
    name: str
    line: str


def _innermost_user_frame(stack: Iterable[Any]) -> _Frame | None:
    """The innermost frame outside torch and this plugin (a ``<string>`` one only as a last resort)."""
    frames = [
        _Frame(f.filename, f.lineno or 0, getattr(f, "name", ""), getattr(f, "line", "") or "")
        for f in stack
    ]
    found = user_frame((f.filename, i) for i, f in enumerate(frames))
    return frames[found[1]] if found is not None else None


def _graph_break(reason: str, frame: _Frame, *, frame_skipped: bool = False, detail: str = "") -> GraphBreak:
    code = frame.line
    if not code:
        import linecache

        code = linecache.getline(frame.filename, frame.lineno)
    match = _RESUME_FN.match(frame.name or "")
    function = match["name"] if match else frame.name
    return GraphBreak(
        reason=reason,
        filename=frame.filename,
        lineno=frame.lineno,
        code=code.strip(),
        function=function,
        frame_skipped=frame_skipped,
        detail=detail,
    )


def _short_reason(text: str) -> str:
    """Dynamo's headline and the first sentence of its explanation, without hints."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines:
        return "unknown reason"
    headline = lines[0].rstrip(":")
    explanation = next((l[len("Explanation:"):].strip() for l in lines if l.startswith("Explanation:")), "")
    if explanation:
        sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z])", explanation, maxsplit=1)[0]
        headline = f"{headline}: {sentence}"
    if len(headline) > _MAX_REASON:
        headline = headline[: _MAX_REASON - 3].rstrip() + "..."
    return headline


def _dedupe(breaks: Iterable[GraphBreak]) -> list[GraphBreak]:
    seen: dict[tuple[str, str], GraphBreak] = {}
    for graph_break in breaks:
        # A skipped frame can be logged twice with differently worded reasons; one place.
        reason = "<frame skipped>" if graph_break.frame_skipped else graph_break.reason
        seen.setdefault((reason, graph_break.location), graph_break)
    return list(seen.values())


def _recompiles_since(before: dict[Any, int], guard_failures: dict[Any, list[str]], first_frame: int | None = None) -> list[Recompile]:
    """Group new guard-failure strings into recompilations.

    Each string starts with the compile id (``frame/compile``) of the entry whose guard
    failed; a frame number below ``first_frame`` (Dynamo's frame counter when recording
    began) marks a function compiled before (``Recompile.earlier``).

    One recompilation checks each cache entry of the code once, so a compile id seen
    twice starts the next recompilation. Its reason is the first failure, as Dynamo's
    own ``recompile_reason`` is.
    """
    recompiles = []
    for code, reasons in list(guard_failures.items()):
        start = before.get(code, 0)
        if len(reasons) < start:  # torch._dynamo.reset() ran in between
            start = 0
        events: list[list[str]] = []
        ids: set[str] = set()
        for reason in reasons[start:]:
            match = _COMPILE_ID.match(reason)
            compile_id = match.group(0) if match else reason
            if not events or compile_id in ids:
                events.append([])
                ids = set()
            ids.add(compile_id)
            events[-1].append(reason)
        name = getattr(code, "co_name", "<unknown>")
        match = _RESUME_FN.match(name)
        function = match["name"] if match else name  # a resume function starts at its break's line
        location = f"{relpath(getattr(code, 'co_filename', '?'))}:{getattr(code, 'co_firstlineno', 0)}"
        for event in events:
            reason = _COMPILE_ID.sub("", event[0]).strip().splitlines()[0] if event[0].strip() else "unknown"
            frame = _FRAME_ID.match(event[0])
            earlier = first_frame is not None and frame is not None and int(frame.group(1)) < first_frame
            reason = re.sub(r"\s{2,}", "  ", reason)  # Dynamo pads a guard to align the source it quotes
            reason = _GUARD_WHERE.sub("", reason)  # and ends it with a cut path: the location says where
            recompiles.append(Recompile(reason=_trim(reason), function=function, location=location, earlier=earlier,
                                        resumed=match is not None))
    return recompiles


def _trim(text: str) -> str:
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3].rstrip() + "..."


class _LogTap(logging.Handler):
    """One handler shared by all active recorders on Dynamo's ``graph_breaks`` loggers.

    The first subscriber attaches it and, where the user has not already enabled the
    artifact, sets the logger to DEBUG with propagation off (so nothing reaches the
    terminal); the last one to leave restores level, propagation and handlers. Refcounting
    instead of save/restore per recorder keeps nesting correct in any exit order.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._listeners: list[Callable[[logging.LogRecord], None]] = []
        self._saved: list[tuple[logging.Logger, int, bool]] = []

    def subscribe(self, listener: Callable[[logging.LogRecord], None]) -> None:
        if not self._listeners:
            self._install()
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[logging.LogRecord], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
        if not self._listeners:
            self._restore()

    def emit(self, record: logging.LogRecord) -> None:
        for listener in list(self._listeners):
            listener(record)

    def _install(self) -> None:
        for logger in _graph_break_loggers():
            self._saved.append((logger, logger.level, logger.propagate))
            if not logger.isEnabledFor(logging.DEBUG):
                logger.propagate = False
                logger.setLevel(logging.DEBUG)
            logger.addHandler(self)

    def _restore(self) -> None:
        while self._saved:
            logger, level, propagate = self._saved.pop()
            logger.removeHandler(self)
            logger.propagate = propagate
            logger.setLevel(level)


def _graph_break_loggers() -> list[logging.Logger]:
    names = set(_GRAPH_BREAK_LOGGERS) | set(_compat.graph_break_logger_names())
    return [logging.getLogger(name) for name in sorted(names)]


_log_tap = _LogTap()
