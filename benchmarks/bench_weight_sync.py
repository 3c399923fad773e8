"""Weight push throughput between two Ray actors on this machine, measured side by side in one run.

State dict shaped like a 135M-parameter Llama (SmolLM2-135M: 30 layers, hidden 576, 272 tensors, fp32). Methods:
  bucketed     ray_broadcast_tensor_dict (schema cached; tensors of 1 MiB or more sent alone from and into their
               own storage, smaller ones packed into buckets of the given size)
  per-tensor   one collective broadcast per tensor (the reference's way), same group
  raw-flat     one broadcast of a single flat buffer of the same bytes (the practical limit of the link)
  object-store ray.put of the state dict, ray.get on the receiver (torch tensors are pickled)
Every method lands the bytes in the receiver's preallocated copy of the weights, as a producer does.
Prints GB/s (median of --reps) and the ratios the targets are stated in.

    python benchmarks/bench_weight_sync.py [--reps 3] [--layers 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch


def llama_like_state_dict(layers: int = 30, hidden: int = 576, inter: int = 1536, kv: int = 192, vocab: int = 49152):
    sd = {"model.embed_tokens.weight": torch.randn(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = torch.randn(hidden, hidden)
        sd[p + "self_attn.k_proj.weight"] = torch.randn(kv, hidden)
        sd[p + "self_attn.v_proj.weight"] = torch.randn(kv, hidden)
        sd[p + "self_attn.o_proj.weight"] = torch.randn(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = torch.randn(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = torch.randn(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = torch.randn(hidden, inter)
        sd[p + "input_layernorm.weight"] = torch.ones(hidden)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    sd["model.norm.weight"] = torch.ones(hidden)
    return sd


@ray.remote(num_cpus=1)
class Endpoint:
    def __init__(self, rank: int, layers: int):
        torch.set_num_threads(1)
        self.rank = rank
        # The receiver holds its own copy of the weights, as a producer's inference engine does, and every method
        # lands the bytes in it (bucketed: streamed bucket by bucket, then copied into place).
        self.sd = llama_like_state_dict(layers) if rank == 0 else {
            k: torch.zeros_like(v, device="cpu") for k, v in llama_like_state_dict_meta(layers).items()
        }
        numel = sum(t.numel() for t in self.sd.values())
        self.flat = torch.randn(numel) if rank == 0 else torch.empty(numel)

    def join(self, group: str):
        from coati.distributed.comm import init_group

        init_group(2, self.rank, group)
        nbytes = sum(t.numel() * t.element_size() for t in self.sd.values())
        return nbytes, len(self.sd)

    def _barrier(self, group):
        import ray.util.collective as cc

        cc.barrier(group)

    def run(self, method: str, group: str, reps: int, bucket_mb: int = 128):
        import ray.util.collective as cc

        from coati.distributed.comm import ray_broadcast_tensor_dict

        times = []
        for _ in range(reps):
            self._barrier(group)
            start = time.perf_counter()
            if method == "bucketed":
                # As a producer does: large tensors straight into its weights, the bucketed rest copied into place.
                ray_broadcast_tensor_dict(
                    self.sd if self.rank == 0 else None, 0, group_name=group, on_bucket=self._load, into=self.sd,
                    bucket_bytes=bucket_mb << 20,
                )  # fmt: skip
            elif method == "per-tensor":
                for t in self.sd.values():
                    cc.broadcast(t, 0, group)
            elif method == "raw-flat":
                cc.broadcast(self.flat, 0, group)
            times.append(time.perf_counter() - start)
        return times

    def _load(self, bucket):
        for k, v in bucket.items():
            self.sd[k].copy_(v)

    def checksum(self):
        return float(sum(t.double().sum() for t in self.sd.values()))

    def get_object(self, refs):
        start = time.perf_counter()
        sd = ray.get(refs[0])
        assert len(sd) > 0
        return time.perf_counter() - start

    def put_object(self):
        return ray.put(self.sd)


def llama_like_state_dict_meta(layers: int):
    with torch.device("meta"):
        return llama_like_state_dict(layers)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[16, 128], help="bucket sizes to measure (MiB)")
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    src, dst = Endpoint.remote(0, args.layers), Endpoint.remote(1, args.layers)
    group = "bench-weights"
    (nbytes, ntensors), _ = ray.get([src.join.remote(group), dst.join.remote(group)])
    print(f"state dict: {ntensors} tensors, {nbytes / 1e6:.1f} MB fp32; median of {args.reps} reps, 1 sender -> 1 receiver")
    results = {}
    runs = [(f"bucketed-{mb}MiB", "bucketed", mb) for mb in args.bucket_mb]
    for label, method, mb in runs + [("per-tensor", "per-tensor", 0), ("raw-flat", "raw-flat", 0)]:
        ray.get([src.run.remote(method, group, 1, mb), dst.run.remote(method, group, 1, mb)])  # warm-up
        _, recv_times = ray.get(
            [src.run.remote(method, group, args.reps, mb), dst.run.remote(method, group, args.reps, mb)]
        )
        results[label] = statistics.median(recv_times)
        if method == "bucketed":
            sums = ray.get([src.checksum.remote(), dst.checksum.remote()])
            assert sums[0] == sums[1], f"bucketed push corrupted the weights: checksums {sums}"
    obj_times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        ref = ray.get(src.put_object.remote())
        ray.get(dst.get_object.remote([ref]))
        obj_times.append(time.perf_counter() - start)
        del ref
    results["object-store"] = statistics.median(obj_times)
    print(f"{'method':<18}{'seconds':>10}{'GB/s':>8}")
    for method, secs in results.items():
        print(f"{method:<18}{secs:>10.3f}{nbytes / secs / 1e9:>8.2f}")
    for label, _, _ in runs:
        print(f"{label} / raw-flat throughput:   {results['raw-flat'] / results[label]:.2f}x  (target >= 0.8x)")
        print(f"{label} / per-tensor throughput: {results['per-tensor'] / results[label]:.2f}x  (target >= 3x)")
    ray.shutdown()


if __name__ == "__main__":
    main()
