"""Weight push throughput between two Ray actors on this machine, measured side by side in one run.

State dict shaped like a 135M-parameter Llama (SmolLM2-135M: 30 layers, hidden 576, 272 tensors, fp32). Methods:
  bucketed-N      ray_broadcast_tensor_dict, weights in separate tensors on both sides (as a model is loaded): tensors
                  of 1 MiB or more travel alone, from and into their own storage; smaller ones are packed into
                  buckets of N MiB (schema cached)
  bucketed-flat-N the same call with the weights in flat buffers on both sides (``flatten_parameters``, as coati's
                  consumers and transformers producers hold them): runs of tensors back to back in
                  memory travel as one transfer of up to N MiB, received in place
  reference       ColossalChat's scheme: the key/shape/dtype list pickled and broadcast, then one broadcast per tensor
                  into a freshly allocated tensor, then all copied into the weights (as ``load_state_dict`` does)
  per-tensor      one broadcast per tensor straight into the weights (the reference minus its allocations and copy)
  raw-flat        one broadcast of a single flat buffer of the same bytes (the practical limit of the link)
  object-store    ray.put of the state dict, ray.get on the receiver (torch tensors are pickled)
  lora-R          a LoRA push of rank R (adapters on all seven linear layers of every block, fp32): the adapter through
                  ray_broadcast_tensor_dict, then merged by the receiver into its weights from a kept base copy
                  (W = W0 + (alpha / R) B A), as a transformers producer does; timed to the merge's end
Every method lands the bytes in the receiver's preallocated copy of the weights, as a producer does. Each rep runs
every method once, in turn, so a slow spell of the machine hits them all. Prints GB/s (median of --reps) and the
ratios the targets are stated in, then push bytes and time of each LoRA rank beside the full push.

Writes ``benchmarks/results/weight_sync.json``.

    python benchmarks/bench_weight_sync.py [--reps 15] [--layers 30] [--bucket-mb 16 128] [--lora-ranks 8 16 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result
from coati.distributed.transport.wire_layout import flatten_parameters


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


TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_for(sd: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Random A [rank, in] and B [out, rank] for every target weight of ``sd``, under the names a push carries."""
    out = {}
    for name, w in sd.items():
        if any(f".{t}." in name for t in TARGETS):
            module = name[: -len(".weight")]
            out[f"{module}.lora_A.weight"] = torch.randn(rank, w.shape[1]) * 0.01
            out[f"{module}.lora_B.weight"] = torch.randn(w.shape[0], rank) * 0.01
    return out


def flat_copy(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same weights as parameters of a module flattened by coati, under the same names."""
    module = torch.nn.Module()
    for i, t in enumerate(sd.values()):
        module.register_parameter(f"p{i}", torch.nn.Parameter(t.clone(), requires_grad=False))
    flatten_parameters(module)
    return {k: getattr(module, f"p{i}").data for i, k in enumerate(sd)}


@ray.remote(num_cpus=1)
class Endpoint:
    def __init__(self, rank: int, layers: int):
        torch.set_num_threads(1)
        self.rank = rank
        # The receiver holds its own copy of the weights, as a producer's inference engine does, and every method
        # lands the bytes in it (bucketed: streamed bucket by bucket, then copied into place).
        self.sd = (
            llama_like_state_dict(layers)
            if rank == 0
            else {k: torch.zeros_like(v, device="cpu") for k, v in llama_like_state_dict_meta(layers).items()}
        )
        self.flat_sd = flat_copy(self.sd)
        numel = sum(t.numel() for t in self.sd.values())
        self.flat = torch.randn(numel) if rank == 0 else torch.empty(numel)

    def join(self, group: str):
        from coati.distributed.transport import init_group

        init_group(2, self.rank, group)
        nbytes = sum(t.numel() * t.element_size() for t in self.sd.values())
        return nbytes, len(self.sd)

    def set_lora(self, rank: int) -> int:
        """The sender's adapter of ``rank`` (its bytes returned); the receiver keeps a base copy of the targets."""
        self.adapter = adapter_for(self.sd, rank) if self.rank == 0 else None
        if self.rank != 0 and not hasattr(self, "base"):
            self.base = {k: v.clone() for k, v in self.sd.items() if any(f".{t}." in k for t in TARGETS)}
        return sum(t.numel() * t.element_size() for t in (self.adapter or {}).values())

    def _barrier(self, group):
        import ray.util.collective as cc

        cc.barrier(group)

    def run(self, method: str, group: str, bucket_mb: int = 128) -> float:
        """One timed push by ``method``; both endpoints call it together."""
        import ray.util.collective as cc

        from coati.distributed.transport import ray_broadcast_object, ray_broadcast_tensor_dict

        self._barrier(group)
        start = time.perf_counter()
        if method in ("bucketed", "bucketed-flat"):
            # As a producer does: large tensors straight into its weights, the bucketed rest copied into place.
            sd = self.sd if method == "bucketed" else self.flat_sd
            ray_broadcast_tensor_dict(
                sd if self.rank == 0 else None,
                0,
                group_name=group,
                on_bucket=lambda b: self._load(sd, b),
                into=sd,
                bucket_bytes=bucket_mb << 20,
            )
        elif method == "lora":
            from coati.distributed.model.lora import adapter_pairs, merge

            got = ray_broadcast_tensor_dict(self.adapter, 0, group_name=group, bucket_bytes=bucket_mb << 20)
            if self.rank != 0:
                for name, (a, b) in adapter_pairs(dict(got)).items():
                    self.sd[name].copy_(merge(self.base[name], a, b, 2.0))
        elif method == "reference":
            meta = [(k, t.shape, t.dtype) for k, t in self.sd.items()] if self.rank == 0 else None
            meta = ray_broadcast_object(meta, 0, group_name=group)
            received = {}
            for k, shape, dtype in meta:
                t = self.sd[k] if self.rank == 0 else torch.empty(shape, dtype=dtype)
                cc.broadcast(t, 0, group)
                received[k] = t
            if self.rank != 0:
                for k, t in received.items():
                    self.sd[k].copy_(t)
        elif method == "per-tensor":
            for t in self.sd.values():
                cc.broadcast(t, 0, group)
        elif method == "raw-flat":
            cc.broadcast(self.flat, 0, group)
        return time.perf_counter() - start

    @staticmethod
    def _load(sd, bucket):
        for k, v in bucket.items():
            sd[k].copy_(v)

    def clear(self):
        for t in [*self.sd.values(), *self.flat_sd.values()]:
            t.zero_()

    def checksums(self):
        """Per weights copy: one float per tensor, so a tensor landing under another's name is caught."""
        return [[float(t.double().sum()) for t in sd.values()] for sd in (self.sd, self.flat_sd)]

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
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[16, 128], help="bucket sizes to measure (MiB)")
    parser.add_argument("--lora-ranks", type=int, nargs="*", default=[8, 16, 64], help="LoRA ranks to measure")
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    src, dst = Endpoint.remote(0, args.layers), Endpoint.remote(1, args.layers)
    group = "bench-weights"
    (nbytes, ntensors), _ = ray.get([src.join.remote(group), dst.join.remote(group)])
    print(
        f"state dict: {ntensors} tensors, {nbytes / 1e6:.1f} MB fp32; median of {args.reps} reps, 1 sender -> 1 "
        "receiver"
    )
    runs = [(f"{m}-{mb}MiB", m, mb) for m in ("bucketed", "bucketed-flat") for mb in args.bucket_mb]
    baselines = ["reference", "per-tensor", "raw-flat"]
    runs += [(m, m, 0) for m in baselines]
    times: dict[str, list[float]] = {label: [] for label, *_ in runs}
    for rep in range(args.reps + 1):  # the first round warms every method up and checks the bucketed ones
        for label, method, mb in runs:
            check = rep == 0 and method.startswith("bucketed")
            if check:
                ray.get(dst.clear.remote())
            _, secs = ray.get([src.run.remote(method, group, mb), dst.run.remote(method, group, mb)])
            if rep:
                times[label].append(secs)
            if check:
                sent, got = ray.get([src.checksums.remote(), dst.checksums.remote()])
                which = 0 if method == "bucketed" else 1
                assert sent[which] == got[which], f"{label} did not deliver the weights bitwise"
    obj_times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        ref = ray.get(src.put_object.remote())
        ray.get(dst.get_object.remote([ref]))
        obj_times.append(time.perf_counter() - start)
        del ref
    times["object-store"] = obj_times
    results = {label: statistics.median(secs) for label, secs in times.items()}
    print(f"{'method':<22}{'seconds':>10}{'GB/s':>8}")
    for method, secs in results.items():
        print(f"{method:<22}{secs:>10.3f}{nbytes / secs / 1e9:>8.2f}")
    for label, *_ in runs[: -len(baselines)]:
        ratios = "  ".join(f"{results[b] / results[label]:.2f}x {b}" for b in baselines)
        print(f"{label} throughput: {ratios}")
    print("targets: >= 0.8x raw-flat, >= 3x one tensor at a time")
    lora = lora_pushes(src, dst, group, args, nbytes, results[f"bucketed-flat-{max(args.bucket_mb)}MiB"])
    ray.shutdown()
    result = {
        "state_dict": {"tensors": ntensors, "bytes": nbytes},
        "reps": args.reps,
        "median_seconds": results,
        "throughput_ratios": {
            label: {b: results[b] / results[label] for b in baselines} for label, *_ in runs[: -len(baselines)]
        },
        "lora": lora,
    }
    print(f"wrote {write_result('weight_sync', result)}")


def lora_pushes(src, dst, group: str, args, full_bytes: int, full_s: float) -> list[dict]:
    """Push bytes and seconds (to the receiver's merge's end) of an adapter of each rank, beside the full push."""
    out = []
    if not args.lora_ranks:
        return out
    print(f"\n{'push':<22}{'MB':>10}{'seconds':>10}{'vs full':>10}")
    print(f"{'full (bucketed-flat)':<22}{full_bytes / 1e6:>10.1f}{full_s:>10.3f}{1.0:>9.2f}x")
    for r in args.lora_ranks:
        nbytes, _ = ray.get([src.set_lora.remote(r), dst.set_lora.remote(r)])
        secs = []
        for rep in range(args.reps + 1):
            _, t = ray.get([src.run.remote("lora", group, 16), dst.run.remote("lora", group, 16)])
            if rep:
                secs.append(t)
        t = statistics.median(secs)
        print(
            f"{f'lora-{r}':<22}{nbytes / 1e6:>10.1f}{t:>10.3f}{t / full_s:>9.2f}x "
            f" ({full_bytes / nbytes:.0f}x fewer bytes)"
        )
        out.append({"rank": r, "bytes": nbytes, "seconds": t, "over_full": t / full_s})
    return out


if __name__ == "__main__":
    main()
