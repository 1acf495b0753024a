"""cutlassfa inside other frameworks. Each submodule imports its framework, so none is imported here.

- `cutlassfa.integrations.torch`: the `torch.ops.cutlassfa.forward`, `forward_append` and `varlen_forward`
  operators (torch.compile, FakeTensor shapes, a clear autograd error) and the routing `cutlassfa.forward`
  and `varlen_forward` use for torch tensors.
- `cutlassfa.integrations.jax`: `cutlassfa.forward` for JAX arrays and tracers (jax.jit, jax.vmap): an
  XLA FFI custom call on GPU, a host callback on CPU.
- `cutlassfa.integrations.transformers`: `register()` adds the ``"cutlassfa"`` attention implementation
  to Hugging Face transformers.
"""
