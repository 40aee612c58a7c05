"""Facts about a host (their types: trainrun/plan/facts.py: HostFacts, Gpu), and how they are gathered on the host itself
(collect.py: the agent's HELLO, `--check`'s fuller set; gpus.py: nvidia-smi and CUDA_VISIBLE_DEVICES).
`python -m trainrun.facts` prints them as JSON on a remote host."""
