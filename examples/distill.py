"""On-policy distillation: the student samples, a teacher scores each sampled token, and the per-token reverse KL
is the advantage (``--algo OPD``). Two teachers:

    python examples/distill.py --teacher /path/to/teacher [rl_example flags...]   # a model of the student's family
    python examples/distill.py [rl_example flags...]                              # the policy itself, 4 steps back

With ``--teacher`` the teacher is any causal-LM folder with the student's tokenizer (a larger model of its family, or
a model this framework trained: ``make run``'s ``final/``). Without it the teacher is the policy as it was at the last
multiple of 4 steps, shown the row's reference answer, which the student does not see: self-distillation with
privileged context, no second model. ``--with-reward C`` keeps the verifiable reward's GRPO advantage and adds the
teacher's term with coefficient C instead. Per step: ``teacher/kl`` (nats per token) and ``teacher/top1_match``.
"""

import argparse

import rl_example

ANSWER_HINT = "\n\n(For the grader: the reference answer is {gt_answer}.)"
"""what the self-teacher alone reads after the prompt; the row's gt_answer column fills it"""

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--teacher", help="a teacher model folder (default: the policy itself, refreshed every 4 steps)"
    )
    parser.add_argument("--with-reward", type=float, metavar="C", help="GRPO on the reward plus C x the teacher's term")
    args, rest = parser.parse_known_args()
    teacher = ["--teacher-model", args.teacher] if args.teacher else ["--teacher-model", "self:4"]
    if not args.teacher:
        teacher += ["--teacher-privileged-context", ANSWER_HINT]
    algo = ["--algo", "GRPO", "--distill-coef", str(args.with_reward)] if args.with_reward else ["--algo", "OPD"]
    rl_example.main([*algo, *teacher, "-p", "distill", *rest])
