import numpy as np, jax, jax.numpy as jnp, cutlassfa, traceback
x = jnp.asarray(np.zeros(4, np.float32))
print(x.devices(), x.shape, x.dtype)
for shape in ((4,), (4, 1), (8,)):
    y = jnp.asarray(np.zeros(shape, np.float32))
    try:
        cap = y.__dlpack__()
        print(shape, "dlpack ok", type(cap))
    except Exception as e:
        print(shape, "dlpack err", e)
q = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4, 5, 16)).astype(np.float32))
k = jnp.asarray(np.random.default_rng(1).standard_normal((2, 2, 7, 16)).astype(np.float32))
for s in (jnp.asarray(np.zeros(4, np.float32)), jnp.zeros(4, jnp.float32), jnp.asarray(np.zeros(4, np.float32)) + 0):
    try:
        cutlassfa.forward(q, k, k, sinks=s)
        print("ok")
    except Exception as e:
        print("ERR", e)
try:
    cutlassfa.forward(q, k, k, window=(2, 2))
    print("window ok")
except Exception as e:
    print("window ERR", e)
