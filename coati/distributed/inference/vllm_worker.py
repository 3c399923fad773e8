"""vLLM worker extension (imported by vLLM inside each worker process): joins the consumer's weight group and loads
pushed buckets with the model's own ``load_weights``, so tensor-parallel sharding is vLLM's job, not ours."""

from __future__ import annotations

import torch

from coati.distributed.comm import TorchGroup, ray_broadcast_tensor_dict


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self.model_runner`` and ``self.rank`` come from the worker."""

    def join_weight_group(
        self, address: str, world_size: int, rank_offset: int, group_name: str, backend: str = "nccl"
    ) -> None:
        rank = rank_offset + getattr(self, "rank", 0)
        if not hasattr(self, "_coati_groups"):
            self._coati_groups = {}
        self._coati_groups[group_name] = TorchGroup(world_size, rank, group_name, backend=backend, address=address)

    def receive_weights(self, group_name: str) -> int:
        model = self.model_runner.model
        device = torch.device("cuda", torch.cuda.current_device())
        loaded = ray_broadcast_tensor_dict(
            None, 0, device, group=self._coati_groups[group_name],
            on_bucket=lambda bucket: model.load_weights(bucket.items()),
        )  # fmt: skip
        torch.cuda.synchronize()
        return loaded.version
