"""Transport between consumers and producers: collective groups (``group.py``) and what is pushed over them
(``push.py``), laid out on the wire by ``wire_layout.py``. Read ``push.py`` first: ``ray_broadcast_tensor_dict``."""

from coati.distributed.transport.group import (
    DEFAULT_TIMEOUT_S,
    CollectiveError,
    TorchGroup,
    forget_group_address,
    group_address,
    init_group,
    register_backends,
)
from coati.distributed.transport.push import VersionedDict, ray_broadcast_object, ray_broadcast_tensor_dict

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CollectiveError",
    "TorchGroup",
    "VersionedDict",
    "forget_group_address",
    "group_address",
    "init_group",
    "ray_broadcast_object",
    "ray_broadcast_tensor_dict",
    "register_backends",
]
