"""reference_kernels/_launch.py: a call's launches recorded once per problem and replayed after.

On CPU the replays relaunch through Triton's interpreter (the same records, keys and checks as on a GPU); the
``gpu`` tests check the launcher-bound replays against calls that plan each time, bit for bit.
"""

import pytest
import torch

from reference_kernels import _launch, attention, bias_gelu_dropout, gemm_epilogue, layer_norm, softmax

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def _planned(fn):
    """``fn()`` with replays off: it plans and launches through Triton."""
    with _launch.replays_off():
        return fn()


def _assert_replays_match_planned_calls(name, calls, call):
    """``call(0)`` plans (a key's first call), ``call(1)`` records, ``call(2)`` and ``call(3)`` (fresh inputs from
    those seeds) replay, each bit for bit what the same call planned through Triton returns."""
    _launch.forget()
    call(0)
    assert calls.last == "planned: first call", f"{name}: {calls.last}"
    call(1)
    assert calls.last == "recorded", f"{name}: {calls.last}"
    for i in (2, 3):
        got = _as_tuple(call(i))
        assert calls.last == "replayed", f"{name}: {calls.last}"
        want = _as_tuple(_planned(lambda: call(i)))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=lambda m: f"{name}, call {i}: {m}")


def _calls(dtype, rows=6, cols=100):
    """(name, Calls table, call(seed)) of each subject at a small problem; ``call(i)`` takes fresh inputs from seed i."""
    def rand(i, *shape, dt=dtype):
        g = torch.Generator().manual_seed(i)
        return torch.randn(*shape, generator=g).to(dt).to(DEVICE)

    w, b = rand(100, cols), rand(101, cols)
    mean_rstd = {}

    def ln_forward(i):
        y, mean, rstd = layer_norm.forward(rand(i, rows, cols), w, b)
        mean_rstd[i] = (mean, rstd)
        return y, mean, rstd

    def ln_backward(i):
        x = rand(i, rows, cols)
        _, mean, rstd = _planned(lambda: layer_norm.forward(x, w, b))
        return layer_norm.backward(rand(i + 50, rows, cols), x, w, mean, rstd)

    return [
        ("softmax", softmax.CALLS, lambda i: softmax.fused(rand(i, rows, cols))),
        ("layer_norm forward", layer_norm.FORWARD_CALLS, ln_forward),
        ("layer_norm backward", layer_norm.BACKWARD_CALLS, ln_backward),
        ("bias_gelu_dropout", bias_gelu_dropout.CALLS,
         lambda i: bias_gelu_dropout.fused(rand(i, rows, cols), b, 0.25, seed=i)),
        ("gemm_epilogue", gemm_epilogue.CALLS,
         lambda i: gemm_epilogue.fused(rand(i, 16, 32), rand(i + 1, 32, 48), rand(i + 2, 48))),
        ("attention", attention.CALLS,
         lambda i: attention.fused(*(rand(i + j, 1, 2, 16, 64) for j in range(3)))),
    ]


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("case", range(6), ids=["softmax", "ln_fwd", "ln_bwd", "bias_gelu_dropout", "gemm", "attention"])
def test_a_second_call_of_a_problem_replays_its_record_on_the_new_tensors(case):
    _assert_replays_match_planned_calls(*_calls(torch.float32)[case])


def test_a_problem_of_another_shape_dtype_alignment_or_aliasing_is_recorded_apart():
    _launch.forget()
    x = torch.randn(8, 128, device=DEVICE)
    softmax.fused(x)
    for other in (torch.randn(8, 96, device=DEVICE),  # shape
                  torch.randn(8, 128, device=DEVICE).half(),  # dtype
                  torch.randn(8 * 128 + 1, device=DEVICE)[1:].view(8, 128),  # 4 bytes past an aligned address
                  torch.randn(8, 256, device=DEVICE)[:, :128]):  # row stride
        want = torch.softmax(other.float(), -1).to(other.dtype)
        got = softmax.fused(other)
        assert softmax.CALLS.last != "replayed"
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    # the same tensor in and out (in place) is another problem than two tensors: its record must not write x
    y = torch.randn(8, 128, device=DEVICE)
    for _ in range(3):
        softmax.fused(y, out=torch.empty_like(y))
    assert softmax.CALLS.last == "replayed"
    want = torch.softmax(y, -1)
    softmax.fused(y, out=y)
    assert softmax.CALLS.last == "planned: first call"
    torch.testing.assert_close(y, want, atol=1e-6, rtol=0)


def test_the_last_key_replayed_is_checked_without_a_key_and_stands_for_nothing_else(monkeypatch):
    # a key of three 4-D tensors cost ~3 us of Python a call (CI's host), the check that stands for it ~0.4
    import gc
    import weakref

    keyed = []
    slot_key = _launch._slot_key
    monkeypatch.setattr(_launch, "_slot_key", lambda slots: keyed.append(1) or slot_key(slots))  # forgets the records
    x = torch.randn(8, 128, device=DEVICE)
    for _ in range(3):
        softmax.fused(x, out=torch.empty_like(x))
    assert softmax.CALLS.last == "replayed" and softmax.CALLS.hot
    keyed.clear()
    y = torch.randn(8, 128, device=DEVICE)
    torch.testing.assert_close(softmax.fused(y, out=torch.empty_like(y)), torch.softmax(y, -1))
    assert softmax.CALLS.last == "replayed" and keyed == []  # the check stood for the key
    others = [((torch.randn(8, 96, device=DEVICE),), {}),  # shape
              ((torch.randn(8, 128, device=DEVICE).half(),), {}),  # dtype
              ((torch.randn(8 * 128 + 1, device=DEVICE)[1:].view(8, 128),), {}),  # 4 bytes past an aligned address
              ((torch.randn(8, 256, device=DEVICE)[:, :128],), {}),  # row stride
              ((torch.randn(8, 128, device=DEVICE),), {"out": None}),  # another None
              ((torch.randn(8, 128, device=DEVICE),), {"max_row": 64})]  # another parameter
    for args, kwargs in others:
        kwargs.setdefault("out", torch.empty_like(args[0]))
        if kwargs["out"] is None:
            del kwargs["out"]
        keyed.clear()
        got = softmax.fused(*args, **kwargs)
        assert softmax.CALLS.last == "planned: first call" and keyed, (args[0].shape, kwargs)
        torch.testing.assert_close(got, torch.softmax(args[0].float(), -1).to(got.dtype), atol=2e-3, rtol=0)
    z = torch.randn(8, 128, device=DEVICE)
    for _ in range(3):
        softmax.fused(z, out=torch.empty_like(z))
    want = torch.softmax(z, -1)
    softmax.fused(z, out=z)  # the same tensor in and out: not the hot key's two
    assert softmax.CALLS.last == "planned: first call"
    torch.testing.assert_close(z, want, atol=1e-6, rtol=0)
    for _ in range(3):
        softmax.fused(z)  # no out: a hot key with None in a slot
    out = torch.empty_like(z)
    assert softmax.fused(z, out=out) is out  # a tensor where the hot key had None: not its replay
    freed = weakref.ref(y)  # the check holds no tensor of a call
    del y
    gc.collect()
    assert freed() is None
    _launch.forget()
    assert softmax.CALLS.hot == ()


def test_the_last_four_keys_replayed_are_checked_before_a_key_so_a_blocks_gemms_in_turn_make_none(monkeypatch):
    # a transformer block's GEMMs take four shapes in turn: each missed the one hot key and made one (bench_host --python)
    keyed, checked = [], []
    slot_key, matches = _launch._slot_key, _launch._Hot.matches
    monkeypatch.setattr(_launch, "_slot_key", lambda slots: keyed.append(1) or slot_key(slots))  # forgets the records
    monkeypatch.setattr(_launch._Hot, "matches", lambda self, slots: checked.append(1) or matches(self, slots))
    block = [(torch.randn(4, m, device=DEVICE), torch.randn(m, n, device=DEVICE), torch.randn(n, device=DEVICE))
             for m, n in ((16, 48), (16, 16), (16, 64), (64, 16))]
    for _ in range(4):  # each key planned, recorded, replayed keyed, then checked
        for a, b, c in block:
            gemm_epilogue.fused(a, b, c)
    keyed.clear()
    for a, b, c in block:
        torch.testing.assert_close(gemm_epilogue.fused(a, b, c), gemm_epilogue.unfused(a, b, c), atol=1e-4, rtol=1e-4)
        assert gemm_epilogue.CALLS.last == "replayed"
    assert keyed == [] and len(gemm_epilogue.CALLS.hot) == 4
    checked.clear()
    for _ in range(2):
        for a, b, c in block:  # each one's check first: the key that came after the last call's last time
            gemm_epilogue.fused(a, b, c)
    assert checked == [1] * 8
    for _ in range(2):  # one key again and again: learnt at its second call, its own check first after
        gemm_epilogue.fused(*block[2])
    checked.clear()
    for _ in range(3):
        gemm_epilogue.fused(*block[2])
    assert checked == [1, 1, 1] and gemm_epilogue.CALLS.last == "replayed"
    fifth = (torch.randn(4, 8, device=DEVICE), torch.randn(8, 8, device=DEVICE), torch.randn(8, device=DEVICE))
    for _ in range(3):
        gemm_epilogue.fused(*fifth)
    assert len(gemm_epilogue.CALLS.hot) == 4  # the fifth in, the oldest out
    keyed.clear()
    gemm_epilogue.fused(*block[0])
    assert gemm_epilogue.CALLS.last == "replayed" and keyed == [1]  # keyed: no longer among the four


def test_an_error_of_a_replay_reaches_the_caller_and_the_call_does_not_run_again():
    calls = _launch.Calls("test.errors")
    x = torch.randn(2, 8, device=DEVICE)
    runs = []

    def run():
        runs.append(1)
        out = torch.empty(16, device=DEVICE)
        _launch.launch(_scaled_kernel, (1,), x, out, 16, 2, BLOCK=16)
        return out

    for _ in range(4):  # planned, recorded, replayed (keyed), replayed (the hot check)
        torch.testing.assert_close(calls((), (x,), run), 2 * x.reshape(16))
    assert calls.last == "replayed" and runs == [1, 1] and calls.hot

    def broken(slots, scalars):
        raise TypeError("from the replay")

    calls.hot[0].entry.run = broken
    with pytest.raises(TypeError, match="from the replay"):
        calls((), (x,), run)
    assert runs == [1, 1]


def test_a_key_is_recorded_at_its_second_call_and_its_replays_python_generated_at_its_first_replay(monkeypatch):
    # a shape that changes every call (a growing sequence) never pays a record (docs/kernels.md, "Host time a call")
    recorded, generated = [], []
    replay_of, source = _launch._replay_of, _launch._replay_source
    monkeypatch.setattr(_launch, "_replay_of", lambda *args: recorded.append(1) or replay_of(*args))
    monkeypatch.setattr(_launch, "_replay_source", lambda *args: generated.append(1) or source(*args))
    for n in (40, 41, 42):  # three keys, each called once
        x = torch.randn(3, n)
        torch.testing.assert_close(softmax.fused(x), torch.softmax(x, -1))
        assert softmax.CALLS.last == "planned: first call"
    assert recorded == [] and generated == [] and _launch._current() is None
    x = torch.randn(3, 42)
    torch.testing.assert_close(softmax.fused(x), torch.softmax(x, -1))  # the second call: recorded
    assert softmax.CALLS.last == "recorded" and recorded == [1] and generated == []
    torch.testing.assert_close(softmax.fused(x * 2), torch.softmax(x * 2, -1))  # the first replay: generated, run
    assert softmax.CALLS.last == "replayed" and generated == [1]
    torch.testing.assert_close(softmax.fused(x * 3), torch.softmax(x * 3, -1))
    assert recorded == [1] and generated == [1]


def test_a_replay_returns_new_outputs_rebuilt_as_the_record_returned_them():
    _launch.forget()
    w, b = torch.randn(64, device=DEVICE), torch.randn(64, device=DEVICE)
    xs = [torch.randn(2, 3, 64, device=DEVICE) for _ in range(4)]  # 3-D: mean and rstd are (2, 3) views
    outs = [layer_norm.forward(x, w, b) for x in xs]
    assert layer_norm.FORWARD_CALLS.last == "replayed"
    ptrs = {t.data_ptr() for out in outs for t in out}
    assert len(ptrs) == 12  # every call its own y, mean and rstd, though all four calls' results are alive
    for x, (y, mean, rstd) in zip(xs, outs):
        assert mean.shape == rstd.shape == (2, 3) and y.shape == x.shape
        torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (64,), w, b), atol=1e-5, rtol=0)
        torch.testing.assert_close(mean, x.mean(-1), atol=1e-5, rtol=0)
    given = torch.empty(4, 64, device=DEVICE)
    x = torch.randn(4, 64, device=DEVICE)
    for _ in range(3):
        assert softmax.fused(x, out=given) is given  # the caller's out comes back as itself


def test_a_replay_returns_a_view_as_a_view_where_another_output_shares_its_allocation():
    calls = _launch.Calls("test.views")
    x = torch.randn(2, 8, device=DEVICE)

    def run(shared):
        out = torch.empty(16, device=DEVICE)
        _launch.launch(_scaled_kernel, (1,), x, out, 16, 2, BLOCK=16)
        return (out, out.view(2, 8)) if shared else out.view(2, 8)

    for shared in (False, True):
        for _ in range(3):
            got = calls((shared,), (x,), lambda: run(shared))
            if shared:  # the view is the returned allocation's, as the record's was
                assert got[1]._base is got[0] and got[1].data_ptr() == got[0].data_ptr()
            torch.testing.assert_close(got[1] if shared else got, 2 * x)
        assert calls.last == "replayed"


def test_a_replay_allocates_through_torch_compiles_allocator_on_the_current_device_only(monkeypatch):
    """The fast allocator takes the current device's: a record's CUDA allocation on another device than the current
    one goes through torch.empty_strided, with its device."""
    made, current = [], [1]
    monkeypatch.setattr(_launch, "_empty_strided_cuda",
                        lambda size, stride, dtype: made.append(("fast", size)) or torch.empty(size))
    monkeypatch.setattr(_launch, "_current_device", lambda: current[0])
    monkeypatch.setattr(torch, "empty_strided",
                        lambda size, stride, dtype, device: made.append(("torch", device)) or torch.empty(size))
    replay = _launch._Replay(0, [((2, 3), (3, 1), torch.float32, torch.device("cuda", 1), False)], [],
                             _launch._Out(0, None))
    replay.run((), {})
    current[0] = 0
    assert replay.run((), {}).shape == (2, 3)
    assert made == [("fast", (2, 3)), ("torch", torch.device("cuda", 1))]


def test_bad_arguments_are_refused_as_before_once_a_call_is_recorded():
    x = torch.randn(4, 64, device=DEVICE)
    for _ in range(3):
        softmax.fused(x)
    assert softmax.CALLS.last == "replayed"
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        softmax.fused(x.tolist())
    assert softmax.CALLS.last == "planned: no key"
    with pytest.raises(ValueError, match="out must be a tensor of x's shape"):
        softmax.fused(x, out=torch.empty(4, 65, device=DEVICE))
    bias = torch.zeros(64, device=DEVICE)
    for seed in (1, 2, 3):
        bias_gelu_dropout.fused(x, bias, 0.5, seed=seed)
    assert bias_gelu_dropout.CALLS.last == "replayed"
    with pytest.raises(ValueError, match="seed must be an int"):
        bias_gelu_dropout.fused(x, bias, 0.5, seed=-1)


def test_each_call_gets_its_own_dropout_seed():
    _launch.forget()
    x = torch.randn(4, 64, device=DEVICE)
    bias = torch.zeros(64, device=DEVICE)
    for seed in (7, 8, 9):
        y = bias_gelu_dropout.fused(x, bias, 0.5, seed=seed)
        mask = bias_gelu_dropout.dropout_mask(x.shape, 0.5, seed, device=DEVICE)
        assert torch.equal(y != 0, mask & (torch.nn.functional.gelu(x) != 0))
    assert bias_gelu_dropout.CALLS.last == "replayed"


def test_setting_a_module_constant_through_monkeypatch_forgets_the_records(monkeypatch):
    x = torch.randn(4, 64, device=DEVICE)
    for _ in range(3):
        softmax.fused(x)
    assert softmax.CALLS.last == "replayed"
    planned = []
    plan = softmax.plan
    monkeypatch.setattr(softmax, "plan", lambda *a, **k: planned.append(a) or plan(*a, **k))
    softmax.fused(x)
    assert softmax.CALLS.last == "planned: first call" and planned


def test_a_call_that_copies_rows_before_its_launch_replays_the_copy_too():
    # rows 8196 bytes apart, wide enough that every plan reads them as aligned vectors (softmax.PHASED_ROWS_MIN_COLS):
    # the plan runs on an aligned copy (_ragged.phased), made again by each replay
    assert softmax.PHASED_ROWS_MIN_COLS <= 2048
    _launch.forget()
    for i in range(4):
        x = torch.randn(3, 2049, device=DEVICE)[:, :2048]
        got = softmax.fused(x)
        assert softmax.CALLS.last == ("planned: first call", "recorded", "replayed", "replayed")[i]
        torch.testing.assert_close(got, torch.softmax(x, -1), atol=1e-6, rtol=0)
    entry = next(iter(softmax.CALLS.table.values()))
    assert any(isinstance(step, _launch._Copy) for step in entry.launches)


def test_replays_are_off_while_a_profiler_hooks_tritons_launcher():
    from pytest_fusioncheck import _compat

    x = torch.randn(4, 64, device=DEVICE)
    for _ in range(3):
        softmax.fused(x)
    assert softmax.CALLS.last == "replayed"
    seen = []

    def on_launch(jitfn, original, args, kwargs, grid, warmup, interpreted):
        seen.append(jitfn)
        return original(jitfn, *args, grid=grid, warmup=warmup, **kwargs)

    with _compat.triton_launch_hook(on_launch):
        softmax.fused(x)
    assert softmax.CALLS.last == "planned: replays off" and len(seen) == 1
    softmax.fused(x)
    assert softmax.CALLS.last == "replayed"


# --------------------------------------------------------------------------- the recorder, on a kernel of its own

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit(do_not_specialize=["k"])
def _add_into_kernel(x_ptr, acc_ptr, out_ptr, n, k, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    tl.atomic_add(acc_ptr + offs, tl.load(x_ptr + offs, mask=ok) + k, mask=ok)
    tl.store(out_ptr + offs, tl.load(acc_ptr + offs, mask=ok), mask=ok)


@triton.jit
def _scaled_kernel(x_ptr, out_ptr, n, k, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * k, mask=offs < n)


def test_a_replay_finds_its_scratch_zeroed_where_the_record_zeroed_it():
    calls = _launch.Calls("test.add_into")

    def call(x, out, k):
        def run():
            acc = torch.zeros(x.shape, device=x.device)  # a scratch the launch accumulates into
            _launch.launch(_add_into_kernel, (1,), x, acc, out, x.numel(), k, BLOCK=64)
        calls((), (x, out), run, {"k": k})
        return out

    x = torch.arange(40, dtype=torch.float32, device=DEVICE)
    for k, how in ((1.0, "planned: first call"), (2.0, "recorded"), (3.0, "replayed"), (4.0, "replayed")):
        out = call(x, torch.empty_like(x), k)
        assert calls.last == how
        torch.testing.assert_close(out, x + k)


def _add_into_calls(name):
    """A Calls table whose call accumulates x + k into a zeroed scratch and copies it to out; its replay's scratch."""
    calls = _launch.Calls(name)

    def call(x, out, k):
        def run():
            acc = torch.zeros(x.shape, device=x.device)
            _launch.launch(_add_into_kernel, (1,), x, acc, out, x.numel(), k, BLOCK=64)
        calls((), (x, out), run, {"k": k})
        return out

    def scratch():
        (entry,) = calls.table.values()
        (kept,) = [a for a in entry.allocs if isinstance(a, _launch._Scratch)]
        return kept

    return calls, call, scratch


def test_a_zeroed_scratch_is_a_slice_of_a_pool_zeroed_again_once_every_slice_was_taken(monkeypatch):
    monkeypatch.setattr(_launch, "_KEPT_BYTES", 3 * 160)  # 40 floats a slice: three a pool
    calls, call, scratch = _add_into_calls("test.pool")
    x = torch.arange(40, dtype=torch.float32, device=DEVICE)
    for k in range(1, 11):  # a plan, a record, then eight replays: the pool taken whole twice, and two slices more
        torch.testing.assert_close(call(x, torch.empty_like(x), float(k)), x + k)  # every slice zero when taken
    kept = scratch()
    assert kept.slices == 3 and len(kept.kept) == 1
    at, pool, slices = next(iter(kept.kept.values()))
    assert at == 2 and pool.numel() == 3 * 40
    assert [s.data_ptr() - pool.data_ptr() for s in slices] == [0, 160, 320]
    torch.testing.assert_close(slices[0], x + 9)  # the last two replays' sums, left for the next zeroing
    torch.testing.assert_close(slices[2], torch.zeros_like(x))  # not taken since the pool was zeroed


def test_a_scratch_is_kept_for_each_stream_and_thread_and_made_each_call_while_a_graph_is_captured(monkeypatch):
    import threading

    calls, call, scratch = _add_into_calls("test.kept")
    x = torch.arange(40, dtype=torch.float32, device=DEVICE)
    for k in (1.0, 2.0, 3.0):
        call(x, torch.empty_like(x), k)
    kept = scratch()
    stream = _launch._current_stream() if ON_GPU else None  # what a replay passes
    mine = kept(stream)
    assert kept(stream) is not mine and len(kept.kept) == 1  # the next slice of this thread's pool
    other = []
    thread = threading.Thread(target=lambda: other.append(kept(stream)))
    thread.start()
    thread.join()
    _, _, my_slices = kept.kept[(stream, threading.get_ident())]
    assert len(kept.kept) == 2 and other[0].data_ptr() not in {s.data_ptr() for s in my_slices}
    kept.cuda = True  # as a CUDA record's, during a capture: made as the record made it, outside every pool
    monkeypatch.setattr(_launch, "_capturing", lambda: True)
    made = kept(stream)
    assert len(kept.kept) == 2 and torch.count_nonzero(made) == 0
    assert all(made.data_ptr() != s.data_ptr() for _, _, pool in kept.kept.values() for s in pool)


def test_a_cuda_scratch_is_kept_by_the_current_stream_even_where_no_launch_is_bound():
    # a record of library ops and copies alone launches on no stream of its own: its scratch still keys by the stream
    made = ((4,), (1,), torch.float32, torch.device("cuda", 0), False)
    text, _ = _launch._replay_source(0, [_launch._Scratch(made, _launch.Calls("test.no_bound"))], [], None)
    assert "    stream = _stream()\n" in text and "(stream)" in text
    text, _ = _launch._replay_source(0, [_launch._Scratch(made[:3] + (torch.device("cpu"), False), None)], [], None)
    assert "    stream = None\n" in text


def test_scratch_past_the_tables_budget_is_made_each_call_and_forget_frees_the_budget(monkeypatch):
    calls, call, scratch = _add_into_calls("test.budget")
    x = torch.arange(40, dtype=torch.float32, device=DEVICE)
    monkeypatch.setattr(_launch, "_TABLE_KEPT_BYTES", 100)  # not one 160-byte slice
    for k in (1.0, 2.0, 3.0, 4.0):
        torch.testing.assert_close(call(x, torch.empty_like(x), k), x + k)
    assert calls.last == "replayed" and scratch().kept == {} and calls.kept_bytes == 0
    monkeypatch.setattr(_launch, "_TABLE_KEPT_BYTES", 64 << 20)  # (the records forgotten: monkeypatch's rule)
    for k in (5.0, 6.0, 7.0):
        call(x, torch.empty_like(x), k)
    assert len(scratch().kept) == 1 and calls.kept_bytes == _launch._KEPT_BYTES // 160 * 160  # a pool of slices
    _launch.forget()
    assert calls.kept_bytes == 0 and calls.table == {}


def test_a_kept_scratch_made_in_inference_mode_is_zeroed_again_outside_it(monkeypatch):
    monkeypatch.setattr(_launch, "_KEPT_BYTES", 160)  # 40 floats: one slice, zeroed again each call
    calls, call, scratch = _add_into_calls("test.inference")
    x = torch.arange(40, dtype=torch.float32, device=DEVICE)
    with torch.inference_mode():
        for k in (1.0, 2.0, 3.0):
            torch.testing.assert_close(call(x, torch.empty_like(x), k), x + k)
    for k in (4.0, 5.0):
        torch.testing.assert_close(call(x, torch.empty_like(x), k), x + k)
    assert calls.last == "replayed" and scratch().slices == 1


def test_a_scratch_the_call_returns_or_past_the_kept_size_is_allocated_each_replay():
    calls = _launch.Calls("test.not_kept")
    big = _launch._KEPT_BYTES // 4 + 1  # floats: one more than a kept scratch holds

    def run(x, out, give_back):
        small, large = torch.empty(8, device=DEVICE), torch.empty(big, device=DEVICE)
        _launch.launch(_scaled_kernel, (1,), x, small, 8, 3, BLOCK=8)
        _launch.launch(_scaled_kernel, (1,), small, large, 8, 2, BLOCK=8)
        _launch.launch(_scaled_kernel, (1,), large, out, 8, 1, BLOCK=8)
        return (out, small) if give_back else out

    for give_back in (False, True):
        for _ in range(3):
            x, out = torch.randn(8, device=DEVICE), torch.empty(8, device=DEVICE)
            got = calls((give_back,), (x, out), lambda: run(x, out, give_back))
            torch.testing.assert_close(out, 6 * x)
        entry = calls.table[((give_back,), _launch._slot_key((x, out)))]
        kinds = [type(a).__name__ for a in entry.allocs]
        assert kinds == (["tuple", "tuple"] if give_back else ["_Scratch", "tuple"]), kinds
    torch.testing.assert_close(got[1], 3 * x)  # the returned scratch is the call's own


def test_a_copy_out_after_a_launch_is_replayed_after_it():
    calls = _launch.Calls("test.copy_out")

    def call(x, out):
        def run():
            scratch = torch.empty_like(x)  # the kernel writes here; the rows are copied out after it (_ragged.finish)
            _launch.launch(_scaled_kernel, (1,), x, scratch, 8, 3, BLOCK=8)
            out.copy_(scratch)
            return out
        return calls((), (x, out), run)

    for how in ("planned: first call", "recorded", "replayed", "replayed"):
        x = torch.randn(8, device=DEVICE)
        out = torch.empty(9, device=DEVICE)[1:]
        assert call(x, out) is out
        assert calls.last == how
        torch.testing.assert_close(out, 3 * x)
    steps = next(iter(calls.table.values())).launches
    assert [type(s).__name__ for s in steps] == ["_Relaunch" if not ON_GPU else "_Bound", "_Copy"]


def test_a_reshape_that_copies_makes_the_call_plan_each_time():
    calls = _launch.Calls("test.reshape")
    x = torch.randn(4, 2, device=DEVICE).t()  # (2, 4), not viewable as 8 elements
    out = torch.empty(8, device=DEVICE)
    for _ in range(2):  # a key's first call plans, its second records
        calls((), (x, out), lambda: _launch.launch(_scaled_kernel, (1,), x.reshape(8), out, 8, 2, BLOCK=8))
    assert calls.last == "planned: reshape copied a tensor into another shape"
    torch.testing.assert_close(out, 2 * x.reshape(8))


def test_a_per_call_argument_that_the_kernel_specialises_on_is_not_replayed():
    calls = _launch.Calls("test.scaled")
    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    for k in (2, 3, 4):
        out = torch.empty_like(x)
        calls((), (x, out), lambda: _launch.launch(_scaled_kernel, (1,), x, out, 8, k, BLOCK=8), {"k": k})
        assert calls.last == ("planned: first call" if k == 2 else "planned: per-call argument 'k' is specialised on")
        torch.testing.assert_close(out, x * k)


def test_a_launch_on_a_tensor_the_call_was_not_given_plans_each_time():
    calls = _launch.Calls("test.elsewhere")
    x, elsewhere = torch.ones(8, device=DEVICE), torch.zeros(8, device=DEVICE)
    for _ in range(2):
        calls((), (x,), lambda: _launch.launch(_scaled_kernel, (1,), x, elsewhere, 8, 2, BLOCK=8))
    assert calls.last == "planned: a launch takes a tensor the call did not get or allocate"


def test_an_allocation_marked_write_only_is_the_records_own_in_each_replay_and_never_returned():
    calls = _launch.Calls("test.write_only")

    def run(x, out, give_back=False):
        scratch = _launch.write_only(torch.empty(8, device=DEVICE))  # written, read by nothing
        _launch.launch(_scaled_kernel, (1,), x, scratch, 8, 3, BLOCK=8)
        _launch.launch(_scaled_kernel, (1,), x, out, 8, 2, BLOCK=8)
        return scratch if give_back else out

    for how in ("planned: first call", "recorded", "replayed", "replayed"):
        x, out = torch.randn(8, device=DEVICE), torch.empty(8, device=DEVICE)
        assert calls((), (x, out), lambda: run(x, out)) is out and calls.last == how
        torch.testing.assert_close(out, 2 * x)
    entry = next(iter(calls.table.values()))
    kept = [a for a in entry.allocs if isinstance(a, torch.Tensor)]
    assert len(kept) == 1 and len(entry.allocs) == 1  # nothing allocated by a replay
    torch.testing.assert_close(kept[0], 3 * x)  # the last replay wrote the record's own tensor
    for _ in range(2):
        got = calls((True,), (x, out), lambda: run(x, out, give_back=True))
    assert calls.last == "planned: the call returns a tensor it marked write-only"
    torch.testing.assert_close(got, 3 * x)
    assert _launch.write_only(out) is out  # outside a record: nothing to mark


def test_work_done_unrecorded_is_not_replayed():
    calls = _launch.Calls("test.unrecorded")
    x = torch.ones(8, device=DEVICE)
    side = torch.zeros(8, device=DEVICE)
    out = torch.empty_like(x)

    def run():
        with _launch.unrecorded():  # e.g. a first call's tuning
            side.add_(1)
            _launch.launch(_scaled_kernel, (1,), side, side, 8, 2, BLOCK=8)
        _launch.launch(_scaled_kernel, (1,), x, out, 8, 2, BLOCK=8)

    for _ in range(3):  # planned, recorded, replayed
        calls((), (x, out), run)
    assert calls.last == "replayed"
    assert torch.equal(side, torch.full((8,), 6.0, device=DEVICE))  # the unrecorded part ran at the two planned calls


def test_a_torch_op_in_a_recorded_call_makes_it_plan_each_time():
    calls = _launch.Calls("test.torch_op")
    x = torch.ones(8, device=DEVICE)
    out = torch.empty_like(x)

    def run():
        out.fill_(0)
        _launch.launch(_scaled_kernel, (1,), x, out, 8, 2, BLOCK=8)

    for _ in range(2):
        calls((), (x, out), run)
    assert calls.last == "planned: torch's fill_ ran"


def test_a_library_op_a_plan_names_is_replayed_on_the_new_tensors_before_the_launch_after_it():
    calls = _launch.Calls("test.library")

    def call(a, b):
        def run():
            product = torch.empty(a.shape[0], b.shape[0], device=a.device)
            _launch.library(torch.mm, a, b.t(), out=product)  # a view of b: replayed as the same view
            out = torch.empty(product.numel(), device=a.device)
            _launch.launch(_scaled_kernel, (1,), product, out, product.numel(), 3, BLOCK=16)
            return out.view(product.shape)
        return calls((), (a, b), run)

    for how in ("planned: first call", "recorded", "replayed", "replayed"):
        a, b = torch.randn(3, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE)
        got = call(a, b)
        assert calls.last == how
        torch.testing.assert_close(got, 3 * (a @ b.t()))
    steps = next(iter(calls.table.values())).launches
    assert [type(s).__name__ for s in steps] == ["_Call", "_Relaunch" if not ON_GPU else "_Bound"]


def test_a_library_op_runs_on_inputs_that_require_grad_recorded_and_replayed():
    """A model's weight (a parameter) reaches the library's GEMM: torch refuses ``out=`` from an input that requires
    grad, so the op runs with grad off (the call's outputs take their node from the call: inference_result)."""
    calls = _launch.Calls("test.library_grad")
    w = torch.nn.Parameter(torch.randn(4, 5, device=DEVICE))

    def run(a):
        out = torch.empty(a.shape[0], 5, device=a.device)
        _launch.library(torch.mm, a, w, out=out)
        return out

    for how in ("planned: first call", "recorded", "replayed"):
        a = torch.randn(3, 4, device=DEVICE)
        got = calls((), (a, w), lambda: run(a))
        assert calls.last == how
        torch.testing.assert_close(got, (a @ w).detach())
        assert torch.is_grad_enabled() and not got.requires_grad


def test_a_library_op_on_a_tensor_the_call_was_not_given_plans_each_time():
    calls = _launch.Calls("test.library_elsewhere")
    a, elsewhere = torch.randn(2, 2, device=DEVICE), torch.randn(2, 2, device=DEVICE)
    out = torch.empty(2, 2, device=DEVICE)
    for _ in range(2):
        calls((), (a, out), lambda: _launch.library(torch.mm, a, elsewhere, out=out))
    assert calls.last == "planned: mm takes a tensor the call did not get or allocate"
    torch.testing.assert_close(out, a @ elsewhere)


class _Launcher:
    """A compiled kernel's launcher laid out as Triton 3.6's ``CudaLauncher``: ``__call__`` passes ``launch`` its flags
    and scratch (none: ``scratch`` 0), ``launch`` keeps what it gets but those instead of launching."""

    profile_scratch_size, launch_cooperative_grid, launch_pdl = 0, False, True

    def __init__(self, scratch):
        self.global_scratch_size, self.calls, self.through_call = scratch, [], 0

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: N803 - Triton's names
        self.through_call += 1
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None,
                    *args)

    def launch(self, *args):
        assert args[5:9] == (False, True, None, None)
        self.calls.append(args[:5] + args[9:])


class _FakeCompiled:
    """What a GPU's compiled kernel gives a bound replay: ``run`` (a ``_Launcher``), ``function``, ``packed_metadata``."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, scratch):
        self.run = _Launcher(scratch)


@pytest.mark.parametrize("scratch", [0, 256], ids=["direct", "through_call"])
def test_a_bound_replay_calls_the_launcher_as_triton_does_with_each_new_pointer(monkeypatch, scratch):
    # the path a GPU takes, on CPU: the record's launches bound to a launcher, which a generated replay calls; its
    # compiled launch function directly where the kernel takes no scratch
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setattr(_launch, "_INTERPRETED", False)
    monkeypatch.setattr(_launch, "_current_stream", lambda: 77)
    compiled = [_FakeCompiled(scratch), _FakeCompiled(scratch)]

    def record(x, out):
        rec = _launch._Recorder()
        with rec:
            scratch = torch.zeros(2, 16)
        desc = TensorDescriptor.from_tensor(out, [4, 4])
        rec.launches.append(("launch", _add_into_kernel, (3,), (x[1:], scratch[1], desc, 8, 2.5), {"BLOCK": 8},
                             compiled[0]))
        rec.launches.append(("copy", out[0], scratch[1, :4]))
        rec.launches.append(("launch", _scaled_kernel, (1, 2), (scratch, out, 8, 3), {"BLOCK": 16}, compiled[1]))
        return _launch._replay_of(rec, (x, out), {"k": 2.5}, (out[1:], scratch, 4, scratch[1]))

    x, out = torch.randn(24), torch.zeros(4, 4)
    entry = record(x, out)
    assert [type(s).__name__ for s in entry.launches] == ["_Bound", "_Copy", "_Bound"]
    x2, out2 = torch.randn(24), torch.zeros(4, 4)
    got_out, got_scratch, four, row = entry.run((x2, out2), {"k": 9.0})
    assert four == 4 and got_out.data_ptr() == out2[1:].data_ptr() and got_out.shape == (3, 4)
    assert row.data_ptr() == got_scratch.data_ptr() + 64 and row.shape == (16,)  # views rebuilt on the new tensors
    assert got_scratch.shape == (2, 16) and not got_scratch.any()  # allocated again, zeroed as recorded
    (first,), (second,) = compiled[0].run.calls, compiled[1].run.calls
    assert first[:9] == (3, 1, 1, 77, "function", "metadata", None, None, None)
    assert first[9] == x2.data_ptr() + 4 and first[10] == got_scratch.data_ptr() + 64  # views at their offsets
    desc = first[11]
    assert desc.base.data_ptr() == out2.data_ptr() and list(desc.block_shape) == [4, 4]  # the descriptor rebased
    assert first[12:] == (8, 9.0, 8)  # the per-call value of the do_not_specialize argument, the rest as recorded
    assert second[:3] == (1, 2, 1) and second[9:] == (got_scratch.data_ptr(), out2.data_ptr(), 8, 3, 16)
    out2[0] = 5.0
    entry.run((x2, out2), {"k": 1.0})
    assert not out2[0].any()  # the copy between the launches ran again (scratch's zeros into out's first row)
    assert compiled[0].run.through_call == (0 if scratch == 0 else 2)


# Triton 3.6's ``wrap_handle_tensordesc`` as its driver lays it out (the names a replay looks for: the closure's
# launcher, tensordesc_indices and tensordesc_meta; the module's make_tensordesc_arg and _BASE_ARGS_FORMAT_LEN)
_TRITON_36_WRAPPER = """
def wrap_handle_tensordesc(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):
        final_args = list(args[:_BASE_ARGS_FORMAT_LEN])
        tensordesc_idx = 0
        for i, arg in enumerate(args[_BASE_ARGS_FORMAT_LEN:]):
            if i in tensordesc_indices:
                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[tensordesc_idx]))
                tensordesc_idx += 1
            else:
                final_args.append(arg)
        return launcher(*final_args)
    return inner
"""


class _DescriptorLauncher(_Launcher):
    """``_Launcher`` whose ``launch`` is Triton 3.6's descriptor wrapper over the compiled launch function (``raw``),
    each descriptor encoded by a stand-in ``make_tensordesc_arg`` that keeps the addresses it encodes. ``variant``
    "another_layout": the wrapper's closure names another than 3.6's; "another_order": 3.6's names, but the
    descriptor's arguments passed in another order."""

    def __init__(self, variant):
        super().__init__(0)
        self.encoded, self.raw_calls = [], []
        driver = {"_BASE_ARGS_FORMAT_LEN": 13, "make_tensordesc_arg": self.make_tensordesc_arg}
        source = _TRITON_36_WRAPPER
        if variant == "another_layout":
            source = source.replace("tensordesc_meta", "metas")
        elif variant == "another_order":
            source = source.replace("tensordesc_meta[tensordesc_idx]))", "tensordesc_meta[tensordesc_idx])[::-1])")
        exec(source, driver)  # noqa: S102 - the test's own text
        self.launch = driver["wrap_handle_tensordesc"](self.raw, {2}, [{"meta": 5}])

    def make_tensordesc_arg(self, desc, meta):
        self.encoded.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape), meta["meta"]), *desc.shape, *desc.strides]

    def raw(self, *args):
        self.raw_calls.append(args)


@pytest.mark.parametrize("variant", ["triton_36", "another_layout", "another_order"])
def test_a_bound_replay_encodes_a_descriptor_once_an_address_beneath_triton_36s_wrapper(monkeypatch, variant):
    # Triton 3.6 re-encodes every TMA descriptor on every launch through a Python wrapper (docs/kernels.md, "Host time
    # a call"): a replay calls the launch function under it with the arguments the wrapper would give, an address
    # encoded once, where the wrapper, run once at stand-in addresses, gives what the replay would; under a wrapper
    # laid out otherwise, or passing other arguments, it goes through the wrapper, which encodes each launch
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setattr(_launch, "_INTERPRETED", False)
    monkeypatch.setattr(_launch, "_current_stream", lambda: 77)
    compiled = _FakeCompiled(0)
    compiled.run = run = _DescriptorLauncher(variant)
    x, out, out2 = torch.randn(24), torch.zeros(4, 4), torch.zeros(4, 4)
    rec = _launch._Recorder()
    rec.launches.append(("launch", _add_into_kernel, (3,), (x, x, TensorDescriptor.from_tensor(out, [4, 4]), 8, 2.5),
                         {"BLOCK": 8}, compiled))
    entry = _launch._replay_of(rec, (x, out), {}, out)
    assert entry.launches[0].descriptors[0][3].base.__class__ is _launch._Address  # no tensor of the call held
    probed = [a for a in run.encoded if a >= _launch._STAND_IN]  # the wrapper's check: its encoding and the replay's
    assert len(probed) == (0 if variant == "another_layout" else 2) and len(run.encoded) == len(probed)
    for o in (out, out2, out):
        assert entry.run((x, o), {}) is o
    assert len(run.raw_calls) == 3  # the wrapper's check launched nothing
    for o, call in zip((out, out2, out), run.raw_calls):
        described = [("map", o.data_ptr(), (4, 4), 5), 4, 4, 4, 1]
        if variant == "another_order":
            described = described[::-1]
        assert call == (3, 1, 1, 77, "function", False, True, None, None, "metadata", None, None, None, x.data_ptr(),
                        x.data_ptr(), *described, 8, 2.5, 8)  # what the wrapper gives the launch function
    kept = variant == "triton_36"
    assert run.encoded[len(probed):] == [out.data_ptr(), out2.data_ptr()] + ([] if kept else [out.data_ptr()])


# --------------------------------------------------------------------------- on a GPU: the bound launches


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(6, 100), (300, 4096), (64, 30522)], ids=["narrow", "4096", "vocab"])
def test_on_a_gpu_replays_launch_through_the_compiled_kernels_and_match_planned_calls_bit_for_bit(dtype, shape):
    rows, cols = shape
    for name, calls, call in _calls(dtype, rows, cols):
        _assert_replays_match_planned_calls(name, calls, call)
        entry = next(iter(calls.table.values()))  # each launch bound to its compiled kernel; a plan's library op
        assert entry.launches and all(isinstance(one, (_launch._Bound, _launch._Call)) for one in entry.launches), name
        assert any(isinstance(one, _launch._Bound) for one in entry.launches) or name == "gemm_epilogue", name


@pytest.mark.gpu
def test_on_a_gpu_a_replay_captured_in_a_cuda_graph_replays_with_the_graph():
    x = torch.randn(64, 4096, device="cuda")
    for _ in range(3):
        y = softmax.fused(x)
    assert softmax.CALLS.last == "replayed"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = softmax.fused(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=1e-6, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("plan", ["held", "split"])
def test_on_a_gpu_rows_in_slices_replay_their_counters_and_partials_from_kept_scratch_per_stream_not_in_a_graph(
        monkeypatch, plan):
    from reference_kernels import _device

    x = torch.randn(8, 128256 if plan == "held" else 262144, device="cuda")
    x = x.bfloat16() if plan == "held" else x
    max_row = None if plan == "held" else 16384
    p = softmax.plan(*x.shape, x.element_size(), _device.of(x.device), max_row=max_row)
    assert p.mode == plan and p.group > 1, p
    # the counters (9 of 128 bytes) a pool of two slices, zeroed every other call
    monkeypatch.setattr(_launch, "_KEPT_BYTES", 2 * _launch._rounded(9 * 128))
    want = _planned(lambda: softmax.fused(x, max_row=max_row))

    def check(y):
        torch.cuda.synchronize()
        torch.testing.assert_close(y, want, atol=0, rtol=0)

    for _ in range(8):
        check(softmax.fused(x, max_row=max_row))
    assert softmax.CALLS.last == "replayed"
    (entry,) = softmax.CALLS.table.values()
    kept = [a for a in entry.allocs if isinstance(a, _launch._Scratch)]
    assert [k.made[4] for k in kept] == [False, True] and all(len(k.kept) == 1 for k in kept)  # partials; counters
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y = softmax.fused(x, max_row=max_row)
    torch.cuda.current_stream().wait_stream(side)
    check(y)
    assert all(len(k.kept) == 2 for k in kept)  # the side stream's own
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = softmax.fused(x, max_row=max_row)
    assert softmax.CALLS.last == "replayed" and all(len(k.kept) == 2 for k in kept)  # the capture's made as recorded
    for _ in range(3):
        graph.replay()
        check(y)
        check(softmax.fused(x, max_row=max_row))


def test_calls_recorded_on_two_threads_at_once_keep_their_own_launches():
    import threading

    calls = _launch.Calls("test.threads")
    barrier = threading.Barrier(2)
    results = {}

    def call(k):
        x = torch.full((8,), float(k), device=DEVICE)
        out = torch.empty_like(x)

        def run():
            barrier.wait()  # both calls are recording (the second time) before either launches
            _launch.launch(_scaled_kernel, (1,), x, out, 8, 2, BLOCK=8)
            barrier.wait()

        for _ in range(2):  # planned, then recorded
            calls((k,), (x, out), run)
        results[k] = calls.table[((k,), _launch._slot_key((x, out)))]

    threads = [threading.Thread(target=call, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(results[k].launches) == 1 for k in (1, 2))  # each record holds its own thread's launch


def _layouts(dtype):
    """Inputs of one (4, 6, 40) problem in the layouts users pass: (name, make(seed) -> tensor). Leading dims that do
    not flatten cost the kernels a copy (``as_rows``), which the replays make too."""
    def rand(i, *shape):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(i)).to(dtype).to(DEVICE)

    return [
        ("3-D", lambda i: rand(i, 4, 6, 40)),
        ("rows of a wider tensor", lambda i: rand(i, 24, 48)[:, :40]),
        ("transposed leading dims", lambda i: rand(i, 6, 4, 40).transpose(0, 1)),
        ("one element past an aligned address", lambda i: rand(i, 24 * 40 + 1)[1:].view(24, 40)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", range(4), ids=["3d", "row_slice", "transposed", "misaligned"])
def test_replays_match_planned_calls_bit_for_bit_in_every_layout_users_pass(dtype, layout):
    _, make = _layouts(dtype)[layout]
    n = make(0).shape[-1]
    w, b = torch.randn(n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    subjects = [(softmax.CALLS, lambda x: (softmax.fused(x),)),
                (layer_norm.FORWARD_CALLS, lambda x: layer_norm.forward(x, w, b)),
                (bias_gelu_dropout.CALLS, lambda x: (bias_gelu_dropout.fused(x.contiguous(), b, 0.2, seed=5),))]
    for calls, call in subjects:  # make(i) is the same tensor for the same seed: the planned call sees it again
        _assert_replays_match_planned_calls(calls.name, calls, lambda i, call=call: call(make(i)))
