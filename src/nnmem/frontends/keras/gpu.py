"""A Keras step on a CUDA GPU, modelled from its CPU trace: the memory each backend's allocator may use there,
the level that decides an OOM, and what the report must say. Imports no framework.

Each backend runs its GPU memory differently (the rules below are the frameworks' own, cited):

- **torch**: PyTorch's caching allocator, as for a PyTorch model (:mod:`nnmem.cuda`): the reserved level against
  the device's memory less the CUDA context.
- **tensorflow**: one BFC allocator per GPU (``GPU_0_bfc``, ``gpu_process_state.cc``) whose ``memory_limit`` is the
  memory free at start-up less a reserve for the system (``gpu_device.cc``, ``MinSystemMemory``: 225 MiB when
  under 2 GiB is free, else 500 MiB up to compute capability 6.x, 1,050 MiB on 7.x, 1,536 MiB on 8.x, 1,800 MiB
  from 9.0; ``TF_DEVICE_MIN_SYS_MEMORY_IN_MB`` replaces it). Without ``allow_growth`` the first allocation maps
  the whole limit as one region (``bfc_allocator.cc``: ``curr_region_allocation_bytes_ =
  RoundedBytes(total_memory)``), which is what ``nvidia-smi`` shows from then on; ``TF_FORCE_GPU_ALLOW_GROWTH=true``
  grows regions from 2 MiB instead. An OOM is the BFC's bytes in use passing the limit.
- **jax**: XLA's GPU client preallocates 75 % of the device's *total* memory as one BFC region at the first
  operation (``xla/pjrt/gpu/gpu_helpers.cc``, ``CreateBFCAllocator``: ``total_memory * memory_fraction``;
  ``allocator_config.h``: ``fraction = 0.75``, ``preallocate = true``); ``XLA_PYTHON_CLIENT_MEM_FRACTION`` sets the
  fraction, ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` makes the regions grow under the same limit, and
  ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` allocates each buffer with cudaMalloc (no pool, no limit but the device).

A cuDNN convolution's workspace never decides an OOM on TensorFlow: its scratch is allocated with
``retry_on_failure = false`` and an algorithm whose workspace does not fit falls back to one without
(``conv_ops_gpu.h``, ``AllocateScratchOrFallback``), up to ``TF_CUDNN_WORKSPACE_LIMIT_IN_MB`` (4 GiB by default).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

from nnmem.allocators.bfc import BFCAllocator
from nnmem.cuda import CudaTarget, cuda_target

__all__ = ["KerasGpu", "MODELLED", "keras_gpu", "tf_memory_limit", "jax_memory_limit"]

_MiB = 1 << 20

MODELLED = ("GPU figures are modelled from the step traced on this CPU (nnmem's model of the backend's GPU allocator), "
            "not yet validated on a GPU: `python benchmarks/cuda_validate.py --keras` on a GPU machine measures them")

TF_STEP_ENV = "NNMEM_TF_GPU_STEP"
"""``graph``: estimate TensorFlow GPU steps on the graph executor (a model compiled with ``jit_compile=False``)
rather than compiled with XLA, Keras's default on a GPU."""

JAX_MEM_FRACTION = 0.75
"""``xla/pjrt/gpu/allocator_config.h``: ``FixedMemFraction{0.75}``, the share of total memory JAX preallocates."""


def _tf_reserve(available: int, cc_major: int) -> int:
    """``gpu_device.cc``, ``MinSystemMemory`` (optimized build): the bytes TensorFlow leaves to the system."""
    if available < (1 << 31):
        return 225 * _MiB
    if cc_major <= 6:
        return 500 * _MiB
    if cc_major <= 7:
        return 1050 * _MiB
    if cc_major <= 8:
        return 1536 * _MiB
    return 1800 * _MiB


def tf_memory_limit(free_bytes: int, compute_capability: tuple[int, int],
                    env: Mapping[str, str] | None = None) -> int:
    """TensorFlow's default ``memory_limit`` of one GPU whose free memory at start-up is ``free_bytes``.

    ``gpu_device.cc``, ``SingleVirtualDeviceMemoryLimit``: the free memory less :func:`_tf_reserve`'s bytes (kept
    when the reserve is not below the free memory), or less ``TF_DEVICE_MIN_SYS_MEMORY_IN_MB`` when set.

    Example:
        >>> tf_memory_limit(15 * 2**30, (7, 5)) // 2**20  # a T4 with 15 GiB free: 1,050 MiB left to the system
        14310
    """
    env = os.environ if env is None else env
    forced = env.get("TF_DEVICE_MIN_SYS_MEMORY_IN_MB", "").strip()
    if forced.isdigit() and int(forced) * _MiB <= free_bytes:
        return free_bytes - int(forced) * _MiB
    reserve = _tf_reserve(free_bytes, compute_capability[0])
    return free_bytes - reserve if reserve < free_bytes else free_bytes


def jax_memory_limit(total_bytes: int, env: Mapping[str, str] | None = None) -> int:
    """The bytes XLA's GPU client may allocate on a device of ``total_bytes``: ``total × fraction`` (0.75, or
    ``XLA_CLIENT_MEM_FRACTION`` / ``XLA_PYTHON_CLIENT_MEM_FRACTION``).

    Example:
        >>> jax_memory_limit(16 * 2**30) // 2**20
        12288
    """
    env = os.environ if env is None else env
    text = env.get("XLA_CLIENT_MEM_FRACTION") or env.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or ""
    try:
        fraction = float(text) if text.strip() else JAX_MEM_FRACTION
    except ValueError:
        fraction = JAX_MEM_FRACTION
    return int(total_bytes * fraction) if 0 < fraction <= 1 else int(total_bytes * JAX_MEM_FRACTION)


@dataclass(frozen=True, slots=True)
class KerasGpu:
    """The GPU a Keras step is estimated for, seen by its backend.

    Attributes:
        target: the CUDA device (name, compute capability, PyTorch's usable bytes).
        backend: "torch", "jax" or "tensorflow".
        memory_bytes: the device's total memory, in bytes (None for a bare "cuda": unknown).
        context_bytes: the CUDA context and library handles outside the allocator, in bytes.
        growth: the allocator grows regions as needed (TensorFlow's ``allow_growth``, JAX without
            preallocation) rather than mapping its whole limit at start.
        pooled: the backend allocates from a BFC pool (False: JAX's ``platform`` allocator, or TensorFlow's
            ``cuda_malloc_async``: each buffer from the driver).
        xla: on TensorFlow, the step is estimated compiled with XLA, as Keras runs it on a GPU (needs JAX's XLA
            client here to compile its HLO; :data:`TF_STEP_ENV` set to ``graph`` picks the graph executor).
        configured_limit: a memory limit the process set itself, in bytes (TensorFlow's
            ``tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=...)])``),
            which replaces the default one; None: the backend's default.
    """

    target: CudaTarget
    backend: str
    memory_bytes: int | None
    context_bytes: int
    growth: bool
    pooled: bool
    xla: bool = False
    configured_limit: int | None = None

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def level(self) -> str:
        """The level whose peak decides an OOM: PyTorch's reserved bytes, a BFC's bytes in use."""
        return "reserved" if self.backend == "torch" else "allocator"

    @property
    def limit(self) -> int | None:
        """Bytes the backend's allocator may hold on the device (None when the device's memory is unknown)."""
        if self.configured_limit is not None:
            return self.configured_limit
        if self.memory_bytes is None:
            return None
        free = self.memory_bytes - self.context_bytes
        if self.backend == "tensorflow":
            return tf_memory_limit(free, self.target.compute_capability)
        if self.backend == "jax" and self.pooled:
            return jax_memory_limit(self.memory_bytes)
        return free

    def bfc(self) -> BFCAllocator:
        """A fresh BFC allocator as the backend sets it up on this GPU: its memory limit (a bare "cuda", whose
        memory is unknown: one unbounded region) and its growth."""
        return BFCAllocator(self.limit if self.limit is not None else 1 << 50, growth=self.growth)

    def notes(self) -> tuple[str, ...]:
        """What the report says about the device, in the user's own figures."""
        limit = self.limit
        notes = [MODELLED]
        if self.backend == "tensorflow":
            shown = ("" if limit is None else f"; nvidia-smi shows about {_gib(limit + self.context_bytes)} "
                     "used from the first step whatever the model needs")
            why = ("the memory_limit this process set (set_logical_device_configuration)"
                   if self.configured_limit is not None
                   else "the free memory less the reserve gpu_device.cc keeps for the system")
            notes.append("TensorFlow on a GPU: an OOM is the GPU BFC allocator's bytes in use passing its memory "
                         f"limit ({'unknown for a bare cuda device' if limit is None else _gib(limit)}: {why})"
                         + ("; TF_FORCE_GPU_ALLOW_GROWTH=true: regions grow from 2 MiB" if self.growth else shown))
            workspace = ("cuDNN workspaces are left out: they take free memory up to TF_CUDNN_WORKSPACE_LIMIT_IN_MB "
                         "(4 GiB) and an algorithm whose workspace does not fit falls back to one without, so they "
                         "do not cause an OOM")
            if self.xla:
                notes.append("TensorFlow on a GPU: Keras compiles the step with XLA there (jit_compile='auto', where "
                             "every layer supports it); the buffers are XLA's buffer assignment of the step's HLO "
                             "compiled for this CPU, plus the largest cuBLAS workspace a matmul gets; the GPU compiler "
                             f"fuses differently (not modelled); {workspace}; {TF_STEP_ENV}=graph estimates the graph "
                             "executor's step instead (a model compiled with jit_compile=False)")
            else:
                notes.append("TensorFlow on a GPU: the graph executor's step, as a model compiled with "
                             f"jit_compile=False runs ({TF_STEP_ENV}=graph, or no JAX here to compile the XLA step "
                             "Keras runs on a GPU by default); the range covers the executor's orders of the graph as "
                             "traced; Grappler's GPU rewrites (fusions, NCHW transposes around float32 convolutions) "
                             f"are not modelled; {workspace}")
            if not self.pooled:
                notes.append("TF_GPU_ALLOCATOR=cuda_malloc_async: buffers come from CUDA's stream-ordered pool, "
                             "not the BFC allocator the estimate replays; the bytes in use are the same, the "
                             "rounding is not")
        elif self.backend == "jax":
            how = ("XLA_PYTHON_CLIENT_ALLOCATOR=platform: each buffer from cudaMalloc, no pool" if not self.pooled
                   else ("XLA_PYTHON_CLIENT_PREALLOCATE=false: regions grow from 2 MiB" if self.growth
                         else "preallocated at the first JAX operation, so nvidia-smi shows it whatever the model "
                              "needs"))
            notes.append("JAX on a GPU: an OOM is the step's buffers (arguments, outputs, XLA's temporaries) "
                         "passing the client's BFC limit "
                         f"({'unknown for a bare cuda device' if limit is None else _gib(limit)}: "
                         f"{JAX_MEM_FRACTION:.0%} of total memory unless XLA_PYTHON_CLIENT_MEM_FRACTION is set; {how})")
            notes.append("JAX on a GPU: the buffers are XLA's CPU buffer assignment of the same step; the GPU "
                         "compiler fuses differently and adds cuBLAS / cuDNN workspaces to its temporaries "
                         "(up to 4 MiB per matmul, 32 MiB from compute capability 9.0; convolution workspaces "
                         "as the autotuner picks them): not modelled")
        else:
            notes.append("torch on a GPU: the step's tensors replayed through PyTorch's caching allocator (the "
                         "reserved level decides an OOM), cuBLAS workspace included; cuDNN convolution workspaces "
                         "are left out (an algorithm whose workspace does not fit is skipped)")
        return tuple(notes)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"


def keras_gpu(device: str, backend: str, env: Mapping[str, str] | None = None) -> KerasGpu | None:
    """None for "cpu"; else the GPU ``device`` ("cuda", "cuda:N" or a catalog CUDA GPU) as ``backend`` sees it.

    Raises:
        ConfigError: an unknown device name.
        UnsupportedError: a catalog device that is not a CUDA GPU.
    """
    target = cuda_target(device)
    if target is None:
        return None
    env = os.environ if env is None else env
    memory, context = None, 0
    if target.usable_bytes is not None:
        from nnmem.devices import get_device

        found = get_device(target.name)
        memory, context = found.memory_bytes, found.context_bytes
    if backend == "tensorflow":
        growth = env.get("TF_FORCE_GPU_ALLOW_GROWTH", "").strip() == "true"
        pooled = env.get("TF_GPU_ALLOCATOR", "").strip() != "cuda_malloc_async"
        xla = env.get(TF_STEP_ENV, "").strip().lower() != "graph" and importlib.util.find_spec("jax") is not None
        return KerasGpu(target, backend, memory, context, growth, pooled, xla)
    if backend == "jax":
        growth = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").strip() in ("false", "False", "0")
        pooled = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").strip().lower() != "platform"
    else:
        growth, pooled = True, True
    return KerasGpu(target, backend, memory, context, growth, pooled)
