"""The distributed RL system: producers (rollout + reward) and consumers (training) as Ray actors."""
