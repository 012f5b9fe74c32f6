"""The one rule for "is this the user's code" (where.py), on plain paths."""

from __future__ import annotations

import pytest

from pytest_fusioncheck.where import is_internal, user_frame, user_source


@pytest.mark.parametrize(
    "path, internal",
    [
        ("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", True),
        ("/venv/lib/python3.12/site-packages/triton/runtime/jit.py", True),
        ("/venv/lib/python3.12/site-packages/_pytest/python.py", True),
        ("/venv/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py", False),
        # an environment that lives under a directory named torch (the H200's /opt/torch/.venv):
        # the installed package's own name decides
        ("/opt/torch/.venv/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py", False),
        ("/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/functional.py", True),
        ("/home/me/src/pytorch/torch/nn/functional.py", True),  # a source checkout of torch
        ("/tmp/torchinductor_me/ab/cabcdef.py", True),  # Inductor's generated code
        ("/home/me/project/models/block.py", False),
        ("/usr/lib/python3.12/contextlib.py", True),
    ],
)
def test_a_file_is_internal_by_the_package_it_belongs_to(path, internal):
    assert is_internal(path) is internal


def test_the_innermost_user_frame_skips_library_frames_and_prefers_real_files():
    frames = [
        ("/home/me/tests/test_model.py", 10),
        ("/opt/torch/.venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py", 276),
        ("/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1775),
        ("<string>", 1),
    ]
    assert user_frame(frames) == frames[1]


def _launch_helper():
    __tracebackhide__ = True  # a wrapper: its caller's line is the one to show
    return user_source(1)


def _caller_of_the_helper():
    return _launch_helper(), _caller_of_the_helper.__code__.co_firstlineno + 1


def test_a_frame_that_hides_itself_from_tracebacks_gives_its_callers_line():
    source, line = _caller_of_the_helper()
    assert source.endswith(f"test_where.py:{line}")


@pytest.mark.parametrize(
    "path, shown",
    [
        ("/opt/torch/.venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py",
         "transformers/models/gpt2/modeling_gpt2.py"),
        ("{cwd}/.venv/lib/python3.11/site-packages/transformers/activations.py", "transformers/activations.py"),
        ("/usr/lib/python3/dist-packages/mylib/block.py", "mylib/block.py"),
        ("{cwd}/mymodels/block.py", "mymodels/block.py"),
        ("/somewhere/else/block.py", "/somewhere/else/block.py"),
    ],
)
def test_an_installed_packages_file_is_shown_from_its_package_name_and_a_project_file_from_the_working_directory(path, shown):
    import os

    from pytest_fusioncheck.where import relpath

    assert relpath(path.format(cwd=os.getcwd())) == shown


@pytest.mark.parametrize("source, parts", [("m.py:12", ("m.py", 12)), ("C:/x/m.py:3", ("C:/x/m.py", 3)),
                                           ("m.py", None), ("<string>:x", None), (None, None), (":4", None)])
def test_a_source_location_splits_into_its_path_and_line_or_none(source, parts):
    from pytest_fusioncheck.where import split_source

    assert split_source(source) == parts
