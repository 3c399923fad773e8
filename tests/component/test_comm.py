"""Weight transport with real Ray actors on CPU: isolated gloo groups, bitwise round trips, timeouts."""

import time
import uuid

import pytest
import ray
import torch

from coati.distributed.runtime.placement import free_port
from coati.distributed.transport import CollectiveError
from tests.helpers import wait_until


class PeerBase:
    def __init__(self):
        torch.set_num_threads(1)
        self.received = []

    def init_default_world(self, rank, world_size, port):
        """Start a torch.distributed default world, as ColossalAI does in a consumer."""
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        return dist.get_world_size()

    def default_allreduce(self, value):
        import torch.distributed as dist

        t = torch.tensor([float(value)])
        dist.all_reduce(t)
        return t.item()

    def join(self, world_size, rank, group, timeout_s=60.0):
        from coati.distributed.transport import init_group

        init_group(world_size, rank, group, timeout_s=timeout_s)
        return True

    def join_rays_gloo(self, group, rank):
        import ray.util.collective as cc

        cc.init_collective_group(2, rank, backend="gloo", group_name=group)
        return True

    def push(self, group, tensors, version=0, bucket_bytes=1 << 20, direct_bytes=1 << 20, flat=False):
        """Push ``tensors`` (from flat buffers when ``flat``); return the version and the number of transfers."""
        from coati.distributed.transport.push import _sent_schema, ray_broadcast_tensor_dict

        tensors = flat_copy(tensors) if flat else tensors
        out = ray_broadcast_tensor_dict(
            tensors, 0, group_name=group, version=version, bucket_bytes=bucket_bytes, direct_bytes=direct_bytes
        )
        return out.version, len(_sent_schema[group][1].sizes)

    def pull_into(self, group, destinations, stream, flat=False):
        """Receive with ``into=destinations`` (moved into flat buffers when ``flat``); report which tensors landed
        in their destination's storage."""
        from coati.distributed.transport import ray_broadcast_tensor_dict

        destinations = flat_copy(destinations) if flat else destinations
        ptrs = {k: v.data_ptr() for k, v in destinations.items()}
        streamed = {}
        out = ray_broadcast_tensor_dict(
            None,
            0,
            group_name=group,
            into=destinations,
            on_bucket=(lambda b: streamed.update({k: v.clone() for k, v in b.items()})) if stream else None,
        )
        got = {**dict(out), **streamed}
        if stream:  # what landed in place is neither streamed nor returned
            in_place = sorted(k for k in destinations if k not in got)
            got.update({k: destinations[k] for k in in_place})
        else:  # returned as the destination tensor itself
            in_place = sorted(k for k, v in got.items() if k in ptrs and v.data_ptr() == ptrs[k])
        return {
            "tensors": got,
            "in_place": in_place,
            "streamed": sorted(streamed),
            "returned": sorted(out),
            "in_place_bytes": out.in_place_bytes,
        }

    def pull(self, group, bucket_bytes=1 << 20, stream=False):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        buckets = []
        out = ray_broadcast_tensor_dict(
            None,
            0,
            group_name=group,
            bucket_bytes=bucket_bytes,
            on_bucket=(lambda b: buckets.append({k: v.clone() for k, v in b.items()})) if stream else None,
        )
        result = dict(out)
        for b in buckets:
            result.update(b)
        return {"version": out.version, "tensors": result, "num_buckets": len(buckets), "keys": list(out)}

    def object(self, group, obj=None):
        from coati.distributed.transport import ray_broadcast_object

        return ray_broadcast_object(obj, 0, group_name=group)

    def pull_timed(self, group):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        start = time.monotonic()
        try:
            ray_broadcast_tensor_dict(None, 0, group_name=group)
            return ("ok", time.monotonic() - start)
        except CollectiveError as e:
            return (str(e), time.monotonic() - start)

    def push_timed(self, group, tensors):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        start = time.monotonic()
        try:
            ray_broadcast_tensor_dict(tensors, 0, group_name=group)
            return ("ok", time.monotonic() - start)
        except CollectiveError as e:
            return (str(e), time.monotonic() - start)


Peer = ray.remote(num_cpus=0.1)(PeerBase)


def flat_copy(tensors):
    """``tensors`` moved into flat buffers (``flatten_parameters``) under the same names; non-tensors kept."""
    from coati.distributed.transport.wire_layout import flatten_parameters

    module = torch.nn.Module()
    keys = [k for k, v in tensors.items() if isinstance(v, torch.Tensor)]
    for i, k in enumerate(keys):
        module.register_parameter(f"p{i}", torch.nn.Parameter(tensors[k].clone(), requires_grad=False))
    flatten_parameters(module)
    return {**tensors, **{k: getattr(module, f"p{i}").data for i, k in enumerate(keys)}}


def sample_dict():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return {
        "fp32": torch.randn(7, 3, generator=g),
        "bf16": torch.randn(4, 9, generator=g).to(torch.bfloat16),
        "fp16": torch.randn(11, generator=g).to(torch.float16),
        "int64": torch.randint(-(2**40), 2**40, (5, 2), generator=g),
        "scalar": torch.tensor(3.25),
        "non_contiguous": base.t(),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "step": 17,  # a non-tensor value travels with the schema
    }


def as_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_bitwise_equal(got, want):
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(as_bytes(got[k]), as_bytes(v)), k
        else:
            assert got[k] == v, k


def new_group():
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def topology(ray_cluster):
    """Two consumers in their own torch.distributed world; consumer 0 feeds two producers that also share a group."""
    consumers = [Peer.remote() for _ in range(2)]
    producers = [Peer.remote() for _ in range(2)]
    try:  # killed however the set-up ends: a left actor holds its CPUs for the rest of the session
        port = free_port()
        assert ray.get([c.init_default_world.remote(i, 2, port) for i, c in enumerate(consumers)]) == [2, 2]
        weights, data = new_group(), new_group()
        ray.get(
            [consumers[0].join.remote(3, 0, weights)]
            + [p.join.remote(3, i + 1, weights) for i, p in enumerate(producers)]
        )
        ray.get([p.join.remote(2, i, data) for i, p in enumerate(producers)])
        yield consumers, producers, weights, data
    finally:
        for a in consumers + producers:
            ray.kill(a)


def broadcast(sender, receivers, group, tensors, **kw):
    stream = kw.pop("stream", False)
    refs = [sender.push.remote(group, tensors, **kw)]
    refs += [r.pull.remote(group, kw.get("bucket_bytes", 1 << 20), stream) for r in receivers]
    out = ray.get(refs, timeout=120)
    return out[0][0], out[1:]


def test_bitwise_round_trip_beside_a_default_world(topology):
    consumers, producers, weights, data = topology
    tensors = sample_dict()
    version, received = broadcast(consumers[0], producers, weights, tensors, version=5)
    assert version == 5
    for r in received:
        assert r["version"] == 5
        assert_bitwise_equal(r["tensors"], tensors)
    # The consumers' own torch.distributed world still works, and so does the producers' second group.
    assert ray.get([c.default_allreduce.remote(i + 1) for i, c in enumerate(consumers)]) == [3.0, 3.0]
    other = {"x": torch.arange(4)}
    _, got = broadcast(producers[0], producers[1:], data, other)
    assert torch.equal(got[0]["tensors"]["x"], other["x"])


def test_empty_dict_and_schema_changes(topology):
    consumers, producers, weights, _ = topology
    _, got = broadcast(consumers[0], producers, weights, {}, version=1)
    assert all(r["tensors"] == {} and r["version"] == 1 for r in got)
    first = {"a": torch.ones(3), "b": torch.zeros(2, dtype=torch.int64)}
    second = {"a": torch.full((3,), 2.0), "b": torch.ones(2, dtype=torch.int64)}  # same schema, new values
    changed = {"a": torch.ones(4, dtype=torch.bfloat16), "c": torch.tensor(1.5)}  # new schema
    for i, d in enumerate([first, second, changed, first]):
        _, got = broadcast(consumers[0], producers, weights, d, version=10 + i)
        for r in got:
            assert r["version"] == 10 + i
            assert_bitwise_equal(r["tensors"], d)


def test_streamed_buckets(topology):
    consumers, producers, weights, _ = topology
    tensors = {f"w{i}": torch.randn(100, 10) for i in range(10)}  # 4 kB each
    _, got = broadcast(consumers[0], producers, weights, tensors, bucket_bytes=10_000, stream=True)
    for r in got:
        assert r["num_buckets"] == 5  # two 4000-byte tensors (16-byte aligned) per 10 kB bucket
        assert r["keys"] == []  # nothing kept beside what the callback took
        assert_bitwise_equal(r["tensors"], tensors)


@pytest.mark.parametrize("stream", [False, True], ids=["returned", "streamed"])
def test_large_tensors_land_in_their_destinations(topology, stream):
    consumers, producers, weights, _ = topology
    g = torch.Generator().manual_seed(1)
    tensors = {
        "big": torch.randn(64, 32, generator=g),  # 8 kB: sent alone
        "big_bf16": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "big_strided": torch.randn(40, 60, generator=g).t(),  # non-contiguous source: one copy on the sender
        "wrong_dtype": torch.randn(50, 50, generator=g),
        "no_destination": torch.randn(70, 40, generator=g),
        "small": torch.randn(3, generator=g),  # bucketed
        "step": 3,
    }
    destinations = {
        "big": torch.zeros(64, 32),
        "big_bf16": torch.zeros(64, 64, dtype=torch.bfloat16),
        "big_strided": torch.zeros(60, 40),
        "wrong_dtype": torch.zeros(50, 50, dtype=torch.float16),
        "small": torch.zeros(3),
    }
    refs = [consumers[0].push.remote(weights, tensors, direct_bytes=4096)]
    refs += [p.pull_into.remote(weights, destinations, stream) for p in producers]
    _, *received = ray.get(refs, timeout=120)
    for r in received:
        assert r["in_place"] == ["big", "big_bf16", "big_strided"]
        assert r["in_place_bytes"] == sum(tensors[k].numel() * tensors[k].element_size() for k in r["in_place"])
        assert_bitwise_equal(r["tensors"], tensors)
        if stream:
            assert r["streamed"] == ["no_destination", "small", "wrong_dtype"] and r["returned"] == ["step"]


@pytest.mark.parametrize("sender_flat,receiver_flat", [(True, True), (True, False), (False, True)])
def test_flat_weights_travel_in_spans(topology, sender_flat, receiver_flat):
    """Weights in flat buffers on the sender go as one transfer per run of back-to-back tensors; a receiver laid out
    alike takes each run in place, any other receiver gets the same bytes through a buffer."""
    consumers, producers, weights, _ = topology
    g = torch.Generator().manual_seed(2)
    tensors = {}
    for i in range(6):
        tensors[f"layer{i}.w"] = torch.randn(32, 32, generator=g)  # 4 KiB: direct
        tensors[f"layer{i}.norm"] = torch.randn(32, generator=g)  # 128 B: joins the span when flat, else bucketed
    tensors["head"] = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    destinations = {k: torch.zeros_like(v) for k, v in tensors.items()}
    refs = [consumers[0].push.remote(weights, tensors, direct_bytes=4096, flat=sender_flat)]
    refs += [p.pull_into.remote(weights, destinations, True, receiver_flat) for p in producers]
    (_, transfers), *received = ray.get(refs, timeout=120)
    assert transfers == (2 if sender_flat else 8)  # one fp32 span and bf16; or 7 tensors alone and one bucket
    for r in received:
        assert_bitwise_equal(r["tensors"], tensors)
        if sender_flat and receiver_flat:
            assert r["in_place"] == sorted(tensors)
        elif sender_flat:
            assert r["in_place"] == ["head"] and len(r["streamed"]) == 12
        else:
            assert r["in_place"] == sorted(k for k in tensors if not k.endswith("norm"))


def test_broadcast_object(topology):
    consumers, producers, weights, _ = topology
    obj = {"config": [1, 2, {"x": "y"}], "n": None}
    out = ray.get([consumers[0].object.remote(weights, obj)] + [p.object.remote(weights) for p in producers])
    assert out == [obj, obj, obj]


def _dead(actor) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=1)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        pass
    return False


def test_dead_peer_gives_named_error_within_timeout(ray_cluster):
    sender, alive, doomed = Peer.remote(), Peer.remote(), Peer.remote()
    group = new_group()
    ray.get([a.join.remote(3, i, group, 5.0) for i, a in enumerate([sender, alive, doomed])])
    ray.kill(doomed)
    wait_until(lambda: _dead(doomed), 10, "the killed peer's death")
    big = {"w": torch.randn(1 << 20)}
    msg, elapsed = ray.get(sender.push_timed.remote(group, big), timeout=60)
    assert group in msg and "rank 0/3" in msg, msg
    assert elapsed < 5.0 + 2.0
    msg2, elapsed2 = ray.get(alive.pull_timed.remote(group), timeout=60)
    assert msg2 != "ok" and group in msg2 and "rank 1/3" in msg2, msg2
    assert elapsed2 < 5.0 + 2.0
    for a in (sender, alive):
        ray.kill(a)


def test_missing_peer_times_out_at_rendezvous(ray_cluster):
    lonely = Peer.remote()
    ray.get(lonely.__ray_ready__.remote(), timeout=120)  # the actor's own start-up is not the rendezvous's time
    start = time.monotonic()
    with pytest.raises(ray.exceptions.RayTaskError, match="did not publish its address"):
        ray.get(lonely.join.remote(2, 1, new_group(), 2.0), timeout=60)
    assert time.monotonic() - start < 10
    ray.kill(lonely)


def test_groups_on_rays_own_gloo_backend(ray_cluster):
    """A group made with Ray's built-in gloo backend (as a user's own code might) carries the same pushes, flat
    spans and buckets included, through the synchronous path."""
    sender, receiver = Peer.remote(), Peer.remote()
    group = new_group()

    def join(peer, rank):
        return peer.join_rays_gloo.remote(group, rank)

    ray.get([join(sender, 0), join(receiver, 1)], timeout=120)
    tensors = sample_dict()
    tensors.update({f"w{i}": torch.randn(32, 32) for i in range(3)})
    try:
        for flat in (False, True):
            (_, transfers), got = ray.get(
                [sender.push.remote(group, tensors, direct_bytes=4096, flat=flat), receiver.pull.remote(group)],
                timeout=120,
            )
            assert_bitwise_equal(got["tensors"], tensors)
            assert transfers == (2 if flat else 4)  # the weights as one span, or alone; the rest in a bucket
    finally:
        for a in (sender, receiver):
            ray.kill(a)


class GpuPeerBase(PeerBase):
    def join_cuda(self, world_size, rank, group):
        from coati.distributed.transport import init_group

        torch.cuda.set_device(0)
        init_group(world_size, rank, group, backend="nccl", timeout_s=60)
        return True

    def push_cuda(self, group, tensors, version=0):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        cuda = {k: v.cuda() for k, v in tensors.items()}
        return ray_broadcast_tensor_dict(cuda, 0, "cuda", group, version=version, direct_bytes=64).version

    def group_device(self, group):
        import ray.util.collective as cc

        return str(cc.collective.get_group_handle(group).device)

    def pull_cuda(self, group):
        from coati.distributed.transport import ray_broadcast_tensor_dict

        out = ray_broadcast_tensor_dict(None, 0, "cuda", group)
        assert all(v.is_cuda for v in out.values())
        return {k: v.cpu() for k, v in out.items()}


GpuPeer = ray.remote(num_gpus=1)(GpuPeerBase)


@pytest.mark.gpu
def test_nccl_round_trip(ray_cluster):
    """Needs two GPUs (one per actor); run with `pytest -m gpu` on a GPU machine."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    a, b = GpuPeer.remote(), GpuPeer.remote()
    group = new_group()
    ray.get([a.join_cuda.remote(2, 0, group), b.join_cuda.remote(2, 1, group)])
    tensors = {k: v for k, v in sample_dict().items() if isinstance(v, torch.Tensor)}
    _, got = ray.get([a.push_cuda.remote(group, tensors), b.pull_cuda.remote(group)])
    assert_bitwise_equal(got, tensors)


@pytest.mark.gpu
def test_nccl_group_on_one_gpu(ray_cluster):
    """One GPU: an NCCL weight group of one rank is created (private store, timeout options) and runs a whole push
    (header, schema, packed and direct transfers) on the CUDA wire. What it cannot show, a second rank receiving,
    is test_nccl_round_trip's (two GPUs)."""
    a = GpuPeer.remote()
    group = new_group()
    ray.get(a.join_cuda.remote(1, 0, group))
    assert ray.get(a.group_device.remote(group)).startswith("cuda")
    tensors = {k: v for k, v in sample_dict().items() if isinstance(v, torch.Tensor)}
    assert ray.get([a.push_cuda.remote(group, tensors, 4), a.push_cuda.remote(group, tensors, 5)]) == [4, 5]
    ray.kill(a)
