"""Ops that touch part of a tensor (docs/bytes.md, "Ops that touch part of a tensor"):
fills write only, losses read what they gather, scatters and index writes touch what
they index. Each figure is checked against the arithmetic of its rule, on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pytest_fusioncheck.ops import op_traffic


def _traffic(op, *args, **kwargs):
    out = op(*args, **kwargs)
    return op_traffic(op, args, kwargs, out)


def test_fills_and_random_fills_write_their_tensor_and_read_nothing():
    x = torch.empty(1000, 64)
    for op, extra in ((torch.ops.aten.zero_.default, ()), (torch.ops.aten.fill_.Scalar, (1.0,)), (torch.ops.aten.uniform_.default, ())):
        assert _traffic(op, x, *extra) == (0, 1000 * 64 * 4), op


def test_a_copy_reads_its_source_and_writes_its_destination_once():
    dst, src = torch.empty(256, 256), torch.randn(256, 256).t()
    assert _traffic(torch.ops.aten.copy_.default, dst, src) == (256 * 256 * 4, 256 * 256 * 4)


def test_foreach_zero_writes_every_tensor_of_its_list_and_reads_none():
    grads = [torch.ones(100), torch.ones(20, 5)]
    assert _traffic(torch.ops.aten._foreach_zero_.default, grads) == (0, 200 * 4)


def test_nll_loss_reads_its_targets_and_one_log_probability_per_target():
    logp = torch.randn(8192, 50257).log_softmax(-1)[:64]  # 64 rows of a wide vocabulary
    target = torch.randint(0, 50257, (64,))
    reads, writes = _traffic(torch.ops.aten.nll_loss_forward.default, logp, target, None, 1, -100)
    assert reads == 64 * 8 + 64 * 4  # targets (int64) + one float per target, not 64 x 50257
    assert writes == 4 + 4  # the loss and the total weight


def test_nll_loss_backward_writes_a_full_gradient_without_reading_the_input():
    logp = torch.randn(64, 1000)
    target = torch.randint(0, 1000, (64,))
    grad_out, total = torch.tensor(1.0), torch.tensor(64.0)
    reads, writes = _traffic(torch.ops.aten.nll_loss_backward.default, grad_out, logp, target, None, 1, -100, total)
    assert reads == 4 + 64 * 8 + 4
    assert writes == 64 * 1000 * 4


def test_index_add_scatter_add_and_accumulating_index_put_read_and_write_the_rows_they_touch():
    source, index = torch.randn(10, 64), torch.arange(10)
    rows = 10 * 64 * 4
    target = torch.zeros(1000, 64)  # 1000 rows: only 10 are touched
    assert _traffic(torch.ops.aten.index_add_.default, target, 0, index, source) == (80 + rows + rows, rows)
    scatter_index = index[:, None].expand(10, 64)  # an expanded index: its 80 bytes exist once
    assert _traffic(torch.ops.aten.scatter_add_.default, target, 0, scatter_index, source) == (80 + rows + rows, rows)
    assert _traffic(torch.ops.aten.index_put_.default, target, (index,), source, True) == (80 + rows + rows, rows)


def test_a_plain_scatter_and_index_put_write_what_they_touch_without_reading_it():
    target, index = torch.zeros(1000, 64), torch.arange(10)
    values = torch.randn(10, 64)
    assert _traffic(torch.ops.aten.index_put_.default, target, (index,), values, False) == (80 + 2560, 2560)
    scatter_index = torch.zeros(1, 64, dtype=torch.long)
    assert _traffic(torch.ops.aten.scatter_.value, target, 0, scatter_index, 2.0) == (64 * 8, 64 * 4)


def test_an_index_put_over_a_leading_index_counts_the_whole_trailing_rows():
    target = torch.zeros(8, 100, 16)
    index = torch.tensor([1, 3])
    # target[:, index] = values: 8 x 2 rows of 16 floats
    values = torch.ones(8, 2, 16)
    reads, writes = _traffic(torch.ops.aten.index_put_.default, target, (None, index), values, False)
    assert writes == 8 * 2 * 16 * 4 and reads == 16 + 8 * 2 * 16 * 4


def test_embedding_bag_reads_one_table_row_per_index():
    table = torch.randn(50000, 64)
    indices, offsets = torch.randint(0, 50000, (20,)), torch.tensor([0, 10])
    out = F.embedding_bag(indices, table, offsets)
    reads, _ = op_traffic(torch.ops.aten._embedding_bag_forward_only.default, (table, indices, offsets), {}, out)
    assert reads == 20 * 8 + 2 * 8 + 20 * 64 * 4  # indices, offsets, 20 rows: not the 12.8 MB table


def test_touched_parts_chain_with_later_readers_of_the_same_storage():
    from pytest_fusioncheck.budget import Touched, bytes_by_storage, storage_key

    target = torch.zeros(1000, 64)
    assert bytes_by_storage([Touched(target, 640)]) == {storage_key(target): 640 * 4}
    assert bytes_by_storage([Touched(target, 10**9)]) == {storage_key(target): target.numel() * 4}  # capped at the tensor
