# Vendored as a test input for emulate.pallas.check, unchanged below this header.
# Origin: https://github.com/pytorch/xla/blob/41398bfff334fc8d3b1c00be6ea8cc5411f6d6bf/torch_xla/experimental/pallas_kernels/quantized_matmul_kernel.py
# (last changed in 11590c1c6b7249d72c332a10943d9019256cf005). It is JAX code and imports
# only jax; nothing was stripped. The file carries no notice of its own; pytorch/xla's
# license (BSD-3-Clause, https://github.com/pytorch/xla/blob/41398bfff334fc8d3b1c00be6ea8cc5411f6d6bf/LICENSE)
# is reproduced here:
#
# Copyright (c) 2018 Google Inc.
# All rights reserved.
#
# Redistribution and use in source and binary forms, with or without
# modification, are permitted provided that the following conditions are met:
#
# 1. Redistributions of source code must retain the above copyright
#    notice, this list of conditions and the following disclaimer.
#
# 2. Redistributions in binary form must reproduce the above copyright
#    notice, this list of conditions and the following disclaimer in the
#    documentation and/or other materials provided with the distribution.
#
# 3. Neither the names of Facebook, Deepmind Technologies, NYU, NEC Laboratories America
#    and IDIAP Research Institute nor the names of its contributors may be
#    used to endorse or promote products derived from this software without
#    specific prior written permission.
#
# THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
# AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
# IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE
# ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT OWNER OR CONTRIBUTORS BE
# LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR
# CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF
# SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS
# INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN
# CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE)
# ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE
# POSSIBILITY OF SUCH DAMAGE.
# ruff: noqa
import functools
from typing import cast
import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp


def _quantize_array(
    x: jax.Array,  # [bs_block_size, in_block_size]
    x_abs_max_val: jax.Array,  # [1, bs_block_size]
):
  n_bits = 8
  int_max = 2**(n_bits - 1) - 1
  scale = (x_abs_max_val / int_max).T  # [bs_block_size, 1]
  x_int = jnp.round(x / scale).astype(jnp.int8)
  return x_int, scale.astype(jnp.float32)


def unfold_args(args: tuple[jax.Array | bool, ...], fn_args: tuple[bool, ...],
                fn):
  if len(args) == 0:
    fn(*fn_args)
  else:
    arg = args[0]
    if isinstance(arg, bool):
      unfold_args(args[1:], fn_args + (arg,), fn)
    else:
      assert arg.dtype == jnp.bool and arg.size == 1
      lax.cond(
          arg,
          lambda: unfold_args(args[1:], fn_args + (True,), fn),
          lambda: unfold_args(args[1:], fn_args + (False,), fn),
      )


def matmul_kernel(
    x_ref: jax.Array,  # (batch_block_size, in_block_size)
    w_ref: jax.Array,  # (out_block_size, in_block_size)
    scalar_ref: jax.Array,  # (1, out_block_size)
    x_abs_max_ref: jax.Array,  # (1, batch_block_size)
    out_ref: jax.Array,  # (batch_block_size, out_block_size)
    acc_scratch: jax.Array,  # (batch_block_size, out_block_size)
    x_q_scratch: jax.Array,  # (batch_block_size, in_block_size)
    x_scale_scratch: jax.Array,  # (batch_block_size, 1)
    *,
    quantize_activation: bool,
    save_acc: bool,
    save_x_q: bool,
    batch_block_size: int,
    out_block_size: int,
    in_block_size: int,
):
  bs_idx, out_idx, in_idx = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  n_in = pl.num_programs(2)
  x_ref_dtype = x_ref.dtype
  assert x_ref.shape == (batch_block_size,
                         in_block_size), "x_ref shape is not correct"
  assert w_ref.shape == (out_block_size,
                         in_block_size), "w_ref shape is not correct"
  assert scalar_ref.shape == (1,
                              out_block_size), "scalar_ref shape is not correct"
  assert x_abs_max_ref.shape == (
      1, batch_block_size), "x_max_val shape is not correct"
  assert out_ref.shape == (batch_block_size,
                           out_block_size), "out_ref shape is not correct"

  if save_x_q:
    assert quantize_activation
    assert x_q_scratch is not None
    assert x_scale_scratch is not None
    quant = (out_idx == 0)
  else:
    assert x_q_scratch is None
    assert x_scale_scratch is None
    quant = quantize_activation

  if save_acc:
    assert acc_scratch is not None
    is_first_step = (in_idx == 0)
    is_last_step = (in_idx == (n_in - 1))
  else:
    assert acc_scratch is None
    is_first_step = True
    is_last_step = True

  def matmul_body(quant, is_first_step, is_last_step):
    if quantize_activation:
      if quant:
        x_q_tmp, x_scale_tmp = _quantize_array(x_ref[...], x_abs_max_ref[...])
        if save_x_q:
          x_q_scratch[...] = x_q_tmp
          x_scale_scratch[...] = x_scale_tmp
      else:
        assert save_x_q
        x_q_tmp = x_q_scratch[...]
        if is_last_step:
          x_scale_tmp = x_scale_scratch[...]

      acc = jax.lax.dot_general(
          x_q_tmp,
          w_ref[...],
          (((1,), (1,)), ((), ())),
          preferred_element_type=jnp.int32,
      )
    else:
      acc = jax.lax.dot_general(
          x_ref[...],
          w_ref[...],
          (((1,), (1,)), ((), ())),
      )

    if not is_first_step:
      acc += acc_scratch[...]

    if is_last_step:
      acc *= scalar_ref[...]
      if quantize_activation:
        acc *= x_scale_tmp
      out_ref[...] = acc.astype(x_ref_dtype)
    else:
      assert save_acc
      acc_scratch[...] = acc

  unfold_args((quant, is_first_step, is_last_step), (), matmul_body)


def _next_multiple(x, multiple):
  return ((x + multiple - 1) // multiple) * multiple


def _get_vmem_limit(n_bs, n_out, n_in, batch_block_size, out_block_size,
                    in_block_size, x_bytes, w_bytes, x_q_bytes, scale_bytes,
                    out_bytes, acc_bytes, save_acc, save_x_q):
  # Calculate in/out VMEM size.
  x_size = batch_block_size * in_block_size * x_bytes
  x_abs_max_val_size = batch_block_size * scale_bytes
  w_size = out_block_size * in_block_size * w_bytes
  scalar_size = out_block_size * scale_bytes
  out_size = batch_block_size * out_block_size * out_bytes

  vmem_in_out = x_size + x_abs_max_val_size + w_size + scalar_size + out_size
  vmem_in_out *= 2  # Account for compute and vreg spills.

  # Account for double buffering.
  # Double buffering is used only if there are multiple blocks per in/out.
  vmem_in_out += x_size if (n_bs > 1 or n_in > 1) else 0
  vmem_in_out += x_abs_max_val_size if (n_bs > 1) else 0
  vmem_in_out += w_size if (n_out > 1 or n_in > 1) else 0
  vmem_in_out += scalar_size if (n_out > 1) else 0
  vmem_in_out += out_size if (n_bs > 1 or n_out > 1) else 0

  # Calculate scratch VMEM size.
  acc_size = batch_block_size * out_block_size * acc_bytes
  x_q_scratch_size = batch_block_size * in_block_size * x_q_bytes
  x_scale_scratch_size = batch_block_size * scale_bytes

  vmem_scratch = acc_size if save_acc else 0
  vmem_scratch += x_q_scratch_size + x_scale_scratch_size if save_x_q else 0
  vmem_scratch *= 2  # Account for compute and vreg spills.

  # Add in/out and scratch VMEM size.
  vmem_used = vmem_in_out + vmem_scratch
  # Specify upper limit as 96MB.
  vmem_limit_bytes = min(vmem_used, 96 * 1024 * 1024)

  return vmem_limit_bytes


@functools.partial(
    jax.jit,
    static_argnames=[
        'quantize_activation',
        'batch_block_size',
        'out_block_size',
        'in_block_size',
    ])
def quantized_matmul_int8(
    x: jax.Array,  # [bs, n_input_features]
    w: jax.Array,  # [n_output_features, n_input_features]
    scalar: jax.Array,  # [n_output_features]
    zero_point: jax.Array | None = None,
    quant_block_size: jax.Array | None = None,  # i32[1]
    quantize_activation: bool = False,
    *,
    # All 3 block sizes, if provided, have to be multiples of 128 because they are used as the minormost dimension in the block.
    batch_block_size: int | None = None,
    out_block_size: int | None = None,
    in_block_size: int | None = None,
):
  assert zero_point is None, "Not implemented: zero_point is not supported."
  assert quant_block_size is None, "Not implemented: quant_block_size is not supported."
  assert batch_block_size is not None and out_block_size is not None and in_block_size is not None

  # x_max_val cannot be [bs, 128] where 128 is the minormost dimension of the vreg because it'll be costly to store
  # [bs_block_size, 128] in VMEM ([bs_balock_size, 1:] will be padding).
  # We need the global max values to be computed before the kernel.
  x_abs_max_val = jnp.max(jnp.abs(x), axis=-1, keepdims=False)  # [bs]
  x_abs_max_val = jnp.expand_dims(x_abs_max_val, axis=0)  # [1, bs]
  assert x_abs_max_val.shape == (1, x.shape[0])

  orig_bs, orig_in_features = x.shape
  orig_out_features, _ = w.shape

  padded_bs = _next_multiple(orig_bs, batch_block_size)
  if orig_bs < padded_bs:
    x = jnp.pad(x, ((0, padded_bs - orig_bs), (0, 0)))
    x_abs_max_val = jnp.pad(x_abs_max_val, ((0, 0), (0, padded_bs - orig_bs)))
  padded_out_features = _next_multiple(orig_out_features, out_block_size)
  if orig_out_features < padded_out_features:
    w = jnp.pad(w, ((0, padded_out_features - orig_out_features), (0, 0)))
    scalar = jnp.pad(scalar, (0, padded_out_features - orig_out_features))
  padded_in_features = _next_multiple(orig_in_features, in_block_size)
  if orig_in_features < padded_in_features:
    x = jnp.pad(x, ((0, 0), (0, padded_in_features - orig_in_features)))
    w = jnp.pad(w, ((0, 0), (0, padded_in_features - orig_in_features)))

  if scalar.dtype != jnp.float32:
    scalar = scalar.astype(jnp.float32)
  scalar = jnp.expand_dims(scalar, axis=0)  # [1, n_output_features]

  assert x.shape[1] == w.shape[
      1], f"x.shape[1] ({x.shape[1]}) must be equal to w.shape[1] ({w.shape[1]})"
  assert w.shape[0] == scalar.shape[
      1], f"w.shape[0] ({w.shape[0]}) must be equal to scalar.shape[1] ({scalar.shape[1]})"
  assert x_abs_max_val.shape == (
      1, x.shape[0]
  ), f"x_max_val.shape ({x_abs_max_val.shape}) must be equal to (1, x.shape[0]) ({1, {x.shape[0]}})"
  assert x.shape[
      0] % batch_block_size == 0, f"x.shape[0] ({x.shape[0]}) must be a multiple of block size ({batch_block_size})"
  assert w.shape[
      0] % out_block_size == 0, f"w.shape[0] ({w.shape[0]}) must be a multiple of block size ({out_block_size})"
  assert x.shape[
      1] % in_block_size == 0, f"x.shape[1] ({x.shape[1]}) must be a multiple of block size ({in_block_size})"

  n_bs = padded_bs // batch_block_size
  n_out = padded_out_features // out_block_size
  n_in = padded_in_features // in_block_size

  save_acc = n_in > 1
  # Remove redundant input quantization logic by caching quantized input.
  # For best performance, only enable this behavior when single input block is used per batch.
  save_x_q = quantize_activation and n_in == 1 and n_out > 1

  acc_dtype = jnp.int32 if quantize_activation else jnp.float32

  vmem_limit_bytes = _get_vmem_limit(
      n_bs=n_bs,
      n_out=n_out,
      n_in=n_in,
      batch_block_size=batch_block_size,
      out_block_size=out_block_size,
      in_block_size=in_block_size,
      x_bytes=x.dtype.itemsize,
      w_bytes=w.dtype.itemsize,
      x_q_bytes=jnp.dtype(jnp.int8).itemsize,
      scale_bytes=jnp.dtype(jnp.float32).itemsize,
      out_bytes=x.dtype.itemsize,
      acc_bytes=jnp.dtype(acc_dtype).itemsize,
      save_acc=save_acc,
      save_x_q=save_x_q)

  kernel = pl.pallas_call(
      functools.partial(
          matmul_kernel,
          quantize_activation=quantize_activation,
          save_acc=save_acc,
          save_x_q=save_x_q,
          batch_block_size=batch_block_size,
          out_block_size=out_block_size,
          in_block_size=in_block_size),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=0,
          in_specs=[
              pl.BlockSpec((batch_block_size, in_block_size), lambda b, o, i:
                           (b, i)),
              pl.BlockSpec((out_block_size, in_block_size), lambda b, o, i:
                           (o, i)),
              pl.BlockSpec((1, out_block_size), lambda b, o, i:
                           (0, o)),  # scalar
              pl.BlockSpec((1, batch_block_size), lambda b, o, i:
                           (0, b)),  # x_abs_max_val
          ],
          out_specs=pl.BlockSpec((batch_block_size, out_block_size),
                                 lambda b, o, i: (b, o)),
          scratch_shapes=[
              pltpu.VMEM((batch_block_size,
                          out_block_size), acc_dtype) if save_acc else None,
              pltpu.VMEM((batch_block_size,
                          in_block_size), jnp.int8) if save_x_q else None,
              pltpu.VMEM(
                  (batch_block_size, 1), jnp.float32) if save_x_q else None,
          ],
          grid=(n_bs, n_out, n_in),
      ),
      out_shape=jax.ShapeDtypeStruct((padded_bs, padded_out_features), x.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary", "arbitrary"),
          vmem_limit_bytes=vmem_limit_bytes,
      ),
  )

  kernel_name = f'quantized_matmul_int8_{batch_block_size}_{out_block_size}_{in_block_size}'
  # The named_scope is used for autotune. Different block sizes only impact the
  # pallas_call.
  with jax.named_scope(kernel_name):
    out = kernel(x, w, scalar, x_abs_max_val)

  return out[:orig_bs, :orig_out_features]


# Below are tuned block sizes.

# key:
#    - tpu_version
#    - batch_size
#    - n_output_features
#    - n_input_features
#    - activation_dtype
#    - quantize_activation
# value:
#    - batch_block_size
#    - out_block_size
#    - in_block_size
TUNED_BLOCK_SIZES = {
    (6, 1024, 1280, 8192, 'bfloat16', True): (1024, 256, 8192),
    (6, 1024, 13824, 5120, 'bfloat16', True): (1024, 768, 5120),
    (6, 1024, 1792, 5120, 'bfloat16', True): (1024, 256, 5120),
    (6, 1024, 28672, 4096, 'bfloat16', True): (1024, 2048, 4096),
    (6, 1024, 3584, 18944, 'bfloat16', True): (1024, 3584, 512),
    (6, 1024, 3584, 3584, 'bfloat16', True): (1024, 512, 3584),
    (6, 1024, 37888, 3584, 'bfloat16', True): (1024, 1024, 3584),
    (6, 1024, 4096, 14336, 'bfloat16', True): (1024, 256, 14336),
    (6, 1024, 4096, 4096, 'bfloat16', True): (1024, 512, 4096),
    (6, 1024, 4608, 3584, 'bfloat16', True): (1024, 768, 3584),
    (6, 1024, 5120, 1280, 'bfloat16', True): (1024, 1280, 1280),
    (6, 1024, 5120, 3456, 'bfloat16', True): (1024, 1024, 3456),
    (6, 1024, 5120, 640, 'bfloat16', True): (256, 5120, 640),
    (6, 1024, 5120, 6912, 'bfloat16', True): (1024, 512, 6912),
    (6, 1024, 6144, 4096, 'bfloat16', True): (1024, 768, 4096),
    (6, 1024, 6912, 5120, 'bfloat16', True): (1024, 768, 5120),
    (6, 1024, 7168, 8192, 'bfloat16', True): (1024, 512, 8192),
    (6, 1024, 8192, 1024, 'bfloat16', True): (1024, 4096, 1024),
    (6, 1024, 8192, 3584, 'bfloat16', True): (1024, 1024, 3584),
    (6, 1024, 896, 5120, 'bfloat16', True): (1024, 896, 2560),
    (6, 128, 1280, 8192, 'bfloat16', True): (128, 1280, 2048),
    (6, 128, 13824, 5120, 'bfloat16', True): (128, 512, 5120),
    (6, 128, 1792, 5120, 'bfloat16', True): (128, 1792, 1280),
    (6, 128, 28672, 4096, 'bfloat16', True): (128, 28672, 256),
    (6, 128, 3584, 18944, 'bfloat16', True): (128, 256, 18944),
    (6, 128, 3584, 3584, 'bfloat16', True): (128, 3584, 896),
    (6, 128, 37888, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 128, 4096, 14336, 'bfloat16', True): (128, 4096, 896),
    (6, 128, 4096, 4096, 'bfloat16', True): (128, 512, 4096),
    (6, 128, 4608, 3584, 'bfloat16', True): (128, 768, 3584),
    (6, 128, 5120, 1280, 'bfloat16', True): (128, 1280, 1280),
    (6, 128, 5120, 3456, 'bfloat16', True): (128, 640, 3456),
    (6, 128, 5120, 640, 'bfloat16', True): (128, 2560, 640),
    (6, 128, 5120, 6912, 'bfloat16', True): (128, 2560, 1152),
    (6, 128, 6144, 4096, 'bfloat16', True): (128, 768, 4096),
    (6, 128, 6912, 5120, 'bfloat16', True): (128, 1152, 2560),
    (6, 128, 7168, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 128, 8192, 1024, 'bfloat16', True): (128, 2048, 1024),
    (6, 128, 8192, 3584, 'bfloat16', True): (128, 8192, 512),
    (6, 128, 896, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 16, 1280, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 16, 13824, 5120, 'bfloat16', True): (128, 512, 5120),
    (6, 16, 1792, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 16, 28672, 4096, 'bfloat16', True): (128, 28672, 256),
    (6, 16, 3584, 18944, 'bfloat16', True): (128, 256, 18944),
    (6, 16, 3584, 3584, 'bfloat16', True): (128, 896, 3584),
    (6, 16, 37888, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 16, 4096, 14336, 'bfloat16', True): (128, 4096, 896),
    (6, 16, 4096, 4096, 'bfloat16', True): (128, 512, 4096),
    (6, 16, 4608, 3584, 'bfloat16', True): (128, 768, 3584),
    (6, 16, 5120, 1280, 'bfloat16', True): (128, 1280, 1280),
    (6, 16, 5120, 3456, 'bfloat16', True): (128, 640, 3456),
    (6, 16, 5120, 640, 'bfloat16', True): (128, 2560, 640),
    (6, 16, 5120, 6912, 'bfloat16', True): (128, 1280, 2304),
    (6, 16, 6144, 4096, 'bfloat16', True): (128, 768, 4096),
    (6, 16, 6912, 5120, 'bfloat16', True): (128, 1152, 2560),
    (6, 16, 7168, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 16, 8192, 1024, 'bfloat16', True): (128, 2048, 1024),
    (6, 16, 8192, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 16, 896, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 16384, 13824, 5120, 'bfloat16', True): (2048, 1536, 5120),
    (6, 16384, 1792, 5120, 'bfloat16', True): (1024, 1792, 5120),
    (6, 16384, 3584, 18944, 'bfloat16', True): (256, 3584, 18944),
    (6, 16384, 3584, 3584, 'bfloat16', True): (512, 3584, 3584),
    (6, 16384, 37888, 3584, 'bfloat16', True): (4096, 512, 3584),
    (6, 16384, 4608, 3584, 'bfloat16', True): (512, 4608, 3584),
    (6, 16384, 5120, 1280, 'bfloat16', True): (512, 5120, 1280),
    (6, 16384, 5120, 3456, 'bfloat16', True): (512, 5120, 3456),
    (6, 16384, 5120, 640, 'bfloat16', True): (512, 5120, 640),
    (6, 16384, 5120, 6912, 'bfloat16', True): (512, 5120, 6912),
    (6, 16384, 6912, 5120, 'bfloat16', True): (512, 6912, 5120),
    (6, 16384, 896, 5120, 'bfloat16', True): (1024, 896, 5120),
    (6, 2048, 1280, 8192, 'bfloat16', True): (2048, 256, 8192),
    (6, 2048, 13824, 5120, 'bfloat16', True): (2048, 768, 5120),
    (6, 2048, 1792, 5120, 'bfloat16', True): (2048, 256, 5120),
    (6, 2048, 28672, 4096, 'bfloat16', True): (2048, 1024, 4096),
    (6, 2048, 3584, 18944, 'bfloat16', True): (2048, 3584, 512),
    (6, 2048, 3584, 3584, 'bfloat16', True): (2048, 512, 3584),
    (6, 2048, 37888, 3584, 'bfloat16', True): (2048, 1024, 3584),
    (6, 2048, 4096, 14336, 'bfloat16', True): (2048, 4096, 512),
    (6, 2048, 4096, 4096, 'bfloat16', True): (2048, 512, 4096),
    (6, 2048, 4608, 3584, 'bfloat16', True): (2048, 512, 3584),
    (6, 2048, 5120, 1280, 'bfloat16', True): (256, 5120, 1280),
    (6, 2048, 5120, 3456, 'bfloat16', True): (2048, 512, 3456),
    (6, 2048, 5120, 640, 'bfloat16', True): (256, 5120, 640),
    (6, 2048, 5120, 6912, 'bfloat16', True): (2048, 512, 6912),
    (6, 2048, 6144, 4096, 'bfloat16', True): (2048, 512, 4096),
    (6, 2048, 6912, 5120, 'bfloat16', True): (2048, 768, 5120),
    (6, 2048, 7168, 8192, 'bfloat16', True): (2048, 256, 8192),
    (6, 2048, 8192, 1024, 'bfloat16', True): (256, 8192, 1024),
    (6, 2048, 8192, 3584, 'bfloat16', True): (2048, 512, 3584),
    (6, 2048, 896, 5120, 'bfloat16', True): (1024, 896, 5120),
    (6, 256, 1280, 8192, 'bfloat16', True): (256, 256, 8192),
    (6, 256, 13824, 5120, 'bfloat16', True): (256, 512, 5120),
    (6, 256, 1792, 5120, 'bfloat16', True): (256, 1792, 1280),
    (6, 256, 28672, 4096, 'bfloat16', True): (256, 2048, 4096),
    (6, 256, 3584, 18944, 'bfloat16', True): (256, 256, 18944),
    (6, 256, 3584, 3584, 'bfloat16', True): (256, 896, 3584),
    (6, 256, 37888, 3584, 'bfloat16', True): (256, 4736, 896),
    (6, 256, 4096, 14336, 'bfloat16', True): (256, 4096, 512),
    (6, 256, 4096, 4096, 'bfloat16', True): (256, 512, 4096),
    (6, 256, 4608, 3584, 'bfloat16', True): (256, 768, 3584),
    (6, 256, 5120, 1280, 'bfloat16', True): (256, 2560, 1280),
    (6, 256, 5120, 3456, 'bfloat16', True): (256, 1024, 3456),
    (6, 256, 5120, 640, 'bfloat16', True): (256, 2560, 640),
    (6, 256, 5120, 6912, 'bfloat16', True): (256, 5120, 768),
    (6, 256, 6144, 4096, 'bfloat16', True): (256, 512, 4096),
    (6, 256, 6912, 5120, 'bfloat16', True): (256, 6912, 512),
    (6, 256, 7168, 8192, 'bfloat16', True): (256, 512, 8192),
    (6, 256, 8192, 1024, 'bfloat16', True): (256, 2048, 1024),
    (6, 256, 8192, 3584, 'bfloat16', True): (256, 8192, 512),
    (6, 256, 896, 5120, 'bfloat16', True): (256, 896, 2560),
    (6, 32, 1280, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 32, 13824, 5120, 'bfloat16', True): (128, 512, 5120),
    (6, 32, 1792, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 32, 28672, 4096, 'bfloat16', True): (128, 28672, 256),
    (6, 32, 3584, 18944, 'bfloat16', True): (128, 128, 18944),
    (6, 32, 3584, 3584, 'bfloat16', True): (128, 896, 3584),
    (6, 32, 37888, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 32, 4096, 14336, 'bfloat16', True): (128, 4096, 896),
    (6, 32, 4096, 4096, 'bfloat16', True): (128, 512, 4096),
    (6, 32, 4608, 3584, 'bfloat16', True): (128, 768, 3584),
    (6, 32, 5120, 1280, 'bfloat16', True): (128, 1280, 1280),
    (6, 32, 5120, 3456, 'bfloat16', True): (128, 640, 3456),
    (6, 32, 5120, 640, 'bfloat16', True): (128, 2560, 640),
    (6, 32, 5120, 6912, 'bfloat16', True): (128, 1280, 2304),
    (6, 32, 6144, 4096, 'bfloat16', True): (128, 768, 4096),
    (6, 32, 6912, 5120, 'bfloat16', True): (128, 2304, 1280),
    (6, 32, 7168, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 32, 8192, 1024, 'bfloat16', True): (128, 2048, 1024),
    (6, 32, 8192, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 32, 896, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 4096, 13824, 5120, 'bfloat16', True): (2048, 1536, 5120),
    (6, 4096, 1792, 5120, 'bfloat16', True): (512, 1792, 5120),
    (6, 4096, 3584, 18944, 'bfloat16', True): (2048, 3584, 512),
    (6, 4096, 3584, 3584, 'bfloat16', True): (4096, 256, 3584),
    (6, 4096, 37888, 3584, 'bfloat16', True): (4096, 512, 3584),
    (6, 4096, 4608, 3584, 'bfloat16', True): (4096, 512, 3584),
    (6, 4096, 5120, 1280, 'bfloat16', True): (256, 5120, 1280),
    (6, 4096, 5120, 3456, 'bfloat16', True): (4096, 512, 3456),
    (6, 4096, 5120, 640, 'bfloat16', True): (256, 5120, 640),
    (6, 4096, 5120, 6912, 'bfloat16', True): (256, 5120, 6912),
    (6, 4096, 6912, 5120, 'bfloat16', True): (256, 6912, 5120),
    (6, 4096, 896, 5120, 'bfloat16', True): (256, 896, 5120),
    (6, 512, 1280, 8192, 'bfloat16', True): (512, 256, 8192),
    (6, 512, 13824, 5120, 'bfloat16', True): (512, 13824, 512),
    (6, 512, 1792, 5120, 'bfloat16', True): (512, 1792, 1280),
    (6, 512, 28672, 4096, 'bfloat16', True): (512, 2048, 4096),
    (6, 512, 3584, 18944, 'bfloat16', True): (512, 256, 18944),
    (6, 512, 3584, 3584, 'bfloat16', True): (512, 1792, 3584),
    (6, 512, 37888, 3584, 'bfloat16', True): (512, 18944, 512),
    (6, 512, 4096, 14336, 'bfloat16', True): (512, 256, 14336),
    (6, 512, 4096, 4096, 'bfloat16', True): (512, 1024, 4096),
    (6, 512, 4608, 3584, 'bfloat16', True): (512, 768, 3584),
    (6, 512, 5120, 1280, 'bfloat16', True): (512, 2560, 1280),
    (6, 512, 5120, 3456, 'bfloat16', True): (512, 1280, 3456),
    (6, 512, 5120, 640, 'bfloat16', True): (512, 2560, 640),
    (6, 512, 5120, 6912, 'bfloat16', True): (512, 512, 6912),
    (6, 512, 6144, 4096, 'bfloat16', True): (512, 1024, 4096),
    (6, 512, 6912, 5120, 'bfloat16', True): (512, 768, 5120),
    (6, 512, 7168, 8192, 'bfloat16', True): (512, 512, 8192),
    (6, 512, 8192, 1024, 'bfloat16', True): (512, 4096, 1024),
    (6, 512, 8192, 3584, 'bfloat16', True): (512, 2048, 3584),
    (6, 512, 896, 5120, 'bfloat16', True): (512, 896, 2560),
    (6, 64, 1280, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 64, 13824, 5120, 'bfloat16', True): (128, 512, 5120),
    (6, 64, 1792, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 64, 28672, 4096, 'bfloat16', True): (128, 28672, 256),
    (6, 64, 3584, 18944, 'bfloat16', True): (128, 256, 18944),
    (6, 64, 3584, 3584, 'bfloat16', True): (128, 896, 3584),
    (6, 64, 37888, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 64, 4096, 14336, 'bfloat16', True): (128, 4096, 896),
    (6, 64, 4096, 4096, 'bfloat16', True): (128, 512, 4096),
    (6, 64, 4608, 3584, 'bfloat16', True): (128, 768, 3584),
    (6, 64, 5120, 1280, 'bfloat16', True): (128, 1280, 1280),
    (6, 64, 5120, 3456, 'bfloat16', True): (128, 1024, 3456),
    (6, 64, 5120, 640, 'bfloat16', True): (128, 2560, 640),
    (6, 64, 5120, 6912, 'bfloat16', True): (128, 1280, 2304),
    (6, 64, 6144, 4096, 'bfloat16', True): (128, 768, 4096),
    (6, 64, 6912, 5120, 'bfloat16', True): (128, 2304, 1280),
    (6, 64, 7168, 8192, 'bfloat16', True): (128, 256, 8192),
    (6, 64, 8192, 1024, 'bfloat16', True): (128, 2048, 1024),
    (6, 64, 8192, 3584, 'bfloat16', True): (128, 1024, 3584),
    (6, 64, 896, 5120, 'bfloat16', True): (128, 896, 2560),
    (6, 8192, 13824, 5120, 'bfloat16', True): (2048, 1536, 5120),
    (6, 8192, 1792, 5120, 'bfloat16', True): (512, 1792, 5120),
    (6, 8192, 3584, 18944, 'bfloat16', True): (2048, 3584, 512),
    (6, 8192, 3584, 3584, 'bfloat16', True): (4096, 512, 3584),
    (6, 8192, 37888, 3584, 'bfloat16', True): (4096, 1024, 3584),
    (6, 8192, 4608, 3584, 'bfloat16', True): (4096, 512, 3584),
    (6, 8192, 5120, 1280, 'bfloat16', True): (256, 5120, 1280),
    (6, 8192, 5120, 3456, 'bfloat16', True): (512, 5120, 3456),
    (6, 8192, 5120, 640, 'bfloat16', True): (512, 5120, 640),
    (6, 8192, 5120, 6912, 'bfloat16', True): (512, 5120, 6912),
    (6, 8192, 6912, 5120, 'bfloat16', True): (512, 6912, 5120),
    (6, 8192, 896, 5120, 'bfloat16', True): (512, 896, 5120),
}


def get_tpu_version() -> int:
  """Returns the numeric version of the TPU, or -1 if not on TPU."""
  kind = jax.devices()[0].device_kind
  if 'TPU' not in kind:
    return -1
  if kind.endswith(' lite'):
    kind = kind[:-len(' lite')]
  assert kind[:-1] == 'TPU v', kind
  return int(kind[-1])


def get_tuned_block_sizes(block_table, batch_size, n_output_features,
                          n_input_features, activation_dtype,
                          quantize_activation):
  """
    Retrieve the tuned block sizes for the given parameters.

    Args:
        batch_size (int): The batch size.
        n_output_features (int): The number of output features.
        n_input_features (int): The number of input features.
        activation_dtype (str): The data type of the activation ('bfloat16' or 'float32').
        quantize_activation (bool): Whether to quantize the activation.

    Returns:
        tuple: A tuple containing the batch_block_size, out_block_size, and in_block_size.
  """
  key = (get_tpu_version(), batch_size, n_output_features, n_input_features,
         activation_dtype, quantize_activation)
  return block_table.get(key, (None, None, None))
