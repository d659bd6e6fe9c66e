"""vLLM's compiler adaptor for torch_tpu: each piece of vLLM's split graphs
becomes one XLA program per token-count bucket, through the same backend as
torch.compile(backend="tpu")."""

import torch
from vllm.compilation.compiler_interface import CompilerInterface


class TpuCompiler(CompilerInterface):
    name = "tpu"

    def compile(self, graph, example_inputs, compiler_config, compile_range=None, key=None):
        # vLLM calls pieces under torch._dynamo.disable, so a torch.compile here
        # would run eagerly: our backend is called directly, once per shape.
        backend = torch._dynamo.lookup_backend("tpu")
        compiled = {}

        def run(*args):
            signature = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
            fn = compiled.get(signature)
            if fn is None:
                fn = compiled[signature] = backend(graph, list(args))
            return fn(*args)

        return run, None
