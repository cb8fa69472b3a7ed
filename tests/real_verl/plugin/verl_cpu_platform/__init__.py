"""A CPU platform for verl 0.9.1: the real-verl tests' shim (tests/real_verl/README.md).

verl finds it through its own `verl.plugins` entry-point group (verl/__init__.py loads every
entry point at import; scripts/real-verl-env.sh registers this one) and verl's
PlatformRegistry: device "cpu", torch.distributed over gloo, Ray's logical "GPU" resource,
no CUDA IPC (so verl's shared-memory weight transfer runs). No verl file is edited; the
patches below replace one verl function and flip one vLLM-CPU switch, each saying why.
"""

import os
import types
from contextlib import contextmanager

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _mem_get_info(device=None):
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


# torch.cpu lacks the cuda-like RNG / memory API verl calls through get_torch_device()
cpu_mod = types.SimpleNamespace(
    is_available=lambda: True,
    current_device=lambda: 0,
    device_count=lambda: 1,
    set_device=lambda idx: None,
    synchronize=lambda *a, **k: None,
    empty_cache=lambda: None,
    ipc_collect=lambda: None,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=lambda *a, **k: torch.get_rng_state(),
    set_rng_state=lambda s, *a, **k: torch.set_rng_state(s),
    mem_get_info=_mem_get_info,
    memory_allocated=lambda *a, **k: 0,
    max_memory_allocated=lambda *a, **k: 0,
    memory_reserved=lambda *a, **k: 0,
    max_memory_reserved=lambda *a, **k: 0,
    reset_peak_memory_stats=lambda *a, **k: None,
    set_per_process_memory_fraction=lambda *a, **k: None,
    get_device_name=lambda *a, **k: "cpu",
    current_stream=torch.cpu.current_stream,
    stream=torch.cpu.stream,
    Stream=torch.cpu.Stream,
    Event=torch.cpu.Event,
    is_initialized=lambda: True,
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    device_module = cpu_mod

    def is_available(self):
        return True

    def is_platform_available(self, use_smi_check=False):
        return not torch.cuda.is_available()

    def current_device(self):
        # verl uses get_device_id() only as a torch device spec (.to(x), torch.device(x)); an int
        # would mean cuda:<int>, so report the CPU device itself.
        return "cpu"

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    # Ray: keep verl's "GPU" bundles; ray.init(num_gpus=N) provides logical GPUs on a CPU host
    def ray_resource_name(self):
        return "GPU"

    def ray_noset_envvars(self):
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self):
        return False  # -> verl uses its shared-memory weight-transfer path

    def cudart(self):
        return None


os.environ.setdefault("VERL_PLATFORM", "cpu")

# --- PATCH 1 (the only verl function replaced): verl/utils/distributed.py:89 builds
# backend "cpu:gloo,{device}:{backend}" which for device "cpu" is "cpu:gloo,cpu:gloo"
# and torch rejects duplicates (ValueError). Pass "gloo" instead.
import verl.utils.distributed as _vd  # noqa: E402

_orig_init = _vd.initialize_global_process_group_ray


def _init_ray_pg(timeout_second=None, backend=None):
    return _orig_init(timeout_second=timeout_second, backend=backend or "gloo")


_vd.initialize_global_process_group_ray = _init_ray_pg


# --- PATCH 2 (vLLM-CPU, not verl): vllm/model_executor/layers/linear.py:215 ->
# layers/utils.py:dispatch_cpu_unquantized_gemm prepacks every Linear into a oneDNN handle and
# replaces layer.weight with torch.empty(0), so the rollout can never take new weights
# (verl's weight sync fails: "Attempted to load weight ... into parameter (torch.Size([0]))").
# Turning oneDNN off selects vLLM's own fallback (F.linear on the live weight).
# Only acts in processes that already imported vllm (the vLLM server / EngineCore / Worker).
import sys as _sys  # noqa: E402

if "vllm" in _sys.modules:
    try:
        import vllm._custom_ops as _vops

        _vops._supports_onednn = False
    except Exception:  # pragma: no cover
        pass


# --- PATCH 3 (optional, only with VERL_CPU_PATCH_REF=1; needed only for a reference model / KL):
# verl/workers/engine/fsdp/transformer_impl.py:462 hardcodes CPUOffloadPolicy(pin_memory=True) for
# forward-only (ref) FSDP2 engines; pinning needs a CUDA driver. Force pin_memory=False.
if os.environ.get("VERL_CPU_PATCH_REF") == "1":
    import torch.distributed.fsdp as _tfsdp

    class _NoPinCPUOffloadPolicy(_tfsdp.CPUOffloadPolicy):
        def __init__(self, pin_memory=True):
            super().__init__(pin_memory=False)

    _tfsdp.CPUOffloadPolicy = _NoPinCPUOffloadPolicy


# --- PROBE (only with VERL_CPU_PROBE_V1=1; not a shim): times the untimed parts of a V1 step
# (verl/trainer/ppo/v1/trainer_base.py: `prepare_step` -> first dataloader fetch, first
# TransferQueue put, the batch's dispatch to the agent loops; `_balance_batch`), printed as
# `PROBE <function> <seconds>` in the driver's log. How tests/real_verl/README.md found where
# V1's first step spends its untimed seconds.
if os.environ.get("VERL_CPU_PROBE_V1") == "1":
    import threading as _threading
    import time as _time

    def _wrap(cls, name):
        orig = getattr(cls, name)

        def timed(self, *a, **k):
            t = _time.perf_counter()
            try:
                return orig(self, *a, **k)
            finally:
                print(f"PROBE {name} {_time.perf_counter() - t:.3f}", flush=True)

        setattr(cls, name, timed)

    def _patch_when_imported():
        for _ in range(20 * 600):
            mod = _sys.modules.get("verl.trainer.ppo.v1.trainer_base")
            if mod is not None and hasattr(mod, "PPOTrainer"):
                for fn in ("prepare_step", "_next_train_batch", "_submit_batch_to_rollout",
                           "_balance_batch", "_reissue_inflight_prompts", "on_train_begin"):  # fmt: skip
                    _wrap(mod.PPOTrainer, fn)
                return
            _time.sleep(0.05)

    _threading.Thread(target=_patch_when_imported, daemon=True).start()
