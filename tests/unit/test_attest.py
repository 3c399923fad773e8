"""Push fingerprints by hand: what they sample, that they follow the bytes as they travel, the tied weights a push
does not carry, and the comparison's verdicts."""

import torch

from coati.distributed.transport.attest import column, compare, crc, fingerprint, fingerprints, sample


def test_a_matrix_is_sampled_by_one_column_chosen_by_name_and_version_and_a_vector_whole():
    w = torch.arange(12.0).reshape(3, 4)
    j = column("w", 5, 4)
    assert torch.equal(sample("w", w, 5), w[:, j])
    assert {column("w", v, 4) for v in range(40)} == {0, 1, 2, 3}  # successive pushes cover every column
    assert torch.equal(sample("b", torch.arange(3.0), 5), torch.arange(3.0))


def test_fingerprints_follow_the_bytes_in_the_wire_dtype():
    w = torch.randn(8, 16)
    same = fingerprint("w", w.clone(), 1)
    assert fingerprint("w", w, 1) == same and same[1] == [8, 16]
    moved = w.clone()
    moved[:, column("w", 1, 16)] += 1e-6  # a step too small for any tolerance: the bytes differ
    assert fingerprint("w", moved, 1)[0] != same[0]
    assert crc(w.bfloat16()) != crc(w)  # bf16 through its bits
    assert crc(w.bfloat16()) == crc(w.bfloat16().clone())


def test_a_tied_weight_the_push_does_not_carry_is_fingerprinted_from_its_source():
    embed = torch.randn(10, 4)
    sent = fingerprints({"model.embed_tokens.weight": embed}, 3, {"lm_head.weight": "model.embed_tokens.weight"})
    assert sent["lm_head.weight"] == fingerprint("lm_head.weight", embed, 3)
    assert set(sent) == {"model.embed_tokens.weight", "lm_head.weight"}


def test_compare_names_what_differs_and_skips_what_the_engine_cannot_read_back():
    sent = {"a": [1, [2, 3]], "b": [2, [3]], "c": [3, [4, 5]], "d": [4, [2]]}
    held = {"a": [1, [2, 3]], "b": [9, [3]], "c": [3, [5, 4]]}  # c stored transposed, d not reported
    assert compare(sent, held) == (["b"], 2)
