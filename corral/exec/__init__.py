"""Executors: how the manager runs attempts.

corral.exec.local  LocalExecutor: attempts as local processes, each supervised by a shim
corral.exec.ray    RayExecutor: attempts as Ray actors on a Ray cluster's nodes
corral.exec.inert  InertExecutor: attempts that run nothing and end at their time limit
corral.exec.shim   the per-attempt supervisor (`python -m corral.exec.shim ATTEMPT_DIR`)
corral.exec.gpus   this machine's GPUs (NVML, or declared with `corral up --gpus N`)

`corral up --executor NAME` picks one by name from corral.server.executors. Nothing is imported
here, so that starting a shim loads only what it needs.
"""
