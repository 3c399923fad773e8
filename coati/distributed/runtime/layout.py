"""Where each training role runs, as OpenRLHF places its Ray actor groups (``--{actor,critic,ref,reward}_num_nodes``,
``--colocate_actor_ref``, ``--colocate_critic_reward``, ``--colocate_all_models``): ``LayoutConfig`` (the run's
``layout`` section) and ``plan_roles``, which turns it into one slot per process, pure (nodes as ``ray.nodes()``
lists them).

Producers take the lowest-index nodes first, as without a layout. Each role group then takes whole nodes of its own,
in the guide's order (reference, reward, critic, actor); a colocated role shares its partner's nodes, and on GPUs its
partner's devices (process i of each role on the node's GPU i, a placement group per GPU). A layout the cluster cannot
hold is refused in one line naming what is short.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from coati.distributed.runtime.placement import Slot


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


ORDER = ("ref", "reward", "critic", "actor")
"""the order role groups take nodes in (OpenRLHF's multi-node guide lists them so)"""


@dataclass(frozen=True)
class LayoutConfig:
    """Nodes per role (0: the role is placed as without a layout) and which roles share nodes."""

    actor_nodes: int = 0
    """nodes of their own for the policy's consumers (consumer.num_consumer_procs spread evenly over them)"""
    critic_nodes: int = 0
    """nodes of their own for the critic (critic.num_procs spread over them)"""
    ref_nodes: int = 0
    """nodes of their own for the reference servers (ref_procs spread over them)"""
    reward_nodes: int = 0
    """nodes of their own for the reward-model servers (reward.rm.servers spread over them)"""
    ref_procs: int = 0
    """reference log-prob servers of their own (0: each policy consumer holds the reference, as without a layout)"""
    colocate_actor_ref: bool = False
    """the reference servers on the actor's nodes (and GPUs)"""
    colocate_critic_reward: bool = False
    """the reward-model servers on the critic's nodes (and GPUs)"""
    colocate_all_models: bool = False
    """actor, critic, reference and reward model all on the actor's nodes (and GPUs)"""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                require(
                    isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                    f"layout {f.name} must be an integer >= 0, got {value!r}",
                )
        require(
            not (self.colocate_all_models and (self.colocate_actor_ref or self.colocate_critic_reward)),
            "layout colocate_all_models already puts every model with the actor; drop colocate_actor_ref and "
            "colocate_critic_reward",
        )
        require(
            not (self.ref_nodes and not self.ref_procs),
            f"layout ref_nodes={self.ref_nodes} places reference servers, but ref_procs=0 keeps the reference inside "
            "each policy consumer; set ref_procs (e.g. --ref-procs 1)",
        )
        for role, partner, flag in (
            ("ref", "actor", self.colocate_actor_ref),
            ("reward", "critic", self.colocate_critic_reward),
        ):
            require(
                not ((flag or self.colocate_all_models) and getattr(self, f"{role}_nodes")),
                f"layout {role}_nodes={getattr(self, f'{role}_nodes')} with colocation: the {role} role runs on the "
                f"{partner if flag else 'actor'}'s nodes; drop {role}_nodes",
            )
        require(
            not (self.colocate_all_models and self.critic_nodes),
            f"layout critic_nodes={self.critic_nodes} with colocate_all_models: the critic runs on the actor's "
            "nodes; drop critic_nodes",
        )
        require(
            not ((self.colocate_actor_ref or self.colocate_all_models) and not self.actor_nodes),
            "layout colocation puts roles on the actor's nodes: set actor_nodes",
        )
        require(
            not (self.colocate_critic_reward and not self.critic_nodes),
            "layout colocate_critic_reward puts the reward servers on the critic's nodes: set critic_nodes",
        )

    @property
    def active(self) -> bool:
        return self != LayoutConfig()

    def groups(self) -> list[tuple[str, int, tuple[str, ...]]]:
        """(leading role, nodes, roles sharing them) per group of nodes, in the order they are taken."""
        if self.colocate_all_models:
            return [("actor", self.actor_nodes, ("actor", "critic", "ref", "reward"))]
        shared = {
            "actor": ("ref",) if self.colocate_actor_ref else (),
            "critic": ("reward",) if self.colocate_critic_reward else (),
        }
        taken = {r for roles in shared.values() for r in roles}
        out = []
        for role in ORDER:
            nodes = getattr(self, f"{role}_nodes")
            if role not in taken and nodes:
                out.append((role, nodes, (role, *shared.get(role, ()))))
        return out


def plan_roles(
    nodes: list[dict], layout: LayoutConfig, counts: dict[str, int], producers: list[Slot], cpus_per_actor: float
) -> dict[str, list[Slot]]:
    """{role: one slot per process} for the roles ``layout`` places (``counts``: processes per role, 0 for a role
    the run does not have), on the nodes ``producers`` (planned before, lowest first) leave whole."""
    used = {s.node_id for s in producers}
    gpus = any(n["Resources"].get("GPU", 0) for n in nodes)
    # a node with none of what roles run on (a head started with no CPUs, a CPU node in a GPU cluster) holds no role
    kind = "GPU" if gpus else "CPU"
    free = [n for n in nodes if n["NodeID"] not in used and n["Resources"].get(kind, 0) > 0]
    groups = [(lead, k, tuple(r for r in roles if counts.get(r))) for lead, k, roles in layout.groups()]
    groups = [g for g in groups if g[2]]
    need = sum(k for _, k, _ in groups)
    if need > len(free):
        wanted = ", ".join(f"{'+'.join(roles)} {k}" for _, k, roles in groups)
        raise ValueError(
            f"the layout needs {need} whole nodes ({wanted}) beside the producers' {len(used)}; the cluster has "
            f"{len(free)} more alive with {kind}s ({len(nodes)} in all): add nodes or lower the layout's node counts"
        )
    slots: dict[str, list[Slot]] = {}
    share = 0
    for _, k, roles in groups:
        mine, free = free[:k], free[k:]
        per_node = {}
        for role in roles:
            require(
                counts[role] % k == 0,
                f"layout: {counts[role]} {role} processes do not spread evenly over {k} nodes; use a multiple of {k}",
            )
            per_node[role] = counts[role] // k
        width = max(per_node.values())
        for n in mine:
            have = n["Resources"].get("GPU", 0) if gpus else n["Resources"].get("CPU", 0)
            want = width if gpus else sum(per_node.values()) * cpus_per_actor
            require(
                have + 1e-9 >= want,
                f"layout: {'+'.join(roles)} needs {want:g} {'GPUs' if gpus else 'CPUs'} on each of its {k} nodes; "
                f"node {n['NodeID'][:8]} has {have:g}",
            )
        for n in mine:
            for i in range(width):
                sharing = [r for r in roles if i < per_node[r]]
                for role in sharing:
                    if gpus and len(sharing) > 1:
                        slot = Slot(n["NodeID"], n["NodeManagerAddress"], 1 / len(sharing), 0.1, share=share)
                    elif gpus:
                        slot = Slot(n["NodeID"], n["NodeManagerAddress"], 1, 0.1)
                    else:
                        slot = Slot(n["NodeID"], n["NodeManagerAddress"], 0, cpus_per_actor)
                    slots.setdefault(role, []).append(slot)
                share += gpus and len(sharing) > 1
    return slots
