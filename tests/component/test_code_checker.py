"""A HumanEval ``check`` sees what a direct ``check(candidate)`` sees, through two sandboxes and plain data: the
standard types tests compare, a generator's items, exceptions by type, in-place changes to the arguments and calls of
the functions the test passes; while forged types, exceptions and call backs still pass nothing (real sandbox)."""

import pytest

from coati.distributed.reward.code_reward import run_tests

PROMPT = "from collections import Counter, OrderedDict, deque\n\n\nclass InvalidInput(Exception):\n    pass\n"


def check(test: str, solution: str, entry: str = "f") -> dict:
    return run_tests(solution, {"test": test, "entry_point": entry, "prompt": PROMPT})


RIGHT = {
    "counter": (
        "def check(candidate):\n    assert candidate('aab') == Counter({'a': 2, 'b': 1})\n"
        "    assert isinstance(candidate('a'), Counter)\n",
        "def f(s):\n    return Counter(s)\n",
    ),
    "ordered dict and nested containers": (
        "def check(candidate):\n    r = candidate()\n    assert isinstance(r, OrderedDict) and list(r) == ['b', 'a']\n"
        "    assert r['a'] == {1, 2} and r['b'] == (1, [2, {'x': None}])\n",
        "def f():\n    return OrderedDict([('b', (1, [2, {'x': None}])), ('a', {1, 2})])\n",
    ),
    "deque": (
        "def check(candidate):\n    assert candidate() == deque([1, 2])\n",
        "def f():\n    return deque([1, 2])\n",
    ),
    "generator consumed": (
        "def check(candidate):\n    assert list(candidate(3)) == [0, 1, 2]\n    g = candidate(2)\n"
        "    assert next(g) == 0 and next(g) == 1\n",
        "def f(n):\n    for i in range(n):\n        yield i\n",
    ),
    "an endless generator's first items": (
        "def check(candidate):\n    g = candidate()\n    assert [next(g) for _ in range(5)] == [0, 1, 2, 3, 4]\n",
        "def f():\n    i = 0\n    while True:\n        yield i\n        i += 1\n",
    ),
    "an expected exception by type": (
        "def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError as e:\n"
        "        assert e.args == ('negative', -1)\n    else:\n        assert False\n    assert candidate(2) == 2\n",
        "def f(x):\n    if x < 0:\n        raise ValueError('negative', x)\n    return x\n",
    ),
    "the prompt's own exception": (
        "def check(candidate):\n    try:\n        candidate(0)\n    except InvalidInput:\n        return\n"
        "    assert False\n",
        "def f(x):\n    raise InvalidInput('zero')\n",
    ),
    "in-place change to an argument": (
        "def check(candidate):\n    a = [3, 1, 2]\n    assert candidate(a) is None\n    assert a == [1, 2, 3]\n"
        "    d = {}\n    assert candidate(d) is None and d == {}\n",
        "def f(xs):\n    if isinstance(xs, list):\n        xs.sort()\n",
    ),
    "a callback": (
        "def check(candidate):\n    seen = []\n"
        "    assert candidate(lambda x: seen.append(x) or x * 2, [1, 2]) == [2, 4]\n"
        "    assert seen == [1, 2]\n    assert candidate(int, ['3']) == [3]\n",
        "def f(fn, xs):\n    return [fn(x) for x in xs]\n",
    ),
}


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_a_right_solution_passes_as_check_candidate_would(name):
    test, solution = RIGHT[name]
    out = check(test, solution)
    assert out["passed"] == 1, out


WRONG = {
    "a Counter subclass equal to everything": (
        RIGHT["counter"][0],
        "from collections import Counter\nclass C(Counter):\n    def __eq__(self, o):\n        return True\n"
        "def f(s):\n    return C(s)\n",
    ),
    "an exception class merely named ValueError": (
        RIGHT["an expected exception by type"][0],
        "ValueError = type('ValueError', (Exception,), {})\ndef f(x):\n    if x < 0:\n"
        "        raise ValueError('negative', x)\n    return x\n",
    ),
    "a timeout caught as the expected error": (
        "def check(candidate):\n    try:\n        candidate()\n    except Exception:\n        pass\n",
        "def f():\n    while True:\n        pass\n",
    ),
    "a forged call back": (  # the runner's own reply function, found up the stack, sends a call back to nothing
        RIGHT["a callback"][0],
        "import sys\ndef f(fn, xs):\n    fr = sys._getframe()\n    while 'reply' not in fr.f_locals:\n"
        "        fr = fr.f_back\n"
        "    fr.f_locals['reply']({'op': 'callback', 'id': 99, 'args': [], 'kwargs': {'dict': []}})\n"
        "    return [fn(x) for x in xs]\n",
    ),
    "a forged result of another type": (  # a reply naming a type the parent does not rebuild
        RIGHT["counter"][0],
        "import sys\ndef f(s):\n    fr = sys._getframe()\n    while 'reply' not in fr.f_locals:\n"
        "        fr = fr.f_back\n    fr.f_locals['reply']({'ok': True, 'value': {'Counter': 'x'}})\n    return {}\n",
    ),
    "an in-place change not made": (RIGHT["in-place change to an argument"][0], "def f(xs):\n    sorted(xs)\n"),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_or_forging_solution_passes_nothing(name):
    test, solution = WRONG[name]
    assert check(test, solution)["passed"] == 0
