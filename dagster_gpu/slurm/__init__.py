"""Slurm support for dagster-gpu, and the Slurm backend.

Pure modules (no I/O): :mod:`~dagster_gpu.slurm.states` (job states -> WorkerStatus),
:mod:`~dagster_gpu.slurm.ids` (job ids, array task ids, ``--array`` specs),
:mod:`~dagster_gpu.slurm.parse` (squeue / sacct / scontrol / sdiag / sbatch output),
:mod:`~dagster_gpu.slurm.sacct_bill` (an array task's figures from sacct).
I/O: :mod:`~dagster_gpu.slurm.client` (the only module that runs Slurm commands, but for an array task's own
``scontrol requeue`` after its warning signal: :mod:`~dagster_gpu.slurm.self_requeue`).
The backend gpu_executor builds from its ``slurm:`` section is :mod:`~dagster_gpu.slurm.backend`; its bill is
:mod:`~dagster_gpu.slurm.accounting`'s, and a requeued array task runs :mod:`~dagster_gpu.slurm.requeue` first.
"""
