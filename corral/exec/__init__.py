"""Executors: how the manager runs attempts.

corral.exec.local  LocalExecutor: attempts as local processes, each supervised by a shim
corral.exec.shim   the per-attempt supervisor (`python -m corral.exec.shim ATTEMPT_DIR`)
corral.exec.gpus   this machine's GPUs (NVML, or declared with `corral up --gpus N`)

Nothing is imported here, so that starting a shim loads only what it needs.
"""
