"""ThreadLease: a call's cores raised by a lend for that call only, taken up by the working thread between decoder
layers in the forward and the backward (so a step of one pass uses cores lent mid-pass), taken back by a smaller
lend, and given back at the end; ``cores`` for work outside a call."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from coati.distributed.runtime.threads import ThreadLease, cores


@pytest.fixture(autouse=True)
def _keep_this_process_threads():
    """A lease sets the calling thread's OpenMP count: the tests after these keep the count they had."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Record(torch.autograd.Function):
    """Identity that logs the calling thread's OpenMP thread count in its forward and its backward."""

    @staticmethod
    def forward(ctx, x, log, tag):
        ctx.log, ctx.tag = log, tag
        log.append((tag, "forward", torch.get_num_threads()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append((ctx.tag, "backward", torch.get_num_threads()))
        return grad, None, None


class Block(torch.nn.Module):
    def __init__(self, tag, log):
        super().__init__()
        self.lin, self.tag, self.log = torch.nn.Linear(4, 4), tag, log

    def forward(self, hidden_states):
        return Record.apply(self.lin(hidden_states), self.log, self.tag)


class Stack(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, log, n=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(i, log) for i in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_lend_is_taken_up_at_the_next_layer_forward_and_backward():
    log = []
    model, lease = Stack(log), ThreadLease(1)
    assert lease.follow_layers(model) == 3
    # Lent while the forward is in layer 0: layers 1 and 2 and every backward run on 2 threads.
    model.layers[0].register_forward_hook(lambda *_: lease.lend(2, 7))
    with lease.running(7, 1):
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert log == [
        (0, "forward", 1),
        (1, "forward", 2),
        (2, "forward", 2),
        (2, "backward", 2),
        (1, "backward", 2),
        (0, "backward", 2),
    ]
    assert lease.used == 2 and torch.get_num_threads() == 1  # given back at the call's end


def test_a_lend_during_the_backward_and_one_for_another_call():
    log = []
    model, lease = Stack(log), ThreadLease(1)
    lease.follow_layers(model)
    with lease.running(8, 1):
        out = model(torch.randn(2, 4, requires_grad=True)).sum()
        lease.lend(3, 7)  # another call's: ignored
        lease.apply()
        assert torch.get_num_threads() == 1
        lease.lend(2, 8)  # this call's, after the forward: from the backward of the layer below the last on
        out.backward()
    assert log[3:] == [(2, "backward", 1), (1, "backward", 2), (0, "backward", 2)]
    assert lease.used == 2 and torch.get_num_threads() == 1


def test_a_lend_before_its_call_starts_still_holds_and_never_reaches_a_later_call():
    lease = ThreadLease(1)
    lease.lend(2, 5)
    with lease.running(5, None):
        assert torch.get_num_threads() == 2
    with lease.running(6, None):
        lease.apply()
        assert torch.get_num_threads() == 1 and lease.used == 1
    assert lease.call is None


def test_a_lend_can_take_cores_back_and_the_lease_records_what_the_call_started_with():
    lease = ThreadLease(1)
    with lease.running(7, 1):
        lease.lend(2, 7)
        lease.apply()
        lease.lend(1, 7)  # the next training step starts before the round ends
        lease.apply()
        assert torch.get_num_threads() == 1
    assert (lease.started, lease.used) == (1, 2)


def test_cores_sets_the_calling_threads_count_inside_only():
    torch.set_num_threads(1)
    with cores(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1
    with cores(None):
        assert torch.get_num_threads() == 1
    with pytest.raises(RuntimeError), cores(2):
        raise RuntimeError("the count comes back on an error too")
    assert torch.get_num_threads() == 1


def test_a_transformers_model_has_its_decoder_layers_followed():
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model, lease = LlamaForCausalLM(config), ThreadLease(1)
    assert lease.follow_layers(model) == 3
    model.model.layers[0].register_forward_hook(lambda *_: lease.lend(2, 1))
    seen = []
    model.model.layers[2].mlp.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    with lease.running(1, 1):
        model(torch.randint(0, 64, (2, 5))).logits.sum().backward()
    assert seen == [2] and lease.used == 2 and torch.get_num_threads() == 1
