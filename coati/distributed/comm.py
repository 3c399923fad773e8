"""ColossalChat's import path for the weight broadcast: ``from coati.distributed.comm import
ray_broadcast_tensor_dict`` (same call: tensor dict, src, device, group name). The transport lives in
``transport/``."""

from coati.distributed.transport import ray_broadcast_object, ray_broadcast_tensor_dict

__all__ = ["ray_broadcast_object", "ray_broadcast_tensor_dict"]
