"""Slurm as a source of hosts and a way to submit jobs: the parts that need no network.

Owns
    nodelist.py     Slurm's compressed host lists (`h[1-3,7],gpu-[01-04]`, `r[1-2]n[01-02]`) and count lists
                    (`2(x3),1`), expanded to plain lists
    allocation.py   Allocation: what an allocation's environment (salloc, sbatch, srun) says about the job:
                    its id, hosts in order with their slots, CPUs and GPUs; None outside an allocation
    sbatch.py       the batch script and `sbatch` argv for `trainrun --sbatch [SBATCH OPTIONS...] ...`
    submit.py       `--sbatch` itself: split the command line, run `sbatch --parsable [--wait]` with the script

Does not own how agents are fanned out through `srun` (the launcher's Slurm engine) nor the CLI flags.
Stdlib only: importing this package never imports paramiko, numpy, click or anything heavy. Everything but
submit.py is pure (the srun engine runs the argv it is given); submit.py is the one place that runs a Slurm
command (`sbatch`, which with --wait also follows the job).
"""
