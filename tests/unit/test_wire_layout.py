"""The push layout: which tensors travel alone, how the rest are packed (aligned, by dtype), and the byte views."""

import torch

from coati.distributed.wire_layout import as_bytes, destination, pack_into, plan_transfers, unpack, wire_bytes


def test_large_tensors_travel_alone_and_small_ones_are_packed_aligned_by_dtype():
    d = {
        "a": torch.arange(300, dtype=torch.float32),  # 1200 B >= direct_bytes: alone
        "b": torch.arange(3, dtype=torch.float32),  # 12 B
        "c": torch.arange(5, dtype=torch.bfloat16),  # 10 B, sorts first (bfloat16 < float32)
        "d": torch.arange(4, dtype=torch.float32),  # 16 B: does not fit the 32 B bucket after b
        "step": 3,
    }
    s = plan_transfers(d, bucket_bytes=32, direct_bytes=1000)
    assert s.sizes == (28, 1200, 16) and s.direct == (False, True, False)
    assert [(e.key, e.transfer, e.offset) for e in s.entries] == [("c", 0, 0), ("a", 1, 0), ("b", 0, 16), ("d", 2, 0)]
    assert s.extras == {"step": 3}
    buf = torch.empty(s.sizes[0], dtype=torch.uint8)
    pack_into(buf, s.transfer_entries()[0], d, torch.device("cpu"))
    out = unpack(s.transfer_entries()[0], buf)
    assert torch.equal(out["b"], d["b"]) and torch.equal(out["c"], d["c"]) and out["c"].dtype == torch.bfloat16


def test_byte_views_share_storage_unless_a_copy_is_needed():
    t = torch.randn(4, 6)
    assert as_bytes(t).data_ptr() == t.data_ptr() and as_bytes(t).numel() == 96
    assert wire_bytes(t, torch.device("cpu")).data_ptr() == t.data_ptr()
    strided = t.t()
    moved = wire_bytes(strided, torch.device("cpu"))
    assert moved.data_ptr() != t.data_ptr()
    assert torch.equal(moved.view(torch.float32).view(6, 4), strided)


def test_destination_only_when_shape_dtype_device_and_layout_match():
    s = plan_transfers({"w": torch.zeros(10, 10)}, bucket_bytes=1 << 20, direct_bytes=0)
    (entry,) = s.entries
    cpu = torch.device("cpu")
    assert destination(entry, {"w": torch.nn.Parameter(torch.ones(10, 10))}, cpu) is not None
    for wrong in [torch.ones(10, 10, dtype=torch.float64), torch.ones(100), torch.ones(10, 10).t()]:
        assert destination(entry, {"w": wrong}, cpu) is None
    assert destination(entry, {}, cpu) is None
