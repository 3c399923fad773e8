"""The push layout: which tensors travel alone, how the rest are packed (aligned, by dtype), and the byte views."""

import pytest
import torch

from coati.distributed.transport.wire_layout import (
    as_bytes,
    cast_for_wire,
    destination,
    flatten_parameters,
    pack_into,
    plan_transfers,
    separate_storages,
    span_bytes,
    unpack,
    wire_bytes,
)


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
    cpu = torch.device("cpu")
    (entries,) = s.transfer_entries()
    assert destination(entries, 400, {"w": torch.nn.Parameter(torch.ones(10, 10))}, cpu) is not None
    for wrong in [torch.ones(10, 10, dtype=torch.float64), torch.ones(100), torch.ones(10, 10).t()]:
        assert destination(entries, 400, {"w": wrong}, cpu) is None
    assert destination(entries, 400, {}, cpu) is None


class Layers(torch.nn.Module):
    """Big and small parameters interleaved, as in a transformer (big weight, small norm, per layer), plus a bf16
    one and a tied (shared) parameter."""

    def __init__(self, layers=4, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for i in range(layers):
            self.register_parameter(f"w{i}", torch.nn.Parameter(torch.randn(16, 16, generator=g)))  # 1 KiB
            self.register_parameter(f"n{i}", torch.nn.Parameter(torch.randn(3, generator=g)))  # 12 B: gap after
        self.h = torch.nn.Parameter(torch.randn(64, 16, generator=g).to(torch.bfloat16))
        self.tied = self.w0

    def weights(self):
        return dict(self.named_parameters())


def test_flatten_keeps_values_identity_and_ties_and_survives_an_optimizer_step():
    m, want = Layers(), Layers()
    params = list(m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    assert flatten_parameters(m) == 2  # one fp32 buffer, one bf16
    assert list(m.parameters()) == params and m.tied is m.w0
    for k, v in want.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    storages = {p.untyped_storage().data_ptr() for p in m.parameters()}
    assert len(storages) == 2
    assert all(p.data_ptr() % 64 == 0 for p in m.parameters())
    sum(p.float().sum() for p in m.parameters()).backward()
    opt.step()  # updates in place: the parameters stay in the flat buffers
    assert {p.untyped_storage().data_ptr() for p in m.parameters()} == storages
    assert torch.equal(m.w1.detach(), want.w1.detach() - 0.1)


def test_chunks_bound_each_flat_buffer():
    m = Layers()
    # 1088 aligned bytes per layer: two layers overflow 2048, so each layer's pair gets a buffer; bf16 one more.
    assert flatten_parameters(m, chunk_bytes=2048) == 5
    assert max(p.untyped_storage().nbytes() for p in m.parameters() if p.dtype == torch.float32) == 1088


def test_flat_weights_travel_in_spans_received_in_place_only_where_the_layout_matches():
    sender, flat_receiver, plain_receiver = Layers(), Layers(seed=1), Layers(seed=1)
    flatten_parameters(sender)
    flatten_parameters(flat_receiver)
    weights = sender.weights()
    s = plan_transfers(weights, bucket_bytes=1 << 20, direct_bytes=1024)
    # fp32: every weight starts the span and the 12-byte norm after it joins; the 52-byte gap that follows (64-byte
    # alignment) ends the span, so each layer is one transfer; bf16 is one more.
    assert s.direct == (True,) * 5
    assert [[e.key for e in t] for t in s.transfer_entries()][:2] == [["h"], ["w0", "n0"]]
    cpu = torch.device("cpu")
    for entries, size in zip(s.transfer_entries(), s.sizes, strict=True):
        src = span_bytes(entries, weights, size, cpu)
        assert src.data_ptr() == weights[entries[0].key].data_ptr()  # no copy on the sender
        dest = destination(entries, size, flat_receiver.weights(), cpu)
        assert dest is not None and dest.data_ptr() == flat_receiver.weights()[entries[0].key].data_ptr()
        dest.copy_(src)
        assert (destination(entries, size, plain_receiver.weights(), cpu) is None) == (len(entries) > 1)
        received = unpack(entries, src.clone())
        for e in entries:
            assert torch.equal(received[e.key], weights[e.key])
    for k, v in weights.items():
        assert torch.equal(flat_receiver.weights()[k], v), k


def test_a_push_cast_for_a_bf16_engine_is_the_cast_weights_laid_out_as_the_engine_flattens_them():
    sender, engine = Layers(), Layers(seed=1)
    flatten_parameters(sender)
    engine.to(torch.bfloat16)  # an engine holding bf16 weights, flattened as a transformers producer holds them
    flatten_parameters(engine)
    weights = {**sender.weights(), "step": torch.tensor(7)}
    cast = cast_for_wire(weights, torch.bfloat16)
    assert cast["h"] is weights["h"] and cast["step"] is weights["step"]  # already bf16, not floating: as they are
    for k in ("w0", "n0", "w3", "n3"):
        assert cast[k].dtype == torch.bfloat16 and torch.equal(cast[k], weights[k].to(torch.bfloat16)), k
    assert len({cast[k].untyped_storage().data_ptr() for k in ("w0", "n3")}) == 1  # one flat buffer
    assert weights["w0"].dtype == torch.float32  # the trainer's weights are untouched
    cpu = torch.device("cpu")
    s = plan_transfers(cast, bucket_bytes=1 << 20, direct_bytes=256)
    received = {k: v for k, v in engine.weights().items()}
    for entries, size, direct in zip(s.transfer_entries(), s.sizes, s.direct, strict=True):
        if not direct:
            continue
        dest = destination(entries, size, received, cpu)  # the engine's own flat buffer, at the same offsets
        assert dest is not None, [e.key for e in entries]
        dest.copy_(span_bytes(entries, cast, size, cpu))
    for k in ("w0", "n0", "w1", "n1", "w2", "n2", "w3", "n3"):
        assert torch.equal(engine.weights()[k], weights[k].to(torch.bfloat16)), k
    assert cast_for_wire(weights, None) is weights and cast_for_wire(cast, torch.bfloat16) is cast


def test_spans_are_capped_at_the_bucket_size():
    m = torch.nn.Module()
    for i in range(5):
        m.register_parameter(f"w{i}", torch.nn.Parameter(torch.randn(64)))  # 256 B each, back to back
    flatten_parameters(m)
    for direct_bytes in (256, 10_000):  # a run goes as a span even when each of its tensors is small
        s = plan_transfers(dict(m.named_parameters()), bucket_bytes=600, direct_bytes=direct_bytes)
        assert s.sizes == (512, 512, 256) and s.direct == (True, True, True)
    separate = {f"w{i}": torch.randn(64) for i in range(5)}
    s = plan_transfers(separate, bucket_bytes=600, direct_bytes=10_000)  # no run: packed, two per bucket
    assert s.sizes == (512, 512, 256) and s.direct == (False, False, False)


@pytest.mark.parametrize("flat", [False, True])
def test_unflattened_or_flattened_plans_carry_every_tensor_once(flat):
    m = Layers()
    if flat:
        flatten_parameters(m)
    s = plan_transfers(m.weights(), bucket_bytes=1 << 20, direct_bytes=1024)
    assert sorted(e.key for e in s.entries) == sorted(m.weights())


def test_separate_storages_lets_torch_save_write_one_parameter_alone(tmp_path):
    m = Layers()
    flatten_parameters(m)
    torch.save(m.w2, tmp_path / "view.pt")  # torch.save writes the view's whole flat buffer
    with separate_storages(m):
        torch.save(m.w2, tmp_path / "own.pt")
        m.w1.data.fill_(7.0)  # written inside the block: kept after it
    assert (tmp_path / "view.pt").stat().st_size > (tmp_path / "own.pt").stat().st_size + 3 * 1024
    assert torch.equal(torch.load(tmp_path / "own.pt"), m.w2)
    assert len({p.untyped_storage().data_ptr() for p in m.parameters()}) == 2 and bool((m.w1 == 7).all())
