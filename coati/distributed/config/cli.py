"""The command line, generated from the config tree (``run_config.Config``): one flag per field, its docstring as the
help and its default from the tree; a YAML or JSON file (``--config``) sets any part of the tree, and flags given on
the command line override it.

Flags are the field names (``--train-batch-size``, ``--max-staleness``), prefixed by their section where a bare name
would be unclear (``--reward-fn``, ``--model-path``, ``--data-train``); the algorithm's fields override the chosen
preset's (``--clip-eps-high 0.28``; their default is the preset's). The short and long flags the reference uses stay
as aliases (``-g``, ``-tbs``, ``-nb``, ``--n-behind``, ``--dataset``, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import types
import typing
from pathlib import Path

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.checks import check_plain_data, field_docs, strict_json
from coati.distributed.config import openrlhf
from coati.distributed.config.tree import SECTIONS, Config, config_from_dict
from coati.distributed.config.trl import SAME, refusal

PREFIXED = {"model", "data", "reward", "critic", "teacher"}
"""sections whose flags carry the section name (their field names alone would be unclear)"""

ALIASES: dict[str, tuple[str, ...]] = {
    "model.path": ("-m", "--model"),
    "data.train": ("-d", "--dataset"),
    "data.eval": ("-ed", "--eval-dataset"),
    "data.train_size": ("--train-size",),
    "data.eval_size": ("--eval-size",),
    "data.system_prompt": ("-s", "--system-prompt"),
    "data.train_split": ("--train-split",),
    "data.eval_split": ("--eval-split",),
    "data.prompt_column": ("--prompt-column",),
    "data.answer_column": ("--answer-column",),
    "data.filter_overlong_prompts": ("--filter-overlong-prompts",),
    "data.raw_prompt": ("--raw-prompt",),
    "model.inference_options": ("--inference-options",),
    "reward.allow_degraded_sandbox": ("--allow-degraded-sandbox",),
    "run.project": ("-p",),
    "run.num_episodes": ("-e",),
    "run.max_staleness": ("-nb", "--n-behind"),
    "run.eval_interval": ("-ei",),
    "run.save_interval": ("-si",),
    "run.save_dir": ("-sd",),
    "consumer.num_consumer_procs": ("-t", "--num-trainers"),
    "consumer.train_batch_size": ("-tbs",),
    "consumer.train_minibatch_size": ("-tMbs",),
    "consumer.train_microbatch_size": ("-tmbs",),
    "consumer.learning_rate": ("-lr",),
    "consumer.plugin.tp_size": ("-tp", "--tensor-parallel-size"),
    "consumer.plugin.pp_size": ("-pp", "--pipeline-parallel-size"),
    "consumer.plugin.zero_stage": ("-zero",),
    "producer.num_producers": ("-i", "--num-inferencer"),
    "producer.num_proc_per_producer": ("-ptp", "--producer-tensor-parallel-size"),
    "producer.num_generations": ("-g",),
    "producer.inference_batch_size": ("-ibs",),
    "producer.inference_microbatch_size": ("-imbs",),
    "producer.backend": ("-b",),
    "generation.temperature": ("-temp",),
    "generation.top_k": ("-topk",),
    "generation.top_p": ("-topp",),
    "generation.max_new_tokens": ("-mnt",),
    "generation.max_prompt_tokens": ("-mpt",),
    "reward.fn": ("-rt", "--reward-type"),
    "reward.env.name": ("--env", "--reward-env"),
    "reward.env.kwargs": ("--env-kwargs",),
    "reward.env.max_turns": ("--env-max-turns",),
    "reward.env.max_tokens": ("--env-max-tokens",),
    "reward.env.step_timeout_s": ("--env-step-timeout-s",),
    "algo": ("-a",),
    "algorithm.beta": ("-kl", "--kl-coeff"),
}


WEIGHTS = "reward_weights"
"""the key of ``--reward-weights``: with several functions after ``--reward-fn`` (TRL's reward_funcs and
reward_weights), a spelling of the reward's components on the command line, not a field of the tree"""


@dataclasses.dataclass(frozen=True)
class Flag:
    key: str
    """dotted path in the tree (``consumer.plugin.tp_size``; ``algorithm.beta`` for a preset override)"""
    names: tuple[str, ...]
    kind: type
    optional: bool
    default: object
    help: str


def flags() -> list[Flag]:
    """Every field of the tree as a flag."""
    out = [
        _flag("algo", Config, "algo", None),
        Flag("config", ("--config",), str, True, None, "a YAML or JSON file of config sections (flags override it)"),
        Flag(
            WEIGHTS,
            ("--reward-weights",),
            float,
            True,
            None,
            "weights of the reward functions given to --reward-fn, in order (default: 1 each); sets the reward's "
            "components, as TRL's reward_weights",
        ),
    ]
    for section, cls in SECTIONS.items():
        out += _section_flags(section, cls, section in PREFIXED)
    docs = field_docs(AlgorithmConfig)
    for f in dataclasses.fields(AlgorithmConfig):
        kind, _ = _kind(f.type)
        out.append(
            Flag(
                f"algorithm.{f.name}",
                _names(f"algorithm.{f.name}", f.name),
                kind,
                True,
                None,
                f"{docs[f.name]} (default: the preset's)",
            )
        )
    return out


def _section_flags(key: str, cls: type, prefixed: bool) -> list[Flag]:
    """A section's flags; a nested section's (``consumer.plugin``, ``reward.rm``) follow its parent's prefix, with
    the sub-section's name added where the parent's flags are prefixed (``--reward-rm-path``)."""
    out = []
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            out += _section_flags(f"{key}.{f.name}", sub, prefixed)
            continue
        prefix = key.replace(".", "-").replace("_", "-") if prefixed else None
        out.append(_flag(f"{key}.{f.name}", cls, f.name, prefix))
    return out


def _flag(key: str, cls, name: str, prefix: str | None) -> Flag:
    f = next(x for x in dataclasses.fields(cls) if x.name == name)
    kind, optional = _kind(f.type)
    factory = f.default_factory
    default = f.default if f.default is not dataclasses.MISSING else factory() if callable(factory) else None
    long = f"--{prefix + '-' if prefix else ''}{name.replace('_', '-')}"
    return Flag(key, _names(key, None, long), kind, optional, default, field_docs(cls)[name])


TRL_ALIASES = {key: f"--{name.replace('_', '-')}" for name, key in SAME.items()}
"""TRL's name of each coati setting that has one (``--max-completion-length``; underscores are accepted too)"""


def _names(key: str, field_name: str | None, long: str | None = None) -> tuple[str, ...]:
    if long is None:
        assert field_name is not None, key
        long = f"--{field_name.replace('_', '-')}"
    aliases = (*ALIASES.get(key, ()), *([TRL_ALIASES[key]] if key in TRL_ALIASES else []))
    return tuple(
        dict.fromkeys(
            [*[a for a in aliases if not a.startswith("--")], long, *[a for a in aliases if a.startswith("--")]]
        )
    )


def _kind(annotation) -> tuple[type, bool]:
    """(the value type a flag parses, whether None is allowed) from a field's annotation."""
    hint = eval(annotation, vars(typing)) if isinstance(annotation, str) else annotation  # our own annotations
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        kind = str if len(rest) > 1 else rest[0]  # str | list: a path or task on the command line
        return _kind(kind)[0], type(None) in args
    if typing.get_origin(hint) is tuple:
        return tuple, False
    return hint, False


def _parse(kind: type, flag: str):
    def parse(text: str):
        if kind is bool:
            lowered = text.lower()
            if lowered in ("true", "1", "yes"):
                return True
            if lowered in ("false", "0", "no"):
                return False
            raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true or false)")
        if kind is dict:
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise argparse.ArgumentTypeError(
                    f"not valid JSON ({e.msg} at character {e.pos}) in {text!r}; write "
                    f"an object, e.g. {flag} '{{\"key\": true}}'"
                ) from None
            if not isinstance(value, dict):
                raise argparse.ArgumentTypeError(
                    f"must be a JSON object ({{...}}), got a {type(value).__name__}: {text!r}"
                )
            return value
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not {'an integer' if kind is int else 'a number'}"
                ) from None
        return text

    return parse


class Parser(argparse.ArgumentParser):
    """argparse without its traps: no abbreviations (``--lr`` is not ``--lr-schedule``), an error in one line (no usage
    block above it), an unknown flag answered with the nearest known ones."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        args, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(self.unknown_message(unknown))
        return args

    def unknown_message(self, unknown: list[str]) -> str:
        flags = [s for a in self._actions for s in a.option_strings]
        parts = []
        for i, token in enumerate(unknown):
            if not token.startswith("-"):
                if i == 0 or not unknown[i - 1].startswith("-"):  # not the value of an unknown flag
                    parts.append(f"{token!r} follows no flag that takes it")
                continue
            trl = refusal(token.split("=")[0])
            if trl:
                parts.append(trl)
                continue
            near = difflib.get_close_matches(token.split("=")[0], flags, n=2, cutoff=0.7)
            parts.append(f"unknown flag {token}" + (f"; did you mean {' or '.join(near)}?" if near else "; see --help"))
        return "; ".join(parts)


def normalize_flags(argv: list[str], flags: set[str]) -> list[str]:
    """``--flag_name`` (TRL's spelling) as ``--flag-name`` where that is a flag."""
    out = []
    for token in argv:
        name, eq, rest = token.partition("=")
        if name.startswith("--") and "_" in name and name.replace("_", "-") in flags:
            token = name.replace("_", "-") + eq + rest
        out.append(token)
    return out


FIRST: dict[str, tuple[str, ...]] = {
    "model and data": (
        "model.path",
        "data.train",
        "data.eval",
        "data.prompt_column",
        "data.answer_column",
        "data.system_prompt",
        "config",
    ),
    "algorithm and reward": ("algo", "reward.fn", WEIGHTS, "reward.kwargs", "reward.env.name"),
    "training": (
        "consumer.learning_rate",
        "consumer.train_batch_size",
        "producer.num_generations",
        "generation.max_new_tokens",
        "generation.temperature",
        "run.max_steps",
        "run.num_episodes",
        "consumer.lora_rank",
    ),
    "hardware and engines": (
        "producer.backend",
        "producer.num_producers",
        "consumer.num_consumer_procs",
        "consumer.plugin.tp_size",
        "consumer.plugin.precision",
    ),
    "the run": (
        "run.save_dir",
        "run.project",
        "run.resume",
        "run.overwrite",
        "run.eval_interval",
        "run.save_interval",
        "run.report_to",
        "run.seed",
        "run.address",
    ),
}
"""the flags ``--help`` shows, by group (``--help-all`` shows every one)"""


def _choices() -> dict[str, tuple[str, ...]]:
    """The names a flag takes, shown as its metavar."""
    from coati.distributed.algo.presets import ALGO_MAP
    from coati.distributed.inference import BACKEND_MAP
    from coati.distributed.loggers import LOGGERS
    from coati.distributed.trainer.schedule import SCHEDULES

    return {
        "algo": tuple(ALGO_MAP),
        "producer.backend": tuple(BACKEND_MAP),
        "run.report_to": (*LOGGERS, "none"),
        "consumer.lr_schedule": tuple(SCHEDULES),
        "consumer.plugin.precision": ("fp32", "bf16", "fp16"),
    }


def build_parser(description: str = "", everything: bool = False) -> argparse.ArgumentParser:
    """The command line: every field of the tree a flag. ``--help`` lists the flags of ``FIRST`` under their names
    with its short alias; ``everything`` (``--help-all``) lists every flag by section with all its names (the
    reference's short and long aliases); names not listed are accepted all the same."""
    parser = Parser(
        description=description if everything else description.split("\n\n")[0],
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=36, width=120),
        argument_default=argparse.SUPPRESS,
        add_help=False,
        usage=None if everything else "%(prog)s [FLAG VALUE ...]",
        epilog=None if everything else "--help-all lists every flag (each field of the config tree), by section.",
    )
    shown = {key for keys in FIRST.values() for key in keys}
    groups: dict[str, argparse._ArgumentGroup] = {}
    if not everything:
        for title in FIRST:
            groups[title] = parser.add_argument_group(title)
    help_group = parser.add_argument_group("help")
    help_group.add_argument("-h", "--help", action="help", help="the flags most runs set, and exit")
    help_group.add_argument("--help-all", action="help", help="every flag, and exit")
    for flag, text in ACTIONS.items():
        help_group.add_argument(flag, dest=f"action.{flag[2:]}", action="store_true", help=text)
    choices = _choices()
    algorithm_defaults = dataclasses.asdict(Config().algo_config)
    group: argparse._ArgumentGroup | argparse.ArgumentParser
    for f in flags():
        if everything:
            section = f.key.split(".")[0] if "." in f.key else "run"
            group = groups.setdefault(section, parser.add_argument_group(section))
        else:
            group = next((groups[t] for t, keys in FIRST.items() if f.key in keys), parser)
        if f.key.startswith("algorithm."):
            preset = algorithm_defaults[f.key.split(".", 1)[1]]
            default = f" (default: the preset's; {Config().algo}'s is {_show(preset)})"
        elif f.key in ("config", WEIGHTS):
            default = ""
        else:
            default = f" (default: {_show(f.default)})"
        help_text = (f.help + default).replace("%", "%%")
        if f.key == "reward.fn":
            help_text = help_text.replace(
                " (default:",
                "; several: each further one a component of the reward, as TRL's list (weights: --reward-weights)"
                " (default:",
            )
        listed = everything or f.key in shown
        if not everything:
            help_text = _first_clause(f.help) + default.replace("%", "%%")
        primary = next(n for n in f.names if n.startswith("--"))
        shorts = [n for n in f.names if not n.startswith("--")]
        longs = [n for n in f.names if n.startswith("--") and n != primary]
        # --help shows a flag with its short alias (-lr, -mnt: what the examples use), --help-all with every alias
        named = (*shorts, primary, *longs) if everything else (*shorts[:1], primary)
        for names, text in (
            (named, help_text if listed else argparse.SUPPRESS),
            (tuple(n for n in f.names if n not in named), argparse.SUPPRESS),
        ):
            if names:
                _add(group if text is not argparse.SUPPRESS else parser, f, names, text, choices.get(f.key))
    return parser


def _first_clause(text: str) -> str:
    """A docstring's lead, for the short help: up to its first semicolon or parenthesis."""
    cut = min((i for i in (text.find("; "), text.find(" (")) if i > 0), default=len(text))
    return text[:cut].replace("%", "%%")


def _add(group, f: Flag, names: tuple[str, ...], help_text: str, choices: tuple[str, ...] | None) -> None:
    metavar = "{" + ",".join(choices) + "}" if choices else None
    if f.key == "reward.fn":
        group.add_argument(*names, dest=f.key, nargs="+", help=help_text, metavar="FN")
    elif f.key == WEIGHTS:
        group.add_argument(*names, dest=f.key, nargs="+", type=_parse(float, names[-1]), help=help_text, metavar="W")
    elif f.kind is bool:
        group.add_argument(*names, dest=f.key, action=argparse.BooleanOptionalAction, help=help_text)
    elif f.kind is tuple:
        group.add_argument(*names, dest=f.key, nargs="*", help=help_text, metavar=metavar or "NAME")
    else:
        kind = _parse(f.kind, names[-1])
        if f.optional:
            kind = _none_or(kind)
        group.add_argument(*names, dest=f.key, type=kind, help=help_text, metavar=metavar or f.kind.__name__.upper())


def _none_or(parse):
    return lambda text: None if text.lower() == "none" else parse(text)


def _show(value) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return repr(value) if isinstance(value, str) else str(value)


MAX_CONFIG_BYTES = 1 << 20
"""the largest config file read (a config tree is a few KiB)"""


def load_file(path: str) -> dict:
    """A config file's tree: YAML (.yaml/.yml) or JSON, at most ``MAX_CONFIG_BYTES``. YAML aliases (``*name``) are
    refused: a few of them nest into a tree of any size (2 KB of them took 15 s and 1.6 GB)."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"config file {path} has {size} bytes, over the {MAX_CONFIG_BYTES} a config file may have")
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"config file {path} cannot be read ({e.strerror or e})") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        class NoAliases(yaml.SafeLoader):
            def compose_node(self, parent, index):
                if self.check_event(yaml.AliasEvent):
                    event = self.peek_event()
                    raise ValueError(
                        f"config file {path}, line {event.start_mark.line + 1}: the YAML alias "
                        f"*{event.anchor} is not read (aliases can nest into a tree of any size); "
                        "write the value out"
                    )
                return super().compose_node(parent, index)

            def construct_mapping(self, node, deep=False):
                keys = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    if key in keys:
                        raise ValueError(
                            f"config file {path}, line {key_node.start_mark.line + 1}: the key {key!r} appears twice "
                            "in one section (the second would replace the first); keep one"
                        )
                    keys.add(key)
                return super().construct_mapping(node, deep)

        try:
            tree = yaml.load(text, Loader=NoAliases)  # a SafeLoader
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or e
            raise ValueError(f"config file {path}: not valid YAML ({problem}{where})") from None
    else:
        try:
            tree = strict_json(text, f"config file {path}")
        except json.JSONDecodeError as e:
            raise ValueError(
                f"config file {path}: not valid JSON ({e.msg}, line {e.lineno}); YAML files end in .yaml"
            ) from None
        check_plain_data(tree, f"config file {path}")
    if not isinstance(tree, dict):
        raise ValueError(f"config file {path} must hold a mapping of config sections, got {type(tree).__name__}")
    return tree


def _reward_functions(given: dict) -> None:
    """``--reward-fn f [g ...]`` with ``--reward-weights``: the first is the run's reward function; with several, or
    with weights, every one is a component with its weight (1 each when none are given)."""
    fns, weights = given.pop("reward.fn", None), given.pop(WEIGHTS, None)
    if fns is None:
        if weights is not None:
            raise ValueError(
                f"--reward-weights {' '.join(map(str, weights))} weighs the functions given to "
                "--reward-fn, but none were given; name them, e.g. --reward-fn math my_rewards:fmt"
            )
        return
    given["reward.fn"] = fns[0]
    if len(fns) == 1 and weights is None:
        return
    weights = [1.0] * len(fns) if weights is None else weights
    if len(weights) != len(fns) or len(set(fns)) != len(fns):
        raise ValueError(
            f"--reward-weights {' '.join(map(str, weights))} must give one weight to each distinct "
            f"function of --reward-fn {' '.join(fns)}"
        )
    if "reward.components" in given:
        raise ValueError(
            "--reward-components and several --reward-fn functions (or --reward-weights) both set the "
            "reward's components; use one"
        )
    given["reward.components"] = dict(zip(fns, weights, strict=True))


ACTIONS = {
    "--print-config": "print the resolved config (the preset written out) as YAML, and exit",
    "--dry-run": "check every input, place the actors, print the plan, and exit without training",
    "--debug": "an error prints its traceback too",
}
"""what the command does instead of (or beside) training: flags of the command, not fields of the tree"""


def parse_config(argv=None, description: str = "") -> Config:
    """The Config of a command line: the tree's defaults, then ``--config`` FILE, then the flags given."""
    return parse_command(argv, description)[0]


def _merged(base: dict, over: dict) -> dict:
    """``over``'s keys set over ``base``'s, section by section."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def parse_command(
    argv=None, description: str = "", prog: str | None = None, base: dict | None = None
) -> tuple[Config, set[str]]:
    """The Config of a command line and the ``ACTIONS`` it asks for (``print-config``, ``dry-run``, ``debug``):
    ``base`` (a resumed run's recorded tree), then the ``--config`` file over it, then the flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(description, everything="--help-all" in argv)
    try:
        # OpenRLHF's flags in coati's, in coati's units
        argv = openrlhf.translate(argv, {s for a in parser._actions for s in a.option_strings})
    except ValueError as e:
        parser.error(str(e))
    if prog:
        parser.prog = prog
    given = vars(parser.parse_args(normalize_flags(argv, {s for a in parser._actions for s in a.option_strings})))
    actions = {key.split(".", 1)[1] for key in list(given) if key.startswith("action.") and given.pop(key)}
    try:
        tree = _merged(base or {}, load_file(given.pop("config")) if "config" in given else {})
        _reward_functions(given)
        for key, value in given.items():
            node = tree
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return config_from_dict(tree), actions
    except (ValueError, KeyError) as e:  # a KeyError names an unknown registered name (algorithm, estimator, loss)
        parser.error(str(e.args[0]) if e.args else repr(e))
