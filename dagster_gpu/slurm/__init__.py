"""Slurm support for dagster-gpu.

Pure modules (no I/O): :mod:`~dagster_gpu.slurm.states` (job states -> WorkerStatus),
:mod:`~dagster_gpu.slurm.ids` (job ids, array task ids, ``--array`` specs),
:mod:`~dagster_gpu.slurm.parse` (squeue / sacct / scontrol / sdiag / sbatch output).
I/O: :mod:`~dagster_gpu.slurm.client` (the only module that runs Slurm commands).
"""
