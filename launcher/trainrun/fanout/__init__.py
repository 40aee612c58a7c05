"""Fan-out engines: how the launcher reaches hosts and starts one agent on each (base.py declares the
seam: FanoutEngine, AgentLink, ModuleChannel). ssh_engine.py is the SSH engine (paramiko; ssh.py: config,
host keys, the one shell string), srun_engine.py the Slurm one (a job step per host), pipe_engine.py agents
as local subprocesses (tests); select.py decides where the hosts come from and which engine reaches them;
agents.py is the launcher's side of an agent (AgentRanks, a RankGroup), elastic_agents.py keeps agents
between the attempts of an elastic job. A new engine is one new module implementing FanoutEngine."""
