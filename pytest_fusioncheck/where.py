"""User ``file:line``: the one rule for "is this the user's code", shared by the kernel
table (which line launched a kernel) and graph-break messages (which line broke).

A frame is *internal* when its file belongs to this plugin, to torch, triton, functorch,
pytest or pluggy, to Inductor's generated-code cache, or is one of a few standard-library
wrappers. Everything else is the user's: a test file, a model's own code, a model library
installed in site-packages (a ``transformers`` line is the answer, a torch line is not).
Frames with pseudo-files (``<string>``, ``<frozen ...>``) are used only when no real file
qualifies. Paths are shown relative to the working directory when under it; a file of an
installed package from the package's own name (``transformers/models/llama/modeling_llama.py``,
wherever the environment lives), so a table reads the same on every machine.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Iterable

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_INTERNAL_PARTS = frozenset({"torch", "_pytest", "pluggy", "triton", "torchinductor", "functorch"})
_INTERNAL_FILES = frozenset({"contextlib.py", "threading.py", "runpy.py", "functools.py"})


def is_internal(filename: str) -> bool:
    """Whether ``filename`` is plugin, framework or wrapper code (never a user's line)."""
    if filename.startswith("<"):
        return False  # pseudo-files: user code of last resort (see user_frame)
    return _is_internal_path(filename if os.path.isabs(filename) else os.path.abspath(filename))


@functools.lru_cache(maxsize=4096)
def _is_internal_path(absolute: str) -> bool:
    # Cached: every profiled op walks its call stack (BENCHMARKS.md, "Overhead of a profiled region").
    path = os.path.normpath(absolute)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    parts = path.replace("\\", "/").split("/")
    if any(p.startswith("torchinductor_") for p in parts):
        return True
    installed = [i for i, p in enumerate(parts[:-1]) if p in ("site-packages", "dist-packages")]
    if installed:  # an installed package: its top-level name decides, not the directories above
        # the environment (a venv under /opt/torch/ holds transformers, which is user code)
        top = parts[installed[-1] + 1 : installed[-1] + 2]
        if top and top[0] in _INTERNAL_PARTS:
            return True
    elif any(p in _INTERNAL_PARTS for p in parts[:-1]):  # a source checkout (.../torch/nn/...)
        return True
    return os.path.basename(path) in _INTERNAL_FILES


def relpath(filename: str) -> str:
    """``filename`` from its installed package's name (``transformers/...``), else relative
    to the working directory when under it, else unchanged."""
    try:
        cwd = os.getcwd()
    except (OSError, ValueError):
        return filename
    return _relpath(filename, cwd)


@functools.lru_cache(maxsize=4096)
def _relpath(filename: str, cwd: str) -> str:
    try:
        path = os.path.normpath(os.path.join(cwd, filename))
    except (OSError, ValueError):
        return filename
    parts = path.replace("\\", "/").split("/")
    installed = [i for i, p in enumerate(parts[:-1]) if p in ("site-packages", "dist-packages")]
    if installed:
        return "/".join(parts[installed[-1] + 1:])
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    return filename


def split_source(source: str | None) -> tuple[str, int] | None:
    """``("path", line)`` of a ``path:line`` location, or None when it is not one."""
    path, _, line = (source or "").rpartition(":")
    return (path, int(line)) if path and line.isdigit() else None


def user_frame(frames: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The innermost user ``(filename, line)`` of ``frames`` (innermost last)."""
    frames = list(frames)
    user = [f for f in frames if not is_internal(f[0])]
    real = [f for f in user if not f[0].startswith("<")]
    for candidates in (real, user):
        if candidates:
            return candidates[-1]
    return None


def user_source(start_depth: int = 1, max_depth: int = 200) -> str | None:
    """The innermost user frame's ``file:line`` on the current call stack.

    A function that sets pytest's ``__tracebackhide__`` hides its frames from tracebacks; it is
    a wrapper (a launch helper, an assertion helper) here too, and its caller's line is the one
    shown (reference_kernels' ``_launch.launch`` is one)."""
    try:
        frame = sys._getframe(start_depth)
    except ValueError:
        return None
    first_pseudo = None
    depth = 0
    while frame is not None and depth < max_depth:
        filename = frame.f_code.co_filename
        if not is_internal(filename) and "__tracebackhide__" not in frame.f_code.co_varnames:
            if not filename.startswith("<"):
                return f"{relpath(filename)}:{frame.f_lineno}"
            first_pseudo = first_pseudo or f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
        depth += 1
    return first_pseudo
