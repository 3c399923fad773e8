"""The teacher role of on-policy distillation: a model that scores the tokens the student sampled.

A teacher is a model server like the reward-model servers (the same placement, threads, start-up marks and
progress-bounded waits): producers send it each completion with the teacher's own rendering of its prompt and get
back the teacher's log-prob of every sampled token. Read in order: ``config`` (its section of the run's tree),
``server`` (the Ray actor). The producers' side is ``rollout/teaching.py``, the loss ``algo/distill.py``.
"""
