"""Which nodes draw random numbers and the links between them (frontend/fx/rng_order.py); the
compiled graphs keeping eager's draws are in test_partition_siblings.py."""
import torch

from pyfuser.frontend.fx.rng_order import consumes_rng, operands, rng_links

A = torch.ops.aten


def test_random_ops_link_to_the_one_before_and_attention_without_dropout_draws_nothing():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    q = g.call_function(A.sigmoid.default, (x,))
    m = g.call_function(A.multinomial.default, (q, 3))
    sdpa0 = g.call_function(A._scaled_dot_product_flash_attention_for_cpu.default, (x, x, x, 0.0))
    sdpa1 = g.call_function(A._scaled_dot_product_flash_attention_for_cpu.default, (x, x, x),
                            {"dropout_p": 0.1})
    sdpa2 = g.call_function(A._scaled_dot_product_flash_attention_for_cpu.default, (x, x, x))
    d = g.call_function(A.native_dropout.default, (q, 0.5, True))
    r = g.call_function(A.rand_like.default, (m,))
    nodes = list(g.nodes)
    assert [n for n in nodes if consumes_rng(n)] == [m, sdpa1, d, r]
    assert not consumes_rng(sdpa0) and not consumes_rng(sdpa2)      # dropout_p 0 (default)
    links = rng_links(nodes)
    assert links == {sdpa1: m, d: sdpa1, r: d}
    assert operands(d, links) == [q, sdpa1] and operands(m, links) == [q]
    assert operands(r, links) == [m, d]
