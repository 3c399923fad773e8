"""HybridAdam's CPU update on a machine without CUDA: ColossalAI's portable CPU-Adam kernel (its aarch64 kernel, which
off aarch64 runs a scalar loop; built once, ~30 s) against the update coati's shim gives it (torch's fused CPU Adam
kernel, same formula), side by side in one run, on fp32 parameters the size of SmolLM2-135M's.

    python benchmarks/bench_cpu_adam.py [--params 134515008] [--threads 1 2]

Prints seconds per optimizer step (median of 5 after one warm-up) and the memory traffic it implies (an update reads
parameter, gradient and both moments and writes three of them: 28 bytes per parameter); writes
``benchmarks/results/cpu_adam.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result


def portable_kernel():
    from colossalai.kernel.extensions.pybind.cpu_adam.cpu_adam_arm import CpuAdamArmExtension

    class Portable(CpuAdamArmExtension):
        def is_available(self) -> bool:
            return True

        def assert_compatible(self) -> None:
            pass

    return Portable


def seconds_per_step(kernel, numel: int, threads: int) -> float:
    from colossalai.kernel.kernel_loader import CPUAdamLoader
    from colossalai.nn.optimizer import HybridAdam

    torch.set_num_threads(threads)
    CPUAdamLoader.REGISTRY = [kernel]
    params = [torch.nn.Parameter(torch.randn(numel // 30)) for _ in range(30)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = HybridAdam(params, lr=1e-5, weight_decay=0.01)
    opt.step()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=134_515_008, help="parameters (default: SmolLM2-135M's)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    from coati.distributed.trainer.colossal_cpu import _TorchFusedCpuAdamKernel, apply_cpu_shims

    if not apply_cpu_shims():
        raise SystemExit("CUDA is present: HybridAdam uses ColossalAI's own kernels and the shim is not applied")
    print(f"HybridAdam step on {args.params / 1e6:.1f}M fp32 parameters, seconds (GB/s of update traffic)")
    print(f"{'threads':>7} {'portable kernel':>18} {'torch fused (coati)':>20} {'speed-up':>9}")
    rows = []
    for threads in args.threads:
        old = seconds_per_step(portable_kernel(), args.params, threads)
        new = seconds_per_step(_TorchFusedCpuAdamKernel, args.params, threads)
        gbs = [28 * args.params / s / 1e9 for s in (old, new)]
        print(
            f"{threads:>7} {old:>10.3f} ({gbs[0]:>4.0f}) {new:>12.3f} ({gbs[1]:>4.0f}) {old / new:>8.2f}x", flush=True
        )
        rows.append({"threads": threads, "portable_s": old, "torch_fused_s": new, "speedup": old / new})
    print(f"wrote {write_result('cpu_adam', {'params': args.params, 'steps': rows})}")


if __name__ == "__main__":
    main()
