import numpy as np, gguf, jax, jax.numpy as jnp, emulate, importlib.util, sys, pathlib
from gguf import GGMLQuantizationType as T
from emulate.importers import gguf as G
spec = importlib.util.spec_from_file_location("gguf_llama", "examples/gguf_llama.py"); mod = importlib.util.module_from_spec(spec); sys.modules["gguf_llama"]=mod; spec.loader.exec_module(mod)
rng = np.random.default_rng(0)
E, N, K = 3, 8, 256
rdn = jax.lax.RaggedDotDimensionNumbers((((1,),(2,)),((),())), [0], [0])
x = rng.normal(size=(6, K)).astype(jnp.bfloat16)
for t in ["Q4_0","Q4_1","Q5_0","Q5_1","Q8_0","MXFP4","IQ4_NL","Q4_K","Q6_K"]:
    w = rng.normal(size=(E*N, K)).astype(np.float32)
    try:
        if t == "Q4_K": raw = mod.quantize_q4_k(w)
        elif t == "Q6_K": raw = mod.quantize_q6_k(w)
        else: raw = gguf.quants.quantize(w, T[t])
    except NotImplementedError:
        print(t, "no quantizer"); continue
    raw = raw.reshape(E, N, -1)
    wr = gguf.GGUFWriter("/tmp/e.gguf", "llama"); wr.add_tensor("e", raw, raw_dtype=T[t]); wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()
    q = G.load_gguf("/tmp/e.gguf")["e"]
    deq = gguf.quants.dequantize(raw, T[t]).astype(np.float64)
    y = np.asarray(emulate.ragged_dot_general(jnp.asarray(x), q, jnp.array([2,0,3]), rdn, target="tpu_v5e", preferred_element_type=jnp.float32))
    xs = np.asarray(x, np.float64)
    ref = np.concatenate([xs[:2] @ deq[0].T, xs[2:5] @ deq[2].T, np.zeros((1,N))])
    print(t, q.shape, np.abs(y-ref).max() / np.abs(ref).max())
