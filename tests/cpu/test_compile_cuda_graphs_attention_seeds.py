"""Graphed training calls and memory-efficient attention's dropout seeds
(frontend/fx/cuda_graphs_training.py): the backward inputs that are the seed and offset are
found from the ops' schemas, and a run outside a capture leaves host seeds as they are (the GPU
test copies a replayed forward's device seeds to the host:
tests/gpu/test_compile_cuda_graph_outputs_gpu.py)."""
import torch
import torch.fx as fx

from pyfuser.frontend.fx.cuda_graphs_training import attention_seed_inputs, seeds_for_this_run

aten = torch.ops.aten


def _backward_graph(op, seed_at, offset_at):
    """A graph calling `op` whose seed / offset arguments are placeholders 2 and 4 (the others
    placeholders or constants; the graph is only read, never run)."""
    g = fx.Graph()
    ph = [g.placeholder(f"p{i}") for i in range(6)]
    names = [a.name for a in op._schema.arguments]
    args = []
    for k, name in enumerate(names[:max(seed_at, offset_at) + 1]):
        args.append(ph[2] if k == seed_at else ph[4] if k == offset_at else
                    ph[k % 2] if name in ("grad_out_", "query", "key", "value", "out",
                                          "logsumexp") else None)
    out = g.call_function(op, tuple(args))
    g.output(out)
    return fx.GraphModule(torch.nn.Module(), g)


def test_the_seed_and_offset_inputs_of_either_efficient_attention_backward():
    for op, (s, o) in ((aten._scaled_dot_product_efficient_attention_backward.default, (7, 8)),
                       (aten._efficient_attention_backward.default, (12, 13))):
        assert attention_seed_inputs(_backward_graph(op, s, o)) == (2, 4)
    g = fx.Graph()                                    # no attention: nothing
    x = g.placeholder("x")
    g.output(g.call_function(aten.relu.default, (x,)))
    assert attention_seed_inputs(fx.GraphModule(torch.nn.Module(), g)) == ()


def test_host_seeds_are_left_as_they_are_outside_a_capture():
    args = [torch.ones(2), torch.tensor(5), torch.ones(3), torch.tensor(7)]
    assert seeds_for_this_run(args, (1, 3)) is args
