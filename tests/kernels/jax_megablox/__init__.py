"""JAX's megablox grouped matmul (gmm.py, common.py), vendored as test inputs."""
